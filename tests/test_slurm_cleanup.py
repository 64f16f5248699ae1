"""One Slurm test cluster per run, and none left running after it, checked without Slurm (tests/support/slurm_cluster.py).

The run's workers share the cluster through a lock file and a record in the run's dir: the first to ask starts it,
a failed start is not tried again, the last user still running stops it, and the run's own process stops whatever
is still recorded at the end. A cluster left by a run killed outright (its owner gone) is stopped by the next
`cluster.sh start` (`cluster.sh stop-stale`), here with `sleep`s standing in for the daemons."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import slurm_cluster as S

TESTS = Path(__file__).resolve().parent


def fake_cluster(state_dir: Path) -> S.SlurmCluster:
    return S.SlurmCluster(state_dir=state_dir, env={"SLURM_CONF": str(state_dir / "slurm.conf"), "PATH": "/usr/bin"})


def test_the_first_to_ask_starts_the_cluster_and_the_last_to_let_go_stops_it(tmp_path: Path) -> None:
    started, stopped = [], []

    def start() -> S.SlurmCluster:
        started.append(1)
        return fake_cluster(tmp_path / "state")

    first = S.acquire(tmp_path, start)
    again = S.acquire(tmp_path, start)  # another fixture of the same process, or another worker
    assert started == [1] and again == first and S.read_record(tmp_path)["state"] == "up"
    other = tmp_path / "slurm.users" / f"{os.getppid()}-{S._proc_start(os.getppid())}"  # a user still running
    other.touch()
    assert not S.release(tmp_path, stopped.append) and stopped == []
    other.unlink()
    (tmp_path / "slurm.users" / f"{os.getpid()}-{S._proc_start(os.getpid())}").touch()
    assert S.release(tmp_path, stopped.append) and stopped == [first]
    assert S.read_record(tmp_path)["state"] == "stopped"
    assert not S.end_run(tmp_path, stopped.append) and stopped == [first]  # nothing left to stop


def test_a_user_killed_outright_does_not_keep_the_cluster_up(tmp_path: Path) -> None:
    S.acquire(tmp_path, lambda: fake_cluster(tmp_path / "state"))
    dead = subprocess.Popen(["sleep", "0"])
    dead.wait()
    (tmp_path / "slurm.users" / f"{dead.pid}-1").touch()  # its entry was left behind (SIGKILL)
    assert S.live_users(tmp_path) == [f"{os.getpid()}-{S._proc_start(os.getpid())}"]
    stopped: list = []
    assert S.release(tmp_path, stopped.append) and len(stopped) == 1


def test_a_failed_start_is_not_tried_again_by_the_other_workers(tmp_path: Path) -> None:
    def fail() -> S.SlurmCluster:
        raise S.ClusterUnavailable("packages missing")

    with pytest.raises(S.ClusterUnavailable, match="packages missing"):
        S.acquire(tmp_path, fail)
    with pytest.raises(S.ClusterUnavailable, match="packages missing"):
        S.acquire(tmp_path, lambda: pytest.fail("started again"))


def test_the_run_stops_what_its_workers_left_up_and_keeps_only_the_logs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "log").mkdir(parents=True)
    (state / "mysql").mkdir()
    (state / "log" / "slurmctld.log").write_text("kept")
    S._write_record(tmp_path, {"state": "up", **fake_cluster(state).to_record()})  # its worker died holding it
    stopped: list = []
    assert S.end_run(tmp_path, stopped.append) and stopped == [fake_cluster(state)]
    assert sorted(p.name for p in state.iterdir()) == ["log"]
    nothing = tmp_path / "unused"
    nothing.mkdir()
    assert not S.end_run(nothing) and not nothing.exists()  # a run that used no cluster leaves no dir


def test_workers_asking_at_once_start_one_cluster(tmp_path: Path) -> None:
    """Three processes ask at the same moment: one start, under the run dir's lock."""
    starts = tmp_path / "starts"
    code = (
        f"import sys, time; sys.path.insert(0, {str(TESTS)!r}); from pathlib import Path; from support import slurm_cluster as S\n"
        f"run = Path({str(tmp_path)!r})\n"
        "def start():\n"
        f"    with open({str(starts)!r}, 'a') as f: f.write('x')\n"
        "    time.sleep(1)\n"
        "    return S.SlurmCluster(state_dir=run / 'state', env={'SLURM_CONF': 'c', 'PATH': ''})\n"
        "print(S.acquire(run, start).state_dir)\n"
        "S._held.clear()\n"  # the test's own release below stands for theirs
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert starts.read_text() == "x" and outs == [str(tmp_path / "state")] * 3


def _proc(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1].split()[19]


def _gone(proc: subprocess.Popen, timeout: float = 20) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_the_next_start_stops_a_cluster_whose_run_was_killed_and_leaves_a_running_ones_alone(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    ended = subprocess.Popen(["sleep", "0"])
    ended.wait()
    daemons = {}
    for name, owner in (("stale", f"{ended.pid} 1"), ("running", f"{os.getpid()} {_proc(os.getpid())}"), ("by_hand", None)):
        state = tmp_path / name
        state.mkdir()
        daemon = subprocess.Popen(["sleep", "300"], start_new_session=True)
        daemons[name] = daemon
        (state / "daemons.pids").write_text(f"munged {daemon.pid} {_proc(daemon.pid)}\n")
        if owner:
            (state / "owner").write_text(owner + "\n")
        key = subprocess.run(["cksum"], input=str(state), capture_output=True, text=True).stdout.split()[0]
        (registry / key).write_text(f"{state}\n")
    try:
        proc = subprocess.run(["bash", str(TESTS / "slurm" / "cluster.sh"), "stop-stale"], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "SLURM_TEST_REGISTRY": str(registry)})
        assert proc.returncode == 0, proc.stderr
        assert f"stopping the stale cluster in {tmp_path / 'stale'}" in proc.stderr
        assert _gone(daemons["stale"])
        assert daemons["running"].poll() is None and daemons["by_hand"].poll() is None
        assert len(list(registry.iterdir())) == 2  # the stale one forgotten
    finally:
        for daemon in daemons.values():
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGKILL)
                daemon.wait()


