"""A real Slurm cluster on this machine for the tests: one node on localhost and two more nodes.

`start_cluster(state_dir)` starts munged, MariaDB, slurmdbd, slurmctld and slurmd through
tests/slurm/cluster.sh; `stop_cluster(cluster)` stops exactly those daemons again. The localhost node is
partition `debug` (the default); nodes mn1 and mn2, each in network, UTS and mount namespaces of its own
with its own hostname, loopback and /etc/hosts (tests/slurm/nodes.sh), are partition `multi`, for trials
over two nodes.

The tests never install anything unless asked: where the Debian packages (slurm-wlm, slurmdbd, munge,
mariadb-server, iproute2) are missing, the Slurm tests are skipped with a reason naming
`bash tests/slurm/cluster.sh install` (run as root; .ci/run does). SWEEP_TESTS_INSTALL_SLURM=1 lets the
fixture run that install itself.

`slurm_cluster` is a session-scoped pytest fixture (tests/conftest.py imports it). It yields a
`SlurmCluster` and sets its `env` (SLURM_CONF, PATH) in os.environ for the session, so that submitit's
SlurmExecutor, which shells out to sbatch/squeue/sacct/scancel, and the jobs themselves (sbatch exports
the submitter's environment) use it.

One cluster per test run, whatever worker asks. The pytest process that runs the session (the xdist
controller, or pytest itself with -n 0) makes a run dir and names it in SWEEP_TESTS_RUN_DIR for its
workers (`begin_run`). The first worker to need the cluster starts it under a lock file there and writes
its record (or why it could not be had, so that no other worker tries again); every worker that uses it
registers there, and the last one to let go stops it (`acquire`, `release`). The Slurm tests share an
xdist group as well (tests/conftest.py), so normally one worker does all of that. Nothing is left running
by an interrupted run: a worker's SIGTERM handler and atexit let go of the cluster as its session end
would, the session's process stops whatever cluster its run dir still records at its end, Ctrl-C and
SIGTERM included (`end_run`), and a cluster whose run was killed outright (SIGKILL) is stopped by the
next `cluster.sh start` on the machine (`cluster.sh stop-stale`: the process that owned it is gone).

Where the cluster cannot be had (not root, packages missing, start failed) the tests that use the fixture
are skipped with the reason; with CI=true they fail instead, since CI must run them. `slurm_nodes` (the
cluster, for tests over two nodes) is skipped, or fails under CI, the same way where the two nodes cannot
be had while the localhost node can.

Set SWEEP_TEST_SLURM_CONF=/path/slurm.conf to run the tests against a cluster started beforehand
(`bash tests/slurm/cluster.sh start DIR 2`); the fixture then neither starts nor stops anything, and takes
partition `multi` for the two-node tests.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "slurm" / "cluster.sh"
PARTITION = "debug"
MULTI_PARTITION = "multi"  # the nodes in namespaces of their own
NODES = 2  # of them
INSTALL_TIMEOUT_S = 900
START_TIMEOUT_S = 180
STOP_TIMEOUT_S = 180
# Unix sockets live under the state dir; cluster.sh refuses longer paths.
MAX_STATE_DIR_LEN = 70
INSTALL_ENV = "SWEEP_TESTS_INSTALL_SLURM"  # =1: the fixture may apt-get install the packages itself
RUN_DIR_ENV = "SWEEP_TESTS_RUN_DIR"  # the run's dir, from the session's process to its workers (begin_run)
RUN_OWNER_ENV = "SWEEP_TESTS_RUN_OWNER"  # that process's pid: the run ends with it
INSTALL_HINT = f"run `bash tests/slurm/cluster.sh install` as root first (or set {INSTALL_ENV}=1 to let the tests run it)"


class ClusterUnavailable(RuntimeError):
    """The Slurm cluster cannot be started here; the message says why."""


@dataclasses.dataclass
class SlurmCluster:
    state_dir: Path | None  # None for a cluster this module did not start
    env: dict[str, str]
    partition: str = PARTITION
    multi_partition: str = ""  # the two-node partition; "" where it could not be had
    multi_nodes: tuple[str, ...] = ()
    multi_unavailable: str = ""  # why not

    @property
    def slurm_conf(self) -> str:
        return self.env["SLURM_CONF"]

    @property
    def log_dir(self) -> Path | None:
        return None if self.state_dir is None else self.state_dir / "log"

    def to_record(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "state_dir": None if self.state_dir is None else str(self.state_dir),
                "multi_nodes": list(self.multi_nodes)}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SlurmCluster:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in record.items() if k in fields}
        values["state_dir"] = None if values.get("state_dir") is None else Path(values["state_dir"])
        values["multi_nodes"] = tuple(values.get("multi_nodes", ()))
        return cls(**values)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _job_path() -> str:
    """PATH for the tests and the jobs: this interpreter first, Slurm's tools on it."""
    parts = [os.path.dirname(sys.executable)]
    parts += os.environ.get("PATH", "").split(os.pathsep)
    parts += ["/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin"]
    seen: dict[str, None] = {}
    for part in parts:
        if part:
            seen.setdefault(part, None)
    return os.pathsep.join(seen)


