"""A real Slurm cluster on this machine for the tests: one node on localhost and two more nodes.

`start_cluster(state_dir)` installs the Debian packages when missing and starts
munged, MariaDB, slurmdbd, slurmctld and slurmd through tests/slurm/cluster.sh;
`stop_cluster(cluster)` stops exactly those daemons again. The localhost node is
partition `debug` (the default); nodes mn1 and mn2, each in network, UTS and mount
namespaces of its own with its own hostname, loopback and /etc/hosts
(tests/slurm/nodes.sh), are partition `multi`, for trials over two nodes.

`slurm_cluster` is a session-scoped pytest fixture (tests/conftest.py imports
it: `from slurm_cluster import slurm_cluster`). It yields a `SlurmCluster` and
sets its `env` (SLURM_CONF, PATH) in os.environ for the session, so that
submitit's SlurmExecutor, which shells out to sbatch/squeue/sacct/scancel, and
the jobs themselves (sbatch exports the submitter's environment) use it.

Where the cluster cannot be had (not root, packages missing and not
installable, start failed) the tests that use the fixture are skipped with the
reason; with CI=true they fail instead, since CI must run them. `slurm_nodes`
(the cluster, for tests over two nodes) is skipped, or fails under CI, the same
way where the two nodes cannot be had while the localhost node can.

Set SWEEP_TEST_SLURM_CONF=/path/slurm.conf to run the tests against a cluster
started beforehand (`bash tests/slurm/cluster.sh start DIR 2`); the fixture then
neither starts nor stops anything, and takes partition `multi` for the two-node tests.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent / "slurm" / "cluster.sh"
PARTITION = "debug"
MULTI_PARTITION = "multi"  # the nodes in namespaces of their own
NODES = 2  # of them
INSTALL_TIMEOUT_S = 900
START_TIMEOUT_S = 180
STOP_TIMEOUT_S = 180
# Unix sockets live under the state dir; cluster.sh refuses longer paths.
MAX_STATE_DIR_LEN = 70


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


def _run(args: list, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
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


def install_packages() -> None:
    """apt-get install the Slurm/munge/MariaDB packages if any is missing."""
    proc = _run(["install"], INSTALL_TIMEOUT_S)
    if proc.returncode != 0:
        raise ClusterUnavailable(f"installing the Slurm packages failed:\n{proc.stderr[-3000:]}")


def start_cluster(state_dir: str | Path, install: bool = True, nodes: int = NODES) -> SlurmCluster:
    """Start a cluster whose state lives in state_dir, with `nodes` nodes in namespaces beside the localhost one
    (0: none); raise ClusterUnavailable if the localhost node cannot be had."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        raise ClusterUnavailable("the Slurm test cluster needs root (its daemons run as root)")
    if install:
        install_packages()
    state_dir = Path(state_dir).resolve()
    try:
        proc = _run(["start", str(state_dir), str(nodes)], START_TIMEOUT_S)
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


def _unavailable(reason: str) -> None:
    """Skip (printing the reason), or fail under CI=true where the Slurm tests must run."""
    print(f"\nSlurm test cluster unavailable: {reason}", file=sys.stderr)
    if in_ci():
        pytest.fail(f"Slurm test cluster unavailable (CI=true, so this fails): {reason}", pytrace=False)
    pytest.skip(f"Slurm test cluster unavailable: {reason}")


def _state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("slurm")
    if len(str(path.resolve())) <= MAX_STATE_DIR_LEN:
        return path
    return Path(tempfile.mkdtemp(prefix="sweep-slurm-"))


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    external = os.environ.get("SWEEP_TEST_SLURM_CONF")
    if external:
        cluster = _external(external)
    else:
        try:
            cluster = start_cluster(_state_dir(tmp_path_factory))
        except ClusterUnavailable as exc:
            _unavailable(str(exc))
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in cluster.env.items():
                mp.setenv(key, value)
            yield cluster
    finally:
        stop_cluster(cluster)


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
