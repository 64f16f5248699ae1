"""Run `python -m sweep` as a user would, in a process of its own, for the end-to-end tests.

Each run is a real process with its own working directory, environment, stdout, stderr, exit status
and children (submitit's, the trials'). By default it is forked from a server process that has
already imported sweep and Hydra (tests/sweep_server.py), and runs sweep's `__main__` there as
`python -m sweep` would: what it skips is only the interpreter's
start and those imports, about 0.35 s of CPU per run, paid ~200 times per suite on 2 cores.
ForkedRun is one such run handled like a subprocess.Popen (poll, wait, signals), for the fault tests
(tests/support/faultlib.py), which run tests/fault_runner.py this way and SIGKILL it mid-sweep.
SWEEP_TESTS_FRESH_PROCESS=1 runs every such case as a fresh `python -m sweep` instead. Tests of
what only a fresh interpreter shows (Ctrl-C during start-up, signals sent to the sweep, import
time, installs) start `python -m sweep` with subprocess themselves.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

# A workload small enough that one trial takes a few seconds on 2 cores.
TINY = [
    "global_batch_size=8",
    "workload.feat_dim=8",
    "workload.frames=16",
    "workload.label_len=4",
    "workload.vocab=8",
    "workload.enc_hidden=16",
    "workload.enc_layers=1",
    "workload.pred_hidden=16",
    "workload.joint_hidden=16",
    "trial.warmup_steps=1",
    "trial.measure_steps=3",
]

FRESH = os.environ.get("SWEEP_TESTS_FRESH_PROCESS") == "1"
# Called with each forked run's argv before it starts (tests/conftest.py: a test that starts `python -m sweep` is
# marked e2e; a fresh one it sees through subprocess.Popen's audit event).
START_HOOKS: list[Callable[[list[str]], None]] = []
SERVER = Path(__file__).resolve().parents[1] / "sweep_server.py"  # a script, beside the tests that run it


class _ForkServer:
    """tests/sweep_server.py, started on first use and again whenever it is gone: a test that runs a command
    trial in this process ends every descendant the trial's tree tracker saw, this server included."""

    def __init__(self, preload: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.preload, self.env = preload, env  # the modules it imports first (default: sweep's); its own env on top
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._dir = tempfile.mkdtemp(prefix="sweep_server_")
        self.path = os.path.join(self._dir, "socket")

    def connect(self) -> socket.socket:
        with self._lock:
            for _ in range(2):
                if self._process is None or self._process.poll() is not None:
                    self._start()
                try:
                    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    connection.connect(self.path)
                    return connection
                except OSError:
                    connection.close()
                    self._stop()
            raise RuntimeError(f"the sweep fork server ({SERVER}) does not answer")

    def _start(self) -> None:
        self._stop()
        env = {**os.environ, **(self.env or {})}
        self._process = subprocess.Popen([sys.executable, str(SERVER), self.path, *self.preload], stdout=subprocess.PIPE,
                                         stdin=subprocess.DEVNULL, text=True, env=env)
        ready = self._process.stdout.readline()
        if ready.strip() != "ready":
            raise RuntimeError(f"the sweep fork server did not start: {ready!r}")

    def close(self) -> None:
        self._stop()
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)

    def _stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


_server = _ForkServer()
atexit.register(_server.close)
# torch (and torch._dynamo, which an optimizer's first construction imports) loaded once: 2.5 s of CPU a script.
# One intra-op thread, as the probe tests ask of every script: torch reads OMP_NUM_THREADS when it loads.
_torch_server = _ForkServer(("torch", "torch._dynamo"), {"OMP_NUM_THREADS": "1"})
atexit.register(_torch_server.close)