def _env_for(slurm_conf: str) -> dict[str, str]:
    return {"SLURM_CONF": slurm_conf, "PATH": _job_path()}


def _run(args: list, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", **(env or {}))
    env["PATH"] = _job_path()
    try:
        return subprocess.run(
            ["bash", str(SCRIPT), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise ClusterUnavailable(f"`cluster.sh {' '.join(args)}` timed out after {timeout}s\n{err[-3000:]}") from exc


def missing_packages() -> list[str]:
    """The Debian packages the cluster needs that are not installed (`cluster.sh missing`)."""
    proc = _run(["missing"], 60)
    if proc.returncode != 0:
        raise ClusterUnavailable(f"cannot tell whether the Slurm packages are installed:\n{proc.stderr[-3000:]}")
    return proc.stdout.split()


def install_packages() -> None:
    """apt-get install the Slurm/munge/MariaDB packages if any is missing."""
    proc = _run(["install"], INSTALL_TIMEOUT_S)
    if proc.returncode != 0:
        raise ClusterUnavailable(f"installing the Slurm packages failed:\n{proc.stderr[-3000:]}")


def install_allowed() -> bool:
    return os.environ.get(INSTALL_ENV) == "1"


def start_cluster(state_dir: str | Path, install: bool | None = None, nodes: int = NODES,
                  owner: int | None = None) -> SlurmCluster:
    """Start a cluster whose state lives in state_dir, with `nodes` nodes in namespaces beside the localhost one
    (0: none); raise ClusterUnavailable if the localhost node cannot be had. Missing packages are installed only
    with install=True (None: where SWEEP_TESTS_INSTALL_SLURM=1). owner: the pid whose end makes the cluster stale,
    for the next start on the machine to stop (`cluster.sh stop-stale`); None: never stale."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        raise ClusterUnavailable("the Slurm test cluster needs root (its daemons run as root)")
    missing = missing_packages()
    if missing:
        if not (install_allowed() if install is None else install):
            raise ClusterUnavailable(f"the Debian packages {' '.join(missing)} are not installed: {INSTALL_HINT}")
        install_packages()
    state_dir = Path(state_dir).resolve()
    env = {"SLURM_TEST_OWNER_PID": str(owner)} if owner else {}
    try:
        proc = _run(["start", str(state_dir), str(nodes)], START_TIMEOUT_S, env)
    except ClusterUnavailable:
        _run(["stop", str(state_dir)], STOP_TIMEOUT_S)  # whatever it got to start
        raise
    if proc.returncode != 0:
        raise ClusterUnavailable(f"starting the Slurm test cluster failed:\n{proc.stderr[-3000:]}")
    said = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    if "SLURM_CONF" not in said:
        raise ClusterUnavailable(f"cluster.sh start printed no SLURM_CONF line:\n{proc.stdout}\n{proc.stderr}")
    return SlurmCluster(
        state_dir=state_dir, env=_env_for(said["SLURM_CONF"]), multi_partition=said.get("MULTI_PARTITION", ""),
        multi_nodes=tuple(n for n in said.get("MULTI_NODES", "").split(",") if n),
        multi_unavailable=said.get("MULTI_UNAVAILABLE", "" if nodes else "not asked for"),
    )


def _external(slurm_conf: str) -> SlurmCluster:
    """A cluster started beforehand: its `multi` partition, if it has one of two nodes or more."""
    env = _env_for(slurm_conf)
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-p", MULTI_PARTITION, "-o", "%N"], capture_output=True, text=True,
                             timeout=30, env={**os.environ, **env}).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        out = f"{exc}"
    nodes = tuple(sorted(set(out.split())))
    if len(nodes) >= 2:
        return SlurmCluster(state_dir=None, env=env, multi_partition=MULTI_PARTITION, multi_nodes=nodes)
    return SlurmCluster(state_dir=None, env=env, multi_unavailable=f"{slurm_conf} has no partition {MULTI_PARTITION} of two nodes or more")


def stop_cluster(cluster: SlurmCluster | str | Path) -> None:
    """Stop exactly the daemons start_cluster started (nothing for an external cluster)."""
    state_dir = cluster.state_dir if isinstance(cluster, SlurmCluster) else Path(cluster)
    if state_dir is None:
        return
    proc = _run(["stop", str(state_dir)], STOP_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"stopping the Slurm test cluster failed:\n{proc.stderr[-3000:]}")


# -- one cluster per run ---------------------------------------------------------------------------------

def begin_run(directory: Path | None = None) -> Path:
    """In the process that runs the session, before xdist starts its workers: the run's dir (a new temporary one
    if none is given), named in SWEEP_TESTS_RUN_DIR for the workers, who inherit it, with this process's pid as the
    run's owner. Short: the cluster's state dir (unix sockets) goes in it."""
    directory = Path(tempfile.mkdtemp(prefix="sweep-run-")) if directory is None else directory
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[RUN_DIR_ENV] = str(directory)
    os.environ[RUN_OWNER_ENV] = str(os.getpid())
    return directory


def run_dir() -> Path:
    """This run's dir (begin_run's), or one of this process's own where no session made one (a script, a test of
    this module)."""
    given = os.environ.get(RUN_DIR_ENV)
    if given and os.path.isdir(given):
        return Path(given)
    return begin_run()


_locks_held: list[Path] = []  # this process is inside _locked (a signal handler must not wait for its own lock)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Held by one process of the run at a time (flock: let go however the holder ends)."""
    with open(directory / "slurm.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _locks_held.append(directory)
        try:
            yield
        finally:
            _locks_held.pop()
            fcntl.flock(lock, fcntl.LOCK_UN)


def _record_path(directory: Path) -> Path:
    return directory / "slurm.json"


def read_record(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads(_record_path(directory).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _write_record(directory: Path, record: dict[str, Any]) -> None:
    tmp = _record_path(directory).with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(_record_path(directory))


def _proc_start(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time since boot): with the pid it names one process, never a recycled pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(") ", 1)[-1].split()[19]


def _user_name(pid: int) -> str:
    return f"{pid}-{_proc_start(pid)}"


def live_users(directory: Path) -> list[str]:
    """The processes that use the run's cluster and are still running (a SIGKILLed one's entry is left behind)."""
    users = directory / "slurm.users"
    alive = []
    for entry in sorted(users.iterdir()) if users.is_dir() else ():
        pid, _, start = entry.name.partition("-")
        if pid.isdigit() and _proc_start(int(pid)) == start:
            alive.append(entry.name)
    return alive


_held: dict[str, Path] = {}  # this process's use of a run's cluster: the run dir, while it holds it
_watching: list[bool] = []  # the atexit and SIGTERM handlers are in place


def acquire(directory: Path, start: Callable[[], SlurmCluster]) -> SlurmCluster:
    """The run's cluster: started by `start()` if no process of the run has started it yet, else the one recorded.
    A start that failed is recorded too, and raised again to every later caller (ClusterUnavailable) rather than
    tried again. This process is registered as a user until release()."""
    with _locked(directory):
        record = read_record(directory)
        if record is None or record["state"] == "stopped":
            try:
                cluster = start()
            except ClusterUnavailable as exc:
                _write_record(directory, {"state": "failed", "reason": str(exc)})
                raise
            _write_record(directory, {"state": "up", "by": os.getpid(), **cluster.to_record()})
        elif record["state"] == "failed":
            raise ClusterUnavailable(record["reason"])
        else:
            cluster = SlurmCluster.from_record(record)
        users = directory / "slurm.users"
        users.mkdir(exist_ok=True)
        (users / _user_name(os.getpid())).touch()
    if not _watching:
        _watch_signals()
        _watching.append(True)
    _held["run"] = directory
    return cluster


def release(directory: Path, stop: Callable[[SlurmCluster], None] = stop_cluster) -> bool:
    """This process is done with the run's cluster; the last user still running stops it. True if it was stopped."""
    _held.pop("run", None)
    with _locked(directory):
        with contextlib.suppress(FileNotFoundError):
            (directory / "slurm.users" / _user_name(os.getpid())).unlink()
        record = read_record(directory)
        if record is None or record["state"] != "up" or live_users(directory):
            return False
        _write_record(directory, {**record, "state": "stopping"})
        try:
            stop(SlurmCluster.from_record(record))
        finally:
            _write_record(directory, {**record, "state": "stopped"})
    return True


def end_run(directory: Path, stop: Callable[[SlurmCluster], None] = stop_cluster) -> bool:
    """At the run's end, in the session's process (its workers are gone): stop the cluster its dir still records as
    running, whoever started it (a worker killed before it let go), then delete what the cluster kept but its logs
    (MariaDB's files alone are over 100 MB); a run that used no cluster leaves no dir. True if one was stopped here."""
    if read_record(directory) is None:
        shutil.rmtree(directory, ignore_errors=True)
        return False
    stopped = False
    with _locked(directory):
        record = read_record(directory) or {}
        if record.get("state") in ("up", "stopping"):
            try:
                stop(SlurmCluster.from_record(record))
                stopped = True
            finally:
                record = {**record, "state": "stopped"}
                _write_record(directory, record)
        if record.get("state") == "stopped" and record.get("state_dir"):
            state_dir = Path(record["state_dir"])
            for entry in state_dir.iterdir() if state_dir.is_dir() else ():
                if entry.name != "log":
                    shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
    return stopped


def _let_go() -> None:
    directory = _held.get("run")
    if directory is not None:
        release(directory)


def _watch_signals() -> None:
    """A process holding the cluster lets go of it at exit, and on SIGTERM (whose default ends Python with no atexit):
    then it dies of the SIGTERM as it would have."""
    atexit.register(_let_go)
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        try:
            if not _locks_held:  # else the run's own process stops it at the end (end_run)
                _let_go()
        finally:
            if callable(previous):
                previous(signum, frame)
            else:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGTERM, on_term)


# -- the fixtures ----------------------------------------------------------------------------------------

def _unavailable(reason: str) -> None:
    """Skip (printing the reason), or fail under CI=true where the Slurm tests must run."""
    print(f"\nSlurm test cluster unavailable: {reason}", file=sys.stderr)
    if in_ci():
        pytest.fail(f"Slurm test cluster unavailable (CI=true, so this fails): {reason}", pytrace=False)
    pytest.skip(f"Slurm test cluster unavailable: {reason}")


def _state_dir(directory: Path) -> Path:
    path = Path(tempfile.mkdtemp(prefix="slurm-", dir=directory))
    if len(str(path.resolve())) <= MAX_STATE_DIR_LEN:
        return path
    return Path(tempfile.mkdtemp(prefix="sweep-slurm-"))


def _session_owner() -> int:
    """The pid whose end ends the run: the session's process (begin_run's), else this one."""
    owner = os.environ.get(RUN_OWNER_ENV, "")
    return int(owner) if owner.isdigit() else os.getpid()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    external = os.environ.get("SWEEP_TEST_SLURM_CONF")
    directory = None
    if external:
        cluster = _external(external)
    else:
        directory = run_dir()
        try:
            cluster = acquire(directory, lambda: start_cluster(_state_dir(directory), owner=_session_owner()))
        except ClusterUnavailable as exc:
            _unavailable(str(exc))
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in cluster.env.items():
                mp.setenv(key, value)
            yield cluster
    finally:
        if directory is not None:
            release(directory)


@pytest.fixture
def slurm_nodes(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """The cluster, for a test over two nodes (partition multi_partition): skipped with the reason, or failed under
    CI=true, where the nodes in namespaces could not be had."""
    if not slurm_cluster.multi_partition:
        _unavailable(f"no two-node partition: {slurm_cluster.multi_unavailable}")
    return slurm_cluster


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.25) -> Any:
    """Poll check() until it returns something truthy; fail naming what never happened."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
