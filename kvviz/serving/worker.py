"""The page's measuring process: the same runs `serve-bench` makes, in a process of their own, so nothing the
page draws (Streamlit's script, its charts, the browser beside it) shares a Python interpreter with the clock.

`Worker` starts `python -m kvviz.serving.worker JOB DIR`; the process runs the job (a load run or the prefix
experiment), writes where it is to DIR/state.json as it goes (whole files, replaced atomically) and ends. The
page only reads that file, as a `WorkerState` (the job's kind, its status, what it measured so far, its error),
and `poll()` closes a worker once its state is final. Cancel is SIGTERM: the run stops at the next chunk and
writes what it measured. A worker whose page process is gone cancels itself. The API key reaches the process
in its environment, never in a file.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kvviz.errors import InputError
from kvviz.serving.bench import BenchPlan, Limits, error_dict, error_from
from kvviz.serving.llamacpp import stop_process

ROOT = Path(__file__).resolve().parents[2]  # the kvviz checkout this code runs from
ENV_KEY = "KVVIZ_WORKER_API_KEY"
STATE, JOB = "state.json", "job.json"
FINAL = ("done", "cancelled", "failed")


@dataclass(frozen=True)
class WorkerState:
    """Where one job stands, as its process last wrote it: what the page receives and keeps in its session.

    status: "starting" (no state written yet), "running", then one of FINAL. result: the run's snapshot
    (BenchRun.snapshot(), or PrefixResult.to_dict()) so far, None before the first; error: an InputError as
    error_dict() writes it, None without one."""

    kind: str  # "bench" or "prefix"
    status: str
    result: dict | None = None
    error: dict | None = None

    @classmethod
    def from_dict(cls, d: dict) -> WorkerState:
        return cls(d["kind"], d["status"], d.get("result"), d.get("error"))

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def failure(self) -> InputError | None:
        """The job's own error, else the run's (a load run that stopped on one keeps it in its result)."""
        return error_from(self.error or (self.result or {}).get("error"))


def write_state(directory: Path, state: dict) -> None:
    tmp = directory / f".{STATE}.{os.getpid()}"
    tmp.write_text(json.dumps(state, allow_nan=False, default=str), encoding="utf-8")
    os.replace(tmp, directory / STATE)  # a reader sees the old file or the new one, never half of one


def read_state(directory: Path) -> dict | None:
    try:
        return json.loads((directory / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def run_job(job: dict, directory: Path, cancel: threading.Event, api_key: str | None) -> None:
    """Run one job to its end, keeping DIR/state.json current."""
    from kvviz.serving.report import run_bench, run_prefix

    kind = job["kind"]
    last: dict = {}

    def bench_update(snapshot: dict) -> None:
        last.clear()
        last.update(snapshot)
        write_state(directory, {"kind": kind, "status": "running", "result": snapshot})

    def prefix_update(result) -> None:  # noqa: ANN001 - a PrefixResult
        last.clear()
        last.update(result.to_dict())
        write_state(directory, {"kind": kind, "status": "running", "result": last})

    write_state(directory, {"kind": kind, "status": "running", "result": None})
    try:
        if kind == "bench":
            result = run_bench(BenchPlan.from_dict(job["plan"]), api_key, limits=Limits(**job["limits"]),
                               on_update=bench_update, cancel=cancel)
        else:
            result = run_prefix(job["url"], api_key, model=job["model"], timeout_s=job["timeout_s"],
                                prefix_tokens=job["prefix_tokens"], repeats=job["repeats"],
                                block_size=job.get("block_size"), on_trial=prefix_update, cancel=cancel.is_set)
        status = "cancelled" if cancel.is_set() else "done"
        write_state(directory, {"kind": kind, "status": status, "result": result})
    except InputError as exc:
        write_state(directory, {"kind": kind, "status": "failed", "result": last or None, "error": error_dict(exc)})
    except Exception as exc:  # noqa: BLE001 - the page shows one line, never a traceback
        write_state(directory, {"kind": kind, "status": "failed", "result": last or None,
                                "error": {"key": "serving.worker_failed",
                                          "params": {"detail": f"{type(exc).__name__}: {exc}"[:200]}}})


def main(argv: list[str] | None = None) -> int:
    job_path, out = (argv if argv is not None else sys.argv[1:])[:2]
    directory = Path(out)
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    cancel = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: cancel.set())
    parent = os.getppid()

    def orphan_watch() -> None:
        while not cancel.wait(1.0):
            if os.getppid() != parent:
                cancel.set()  # the page's process is gone: nobody will read the rest

    threading.Thread(target=orphan_watch, daemon=True, name="kvviz-orphan-watch").start()
    run_job(job, directory, cancel, os.environ.get(ENV_KEY) or None)
    return 0


class Worker:
    """The page's handle on one measuring process (kept in its session state)."""

    def __init__(self, job: dict, api_key: str | None = None) -> None:
        self.kind = job["kind"]
        self.dir = Path(tempfile.mkdtemp(prefix="kvviz-serve-"))
        (self.dir / JOB).write_text(json.dumps(job), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k != ENV_KEY}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        if api_key:
            env[ENV_KEY] = api_key
        self._stderr = open(self.dir / "stderr.txt", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([sys.executable, "-m", "kvviz.serving.worker", str(self.dir / JOB),
                                      str(self.dir)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                     stderr=self._stderr)
        self.started = time.time()

    @classmethod
    def bench(cls, plan: BenchPlan, limits: Limits, api_key: str | None = None) -> Worker:
        return cls({"kind": "bench", "plan": plan.to_dict(), "limits": asdict(limits)}, api_key)

    @classmethod
    def prefix(cls, url: str, model: str, *, timeout_s: float, prefix_tokens: int, repeats: int,
               block_size: int | None, api_key: str | None = None) -> Worker:
        return cls({"kind": "prefix", "url": url, "model": model, "timeout_s": timeout_s,
                    "prefix_tokens": prefix_tokens, "repeats": repeats, "block_size": block_size}, api_key)

    def state(self) -> WorkerState:
        """The latest state the process wrote; a process that ended without a final one is reported failed."""
        state = read_state(self.dir) or {"kind": self.kind, "status": "starting", "result": None}
        code = self.proc.poll()
        if code is not None and state.get("status") not in FINAL:
            state = read_state(self.dir) or state  # it may have written its last state just before exiting
            if state.get("status") not in FINAL:
                state = {**state, "status": "failed",
                         "error": {"key": "serving.worker_exited", "params": {"code": code}}}
        return WorkerState.from_dict(state)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def cancel(self) -> None:
        if self.running:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float | None = None) -> WorkerState:
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        return self.state()

    def close(self) -> None:
        """Stop the process if it still runs and delete its files."""
        stop_process(self.proc)
        self._stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def poll(worker: Worker | None, last: WorkerState | None) -> tuple[Worker | None, WorkerState | None]:
    """(the worker, its latest state); once the state is final and the process gone the worker is closed (its files
    removed) and None comes back in its place, with the final state. No worker: (None, the last state kept)."""
    if worker is None:
        return None, last
    state = worker.state()
    if state.final and not worker.running:
        worker.close()
        return None, state
    return worker, state


if __name__ == "__main__":
    sys.exit(main())
