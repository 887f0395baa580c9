"""Run kvviz as someone else would: an unprivileged user this test creates, with a fresh HOME, a temp directory of
its own, a checkout it cannot write, and a PATH without apt-get and dpkg (CI runs as root; a Space, a container
that is not root, a laptop that is not Debian are each some of that).

guest() yields a Guest; Guest.run / Guest.popen run a command as that user; Guest.written() lists every file the
user owns afterwards outside its HOME's cache and its temp directory (what must be empty). Everything is removed
after: the user, its files, the copy of the checkout; its processes are ended by their ids.

Where the Python that runs the tests lives under a folder the user cannot enter (pyenv under /root, mode 700), the
command runs in a mount namespace of its own where that folder is an empty tmpfs with the interpreter's tree
bound back in: the same interpreter and packages, nothing else of root's home visible.
"""
from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_ON_PATH = ("apt", "apt-get", "apt-cache", "dpkg", "dpkg-deb", "dpkg-query")  # and every apt-* and dpkg-*
PATH_DIRS = ("/usr/local/bin", "/usr/bin", "/bin")
# Where a process may leave files at all (find -xdev from each; /proc and /sys are not files)
SCANNED = ("/", "/tmp", "/var/tmp", "/dev/shm", "/run")


def _blocked(path: Path) -> Path | None:
    """The first folder above `path` that others cannot enter (no o+x), or None."""
    for parent in reversed(path.parents):
        if parent != Path("/") and not os.stat(parent).st_mode & stat.S_IXOTH:
            return parent
    return None


@dataclass
class Guest:
    user: str
    uid: int
    base: Path
    home: Path
    tmp: Path
    checkout: Path
    bin: Path
    mounts: str  # the shell lines that make the interpreter reachable, run as root in the command's namespace

    @property
    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "USER": self.user, "LOGNAME": self.user, "TMPDIR": str(self.tmp),
                "PATH": str(self.bin), "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    def command(self, argv: Sequence[str], cwd: Path | None = None) -> list[str]:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        run = (f"cd {shlex.quote(str(cwd or self.checkout))} && exec runuser -u {self.user} -- env -i {env} "
               + " ".join(shlex.quote(a) for a in argv))
        script = f"set -e\n{self.mounts}\n{run}\n"
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script] if self.mounts else \
            ["sh", "-c", script]

    def run(self, argv: Sequence[str], timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), capture_output=True, text=True, timeout=timeout)

    def popen(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kwargs)

    def processes(self) -> list[int]:
        """The ids of the processes this user runs now."""
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if entry.stat().st_uid == self.uid:
                        pids.append(int(entry.name))
        return pids

    def end_processes(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 10
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.2)

    def written(self) -> list[str]:
        """Every file or folder the user owns outside HOME/.cache and its temp directory."""
        allowed = (self.home / ".cache", self.tmp)
        found: set[str] = set()
        for top in SCANNED:
            if not Path(top).is_dir():
                continue
            out = subprocess.run(["find", top, "-xdev", "-uid", str(self.uid)], capture_output=True, text=True,
                                 timeout=300)
            found.update(line for line in out.stdout.splitlines() if line)
        return sorted(p for p in found if Path(p) != self.home and not any(
            Path(p) == a or Path(p).is_relative_to(a) for a in allowed))


def _path_dir(bin_dir: Path) -> None:
    """A PATH folder: the test's Python first, then every program of PATH_DIRS but apt's and dpkg's."""
    bin_dir.mkdir()
    for name in ("python", "python3"):
        (bin_dir / name).symlink_to(sys.executable)
    for folder in PATH_DIRS:
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(folder):
                name = entry.name
                if (name in NOT_ON_PATH or name.startswith(("apt-", "dpkg-")) or (bin_dir / name).exists()
                        or (bin_dir / name).is_symlink()):
                    continue
                if entry.is_file() and os.access(entry.path, os.X_OK):
                    (bin_dir / name).symlink_to(entry.path)


def _copy_checkout(dest: Path) -> None:
    """The checkout's files (tracked, and new ones git does not ignore), owned by root: readable, not writable."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if not src.is_file():
            continue  # deleted in the work tree, or a submodule
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    for folder, _, files in os.walk(dest):
        os.chmod(folder, 0o755)
        for f in files:
            os.chmod(Path(folder) / f, 0o644)


def _mounts(base: Path) -> str:
    """Shell lines that make sys.executable's tree reachable by others (see the module's docstring), or ""."""
    interpreter = Path(sys.executable).resolve()
    blocked = _blocked(interpreter) or _blocked(Path(sys.prefix).resolve())
    if blocked is None:
        return ""
    first = Path(sys.prefix).resolve().relative_to(blocked).parts[0]
    keep = base / "interpreter"
    keep.mkdir()
    q = shlex.quote
    return "\n".join([f"mount --bind {q(str(blocked))} {q(str(keep))}",
                      f"mount -t tmpfs -o mode=755 kvviz-guest {q(str(blocked))}",
                      f"mkdir -p {q(str(blocked / first))}",
                      f"mount --bind {q(str(keep / first))} {q(str(blocked / first))}"])


@contextlib.contextmanager
def guest(models_from: Path | None = None) -> Iterator[Guest]:
    """The user and its folders (see the module's docstring); `models_from`: the models a kvviz cache holds, linked
    into the user's HOME/.cache/kvviz/models (hard links, owned by root: fetched before, read but not written)."""
    if os.geteuid() != 0:
        pytest.skip("creating a user needs root (CI runs as root)")
    missing = [t for t in ("useradd", "userdel", "runuser", "unshare", "find") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    user = f"kvviz-guest-{os.getpid()}"
    base = Path(tempfile.mkdtemp(prefix="kvviz-guest-"))
    os.chmod(base, 0o755)
    home, tmp, checkout, bin_dir = base / "home", base / "tmp", base / "checkout", base / "bin"
    subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh", "--user-group",
                    user], check=True, capture_output=True)
    try:
        uid, gid = pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid
        for folder in (home, tmp):
            folder.mkdir(mode=0o700)
            os.chown(folder, uid, gid)
        if models_from is not None and models_from.is_dir():
            for folder in (home / ".cache", home / ".cache" / "kvviz"):
                folder.mkdir(mode=0o755)
                os.chown(folder, uid, gid)
            subprocess.run(["cp", "-al", str(models_from), str(home / ".cache" / "kvviz" / "models")], check=True)
        checkout.mkdir()
        _copy_checkout(checkout)
        _path_dir(bin_dir)
        g = Guest(user, uid, base, home, tmp, checkout, bin_dir, _mounts(base))
        probe = g.run(["python", "-c", "import kvviz, sys; print(sys.executable)"], timeout=120)
        if probe.returncode != 0:
            pytest.fail(f"the user cannot run this Python: {probe.stderr.strip()[-500:]}")
        yield g
    finally:
        with contextlib.suppress(KeyError):
            Guest(user, pwd.getpwnam(user).pw_uid, base, home, tmp, checkout, bin_dir, "").end_processes()
        subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