def test_a_sigterm_to_a_worker_holding_the_cluster_lets_go_of_it_first(tmp_path: Path) -> None:
    """A worker ended by SIGTERM (a CI timeout) stops the cluster it alone used, then dies of the signal."""
    code = (
        f"import sys, time; sys.path.insert(0, {str(TESTS)!r}); from pathlib import Path; from support import slurm_cluster as S\n"
        f"run = Path({str(tmp_path)!r})\n"
        "S.release.__defaults__ = (lambda c: (run / 'stopped').write_text('yes'),)\n"  # what it stops: a file, here
        "S.acquire(run, lambda: S.SlurmCluster(state_dir=run / 'state', env={'SLURM_CONF': 'c', 'PATH': ''}))\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM
    assert (tmp_path / "stopped").read_text() == "yes"
    assert S.read_record(tmp_path)["state"] == "stopped"


def test_missing_packages_are_named_not_installed_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests never apt-get on their own: the skip (or CI's failure) names the command; SWEEP_TESTS_INSTALL_SLURM=1 runs it."""
    installed: list[str] = []
    monkeypatch.setattr(S.os, "geteuid", lambda: 0)
    monkeypatch.setattr(S, "missing_packages", lambda: ["slurm-wlm", "munge"])
    monkeypatch.setattr(S, "install_packages", lambda: installed.append("apt-get"))
    monkeypatch.delenv(S.INSTALL_ENV, raising=False)
    with pytest.raises(S.ClusterUnavailable, match=r"slurm-wlm munge are not installed: run `bash tests/slurm/cluster.sh install` as root"):
        S.start_cluster(tmp_path)
    assert installed == []

    def no_start(args: list, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(args, 1, "", "not started here")

    monkeypatch.setattr(S, "_run", no_start)
    monkeypatch.setenv(S.INSTALL_ENV, "1")
    with pytest.raises(S.ClusterUnavailable, match="not started here"):
        S.start_cluster(tmp_path)
    assert installed == ["apt-get"]