class ForkedRun:
    """One run of the fork server, handled as a subprocess.Popen is: pid, poll(), wait(), send_signal(), kill()
    and returncode. Its stdout and stderr go to the files named (tests read them as the run goes on).
    script: `python SCRIPT ARGS` (a script that ends in sweep's main) instead of `python -m sweep ARGS`."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str], stdout: str, stderr: str, script: str | None = None,
                 server: _ForkServer = _server) -> None:
        self.args = [sys.executable, *([script] if script else ["-m", "sweep"]), *args]
        for hook in START_HOOKS:
            hook(self.args)
        self.returncode: int | None = None
        request = {"args": list(args), "cwd": str(cwd), "env": dict(env), "stdout": stdout, "stderr": stderr, "script": script}
        self._connection = server.connect()
        self._connection.sendall((json.dumps(request) + "\n").encode())
        # Unbuffered: a buffered reader could take the status line in with the pid's, and select() on the
        # socket would then wait out the whole timeout for bytes already read.
        self._replies = self._connection.makefile("rb", buffering=0)
        self.pid = int(self._replies.readline())

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._connection], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status, once the run has ended (the status line comes then); TimeoutExpired after timeout seconds."""
        if self.returncode is None:
            if not select.select([self._connection], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read_status()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never a pid that has ended (and may have been reused)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read_status(self) -> None:
        status = self._replies.readline()
        self._connection.close()
        if not status:
            raise RuntimeError(f"the sweep fork server stopped while running {self.args}")
        self.returncode = int(status)


def background_sweep(args: list[str], cwd: Path, env: dict[str, str], out: Path) -> subprocess.Popen | ForkedRun:
    """`python -m sweep ARGS` left running, for tests that act on it (signals, kills) while its trials run; its stdout
    and stderr both go to `out` (a file: a pipe its jobs would hold open after it is killed). Forked, or FRESH a new
    interpreter."""
    with out.open("w") as stream:  # there from the start: a test may read it before the run has opened it
        if FRESH:
            return subprocess.Popen([sys.executable, "-m", "sweep", *args], cwd=cwd, env=env, stdout=stream, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
    return ForkedRun(args, cwd, env, str(out), str(out))


def _captured(args: list[str], cwd: Path, env: dict[str, str], timeout: float, script: str | None = None,
              server: _ForkServer = _server) -> subprocess.CompletedProcess:
    """One forked run to its end, its output captured as subprocess.run(capture_output=True) reports it; past the
    timeout it is killed and TimeoutExpired carries what it printed."""
    with tempfile.TemporaryDirectory(prefix="forked_run_") as out:  # outside cwd: some tests check cwd stays empty
        stdout, stderr = os.path.join(out, "stdout"), os.path.join(out, "stderr")
        run = ForkedRun(args, cwd, env, stdout, stderr, script=script, server=server)
        try:
            run.wait(timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
            timed_out = True
        captured = [Path(p).read_text(errors="replace") if os.path.exists(p) else "" for p in (stdout, stderr)]
    if timed_out:
        raise subprocess.TimeoutExpired(run.args, timeout, output=captured[0], stderr=captured[1])
    return subprocess.CompletedProcess(run.args, run.returncode, *captured)


def forked_python(script: str, args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` forked from a server that has imported torch, as subprocess.run(capture_output=True) would
    report it. The run starts as a fresh interpreter does with `env` (PYTHONPATH, sitecustomize: sweep's probe arms
    there), except that torch is imported already; env's OMP_NUM_THREADS must be the server's. FRESH: a new interpreter."""
    assert env.get("OMP_NUM_THREADS") == _torch_server.env["OMP_NUM_THREADS"], "torch read its thread count at load"
    if FRESH:
        return subprocess.run([sys.executable, script, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    return _captured(args, cwd, env, timeout, script=script, server=_torch_server)


def sweep_process(args: list[str], cwd: Path, env: dict[str, str], timeout: float, fresh: bool = False) -> subprocess.CompletedProcess:
    """`python -m sweep ARGS` in `cwd` with exactly `env`, stdin closed; output captured as text, like subprocess.run.
    fresh: a new interpreter (for what a forked run cannot show: its start-up's own CPU and imports)."""
    if fresh or FRESH:
        return subprocess.run([sys.executable, "-m", "sweep", *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    return _captured(args, cwd, env, timeout)


def run_sweep(args: list[str], cwd: Path, timeout: float = 600, env: dict[str, str] | None = None, fresh: bool = False) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("SWEEP_DEBUG", None)
    full_env.pop("HYDRA_FULL_ERROR", None)
    return sweep_process(args, cwd, full_env, timeout, fresh)
