"""`serve`: start the web app the way a host does, in one command (`python -m kvviz serve --hosted`).

It replaces itself (exec) with `streamlit run app.py` from the checkout's root, so `.streamlit/config.toml` applies
and the process a host supervises is Streamlit's own. The port comes from --port, else $PORT (what Docker hosts,
Render and Cloud Run set), else 8501; the address is 127.0.0.1 unless asked (--address, or Streamlit's own
STREAMLIT_SERVER_ADDRESS, which the Dockerfile sets to 0.0.0.0). --hosted turns on hosted mode (KVVIZ_HOSTED=1):
the caps (kvviz.app.hosted) and the Serving page's URL allow-list (kvviz.serving.policy) are read from the
environment here first, so a bad setting stops the start with one line instead of showing on every page.
--lecture listens on every interface (0.0.0.0) and prints the address a phone on the same network opens (the
machine's network address, as Streamlit's "Network URL"; kvviz.room.network) with its QR code in the terminal.
--dry-run prints what would run (--json: as JSON) and starts nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path

from kvviz.cli.common import CliError, add_command, add_json

APP = Path(__file__).resolve().parents[2] / "app.py"
DEFAULT_PORT = 8501
HOSTED_SESSION_TTL_S = "30"  # a closed tab's session (and its KV cache) freed after 30 s instead of Streamlit's 120


def register(sub: argparse._SubParsersAction) -> None:
    s = add_command(sub, "serve", serve, show_serve, help="start the web app (Streamlit) as a deployment does")
    s.add_argument("--hosted", action="store_true",
                   help="hosted-demo mode: KVVIZ_HOSTED=1, its caps and allow-lists from KVVIZ_* variables")
    s.add_argument("--port", default=None, help=f"port to listen on (default: $PORT, else {DEFAULT_PORT})")
    s.add_argument("--address", default=None,
                   help="address to bind (default: $STREAMLIT_SERVER_ADDRESS, else 127.0.0.1; 0.0.0.0 in a container)")
    s.add_argument("--lecture", action="store_true",
                   help="for a lecture hall: listen on the machine's network (0.0.0.0) and print the address phones "
                        "open, with its QR code")
    s.add_argument("--dry-run", action="store_true", help="print the command and the caps in force; start nothing")
    add_json(s)


def _port(text: str, source: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise CliError(f"{source} {text!r} is not a port number (1 to 65535)")
    return port


def plan(args: argparse.Namespace, environ: dict[str, str]) -> dict:
    """What `serve` runs: the command, the environment it adds, the URL, and the hosted caps in force."""
    from kvviz.app.hosted import load_caps
    from kvviz.serving.policy import allowlist

    if not APP.is_file():
        raise CliError(f"serve runs app.py from a kvviz checkout, and {APP.name} is not beside the package")
    if args.port is not None:
        port = _port(args.port, "--port")
    elif environ.get("PORT"):
        port = _port(environ["PORT"], "$PORT")
    else:
        port = DEFAULT_PORT
    address = args.address or environ.get("STREAMLIT_SERVER_ADDRESS") or ("0.0.0.0" if args.lecture else "127.0.0.1")
    added = {"KVVIZ_HOSTED": "1"} if args.hosted else {}
    env = {**environ, **added}
    caps = load_caps(env)  # an InputError naming a bad KVVIZ_* setting: one line, exit 2
    command = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
               "--server.port", str(port), "--server.address", address, "--browser.gatherUsageStats", "false"]
    if caps is not None:
        command += ["--server.disconnectedSessionTTL",
                    environ.get("STREAMLIT_SERVER_DISCONNECTED_SESSION_TTL", HOSTED_SESSION_TTL_S)]
    return {
        "command": command, "cwd": str(APP.parent), "env": added, "url": f"http://{address}:{port}",
        "lecture": args.lecture, "network_url": _network_url(address, port) if args.lecture else None,
        "hosted": caps is not None, "caps": None if caps is None else asdict(caps),
        "serve_allow": list(allowlist(env, {})) if caps is not None else None,
    }


def _network_url(address: str, port: int) -> str | None:
    """The address a phone on the same network opens, or None where there is none (loopback only, no network)."""
    from kvviz.room.network import ALL_INTERFACES, listens_on_network, network_address

    if not listens_on_network(address):
        return None
    host = network_address() if address in ALL_INTERFACES else address
    if host is None:
        return None
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(args: argparse.Namespace) -> dict:
    result = plan(args, dict(os.environ))
    if args.dry_run:
        return result
    show_serve(result, out=sys.stderr)  # stdout stays Streamlit's
    os.chdir(result["cwd"])  # Streamlit reads .streamlit/config.toml from the working directory
    os.execve(sys.executable, result["command"], {**os.environ, **result["env"]})
    raise AssertionError("unreachable: exec replaced this process")


def show_serve(r: dict, out=None) -> None:  # noqa: ANN001 - a text stream
    out = out or sys.stdout
    kind = "hosted demo" if r["hosted"] else "lecture" if r.get("lecture") else "local"
    print(f"kvviz web app at {r['url']} ({kind})", file=out)
    if r["hosted"]:
        caps = ", ".join(f"{k}={','.join(v) if isinstance(v, (list, tuple)) else v}" for k, v in r["caps"].items())
        print(f"  caps: {caps}", file=out)
        print(f"  Serving page may connect to: {', '.join(r['serve_allow']) or 'nothing (KVVIZ_SERVE_ALLOW unset)'}",
              file=out)
    if r.get("network_url"):
        import segno

        local = r["url"].replace("://0.0.0.0:", "://localhost:")
        print(f"  Lecturer (this machine): {local}/?lecture=1", file=out)
        print(f"  Network URL (phones on the same network): {r['network_url']}", file=out)
        segno.make(r["network_url"], error="m").terminal(out=out, compact=True)
    elif r.get("lecture"):
        print("  no network address found: phones cannot reach this machine (join the room's Wi-Fi first)", file=out)
    print(f"  {' '.join(r['command'])}", file=out)
