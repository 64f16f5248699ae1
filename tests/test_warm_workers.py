"""Warm workers through the orchestrator, end to end: `python -m sweep` hands built-in trials to a worker
per device group (launch/warm_pool.py); a worker killed mid-trial leaves that trial failed and the next
trial a fresh worker; a trial over its time limit still ends as timeout; a sweep killed mid-trial and
resumed adopts the trial its worker finished; on GPUs (torch made to report 4) each device group gets
workers of its own."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from support.in_process import pretend_four_gpus, run_in_process
from support.sweep_run import TINY, ForkedRun, background_sweep, run_sweep
from support.waiting import wait_for
from support.warm_workers import running_worker, states

pytestmark = pytest.mark.e2e


def rows(sweep_dir: Path) -> dict[tuple[int, int], dict]:
    return {(int(r["accum"]), int(r["split"])): r for r in csv.DictReader((sweep_dir / "trials.csv").open())}


def start_sweep(args: list[str], cwd: Path) -> subprocess.Popen | ForkedRun:
    """`python -m sweep` in the background, its output in cwd/out.txt."""
    return background_sweep(args, cwd, {**os.environ, "PYTHONUNBUFFERED": "1"}, cwd / "out.txt")


@pytest.mark.slow
def test_a_killed_worker_fails_its_trial_and_the_sweep_goes_on_in_a_fresh_one(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "s"
    proc = start_sweep([f"hydra.sweep.dir={sweep_dir}", *TINY, "search=grid", "accum=1,2", "split=1",
                        "trial.measure_steps=60", "trial.max_measure_steps=60", "search.racing=false"], tmp_path)
    victim = wait_for(lambda: running_worker(sweep_dir))
    os.kill(victim["pid"], signal.SIGKILL)
    assert proc.wait(timeout=300) == 0, (tmp_path / "out.txt").read_text()
    table = rows(sweep_dir)
    killed = next(r for r in table.values() if Path(victim["trial_dir"]).name == f"accum{r['accum']}_split{r['split']}")
    assert killed["status"] == "failed" and killed["log"] in killed["reason"], killed
    others = [r for r in table.values() if r is not killed]
    assert [r["status"] for r in others] == ["ok"]
    assert len({s["pid"] for s in states(sweep_dir)}) == 2  # the killed worker and its replacement


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["worker", "trial process"])
def test_a_trial_killed_after_an_oom_in_its_worker_is_failed_by_its_own_lines_and_prunes_nothing(tmp_path: Path, victim: str) -> None:
    """The CPU demo's staircase (issue 43): its worker runs accum=2 split=1 (an encoder OOM, its traceback in the worker's log),
    then accum=4 split=1, then accum=4 split=2, which is SIGKILLed mid-trial, the worker or the trial's forked process. Read
    from the whole log, that trial was an encoder OOM (the earlier trial's), which pruned every smaller accum and gave the
    recommendation 99/100; from its own lines it is failed, naming the kill and its log."""
    import psutil

    from sweep.core.implications import oom_implied
    from sweep.core.space import enumerate_candidates, make_candidate
    from sweep.records import collect_results

    sweep_dir = tmp_path / "s"
    # No racing: the killed trial is not stopped early, nor the first pair re-run in full; the killed trial is the last.
    proc = start_sweep([f"hydra.sweep.dir={sweep_dir}", "search.drift_check=false", "search.racing=false", "search.max_trials=4",
                        "trial.measure_steps=12", "trial.max_measure_steps=12"], tmp_path)

    def running_the_pair() -> dict | None:
        state = running_worker(sweep_dir)
        return state if state and state["trial_dir"].endswith("accum4_split2") else None

    state = wait_for(running_the_pair)
    os.kill(state["pid"] if victim == "worker" else psutil.Process(state["pid"]).children()[0].pid, signal.SIGKILL)
    code = proc.wait(timeout=300)
    out, table = (tmp_path / "out.txt").read_text(), rows(sweep_dir)
    # 1 only where no pair ran ok (on a busy box the first pair may be rejected as never steady): no error either way.
    assert code in (0, 1) and "Traceback" not in out, out
    assert table[(2, 1)]["status"] == "oom", table  # the earlier trial, whose lines the killed one's came after
    killed = table[(4, 2)]
    assert (killed["status"], killed["oom_phase"]) == ("failed", ""), killed
    what = ("its warm worker (pid {}) was killed while running it" if victim == "worker"
            else "its warm worker (pid {}): its trial process was killed by SIGKILL").format(state["pid"])
    assert what in killed["reason"] and "no sign of running out of memory in its own lines" in killed["reason"], killed
    assert f"see {killed['log']} from byte " in killed["reason"] and "allocate" not in killed["reason"], killed
    assert f"accum=4 split=2: failed: {what}" in out
    # Nothing pruned by it: no pair implied OOM that is not without it. Read as an encoder OOM at a per-device batch of 32,
    # it ruled out every pair of accum 4 or less (accum=4 split=4 among them), and the first pair was recommended at 99/100.
    results = list(collect_results(sweep_dir).values())
    others = [r for r in results if (r.accum, r.split) != (4, 2)]
    pairs = enumerate_candidates(128, 1)
    assert [c for c in pairs if oom_implied(c, results)] == [c for c in pairs if oom_implied(c, others)]
    assert not oom_implied(make_candidate(4, 4, 128, 1), results)
    # Nor does the recommendation rest on it: the pair recommended ran ok.
    if code == 0:
        rec = yaml.safe_load((sweep_dir / "recommendation.yaml").read_text())
        assert table[(rec["accum"], rec["split"])]["status"] == "ok", rec


def test_a_trial_over_its_time_limit_ends_as_timeout_and_its_worker_with_it(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "s"
    proc = run_sweep([f"hydra.sweep.dir={sweep_dir}", *TINY, "search=grid", "accum=1", "split=1", "trial.time_limit_s=8",
                      "trial.measure_steps=5000", "trial.max_measure_steps=5000", "search.drift_check=false"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # no trial ran ok
    row = rows(sweep_dir)[(1, 1)]
    assert row["status"] == "timeout" and "trial.time_limit_s=8" in row["reason"], row
    assert "warm worker job" in proc.stdout
    [worker] = states(sweep_dir)
    import psutil

    assert not psutil.pid_exists(worker["pid"]) or psutil.Process(worker["pid"]).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
def test_a_sweep_killed_mid_trial_resumes_and_adopts_what_its_worker_finished(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "s"
    # 1200 steps (about 4 s on a quiet core): the resumed sweep still finds the killed sweep's trial running.
    args = [f"hydra.sweep.dir={sweep_dir}", *TINY, "search=grid", "accum=1", "split=1,2", "trial.measure_steps=1200",
            "trial.max_measure_steps=1200", "search.drift_check=false", "search.racing=false"]
    proc = start_sweep(args, tmp_path)
    worker = wait_for(lambda: running_worker(sweep_dir))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    resumed = run_sweep([f"resume={sweep_dir}"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    job = json.loads((Path(worker["trial_dir"]) / "job.json").read_text())["job_id"]
    assert f"re-attached to running job {job}" in resumed.stdout
    record = json.loads((Path(worker["trial_dir"]) / "result.json").read_text())
    assert record["status"] == "ok" and record["job_id"] == job  # the worker's own record of the trial it had
    assert {r["status"] for r in rows(sweep_dir).values()} == {"ok"}
    # With its orchestrator gone, the old worker took no other trial: it retired once its trial ended.
    old = next(s for s in states(sweep_dir) if s["pid"] == worker["pid"])
    assert old["state"] == "retired" and old["why"] == "its orchestrator has ended" and old["trials"] == 1


@pytest.mark.slow
def test_on_gpus_each_device_group_gets_workers_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    # torch reports 4 GPUs here only: in the workers the trials find no CUDA and fail, each a fatal error,
    # after which its worker retires and the group's next trial gets a fresh one.
    pretend_four_gpus(monkeypatch)
    sweep_dir = tmp_path / "s"
    code = run_in_process([f"hydra.sweep.dir={sweep_dir}", *TINY, "machine.name=fake4gpu", "machine.device=cuda", "machine.num_devices=1",
                           "machine.memory_gib=80", "search=grid", "accum=1,2,4", "split=1", "max_in_flight=2", "trial.time_limit_s=120"],
                          monkeypatch)
    out = capsys.readouterr()
    assert code == 1, out.out + out.err  # nothing ran ok
    assert {r["status"] for r in rows(sweep_dir).values()} == {"failed"}
    seen = states(sweep_dir)
    assert len(seen) == 3 and all(s["state"] == "retiring" and s["why"].startswith("fatal error") for s in seen), seen
    assert {s["devices"] for s in seen} <= {"0", "1", "2", "3"}  # one GPU each, of the four torch reports
    assert all(s["dir"].startswith(f"gpus{s['devices']}-") for s in seen)  # each started for its group, its CUDA_VISIBLE_DEVICES
