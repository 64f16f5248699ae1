"""Fault injection: nothing lost, nothing confusing.

SIGKILL the orchestrator at many moments and resume each time; trials that hang, crash, are
killed by a signal, exit 0 without a result, or leave a torn result file; a second sweep on the
same dir; a full disk and a read-only sweep dir. Every sweep runs tests/fake_train.py, a fake
training command (about a second a trial), through the real submitit launcher.
Helpers and scenarios: tests/support/faultlib.py (bench/bench_reliability.py prints the figures).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from support import faultlib as F

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The kill campaigns' sweep, run once without interruption."""
    return F.reference_sweep(tmp_path_factory.mktemp("reference"))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [7, 2024])
def test_sigkill_at_many_moments_then_resume_loses_and_reruns_nothing(tmp_path, reference, seed):
    statuses, wall_s = reference
    assert {s for s, _ in statuses.values()} == {"ok", "failed", "oom"}
    camp = F.kill_campaign(tmp_path, seed, statuses, wall_s)
    where = f"moments: {camp.moments}"
    # At least 10 kills that hit a live orchestrator, some while trials.csv / job.json were being written.
    assert camp.kills >= 10, where
    assert any(m.startswith("write:trials.csv") for m in camp.moments), where
    assert any(m.startswith("write:job.json") for m in camp.moments), where
    assert camp.checks == camp.kills + 1
    # No finished result lost or overwritten, no trial's command started twice, none left out.
    assert camp.lost == [], where
    assert camp.reruns == [], where
    # The final table: the same candidates with the same statuses as the uninterrupted sweep.
    assert camp.final == statuses


@pytest.mark.slow
@pytest.mark.parametrize("timing", list(F.FAULT_TIMINGS))
def test_each_failing_trial_gets_its_own_status_and_log_and_the_sweep_goes_on(tmp_path, timing):
    proc, sweep_dir = F.fault_sweep(tmp_path, timing)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out  # the ok trial still gives a recommendation
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "recommended accum=1 split=1" in proc.stdout
    rows = F.table(sweep_dir)
    assert set(rows) == {(a, 1) for a in F.FAULTS}
    for accum, (behaviour, status, phase, reason) in F.FAULTS.items():
        row = rows[(accum, 1)]
        assert (row["status"], row["oom_phase"]) == (status, phase), (behaviour, row)
        assert reason in row["reason"] and "\n" not in row["reason"], (behaviour, row["reason"])
        assert row["log"] and Path(row["log"]).is_file(), (behaviour, row["log"])
        assert f"accum={accum} split=1: {status}" in proc.stdout, behaviour  # each landed, named
    assert "Traceback" in Path(rows[(4, 1)]["log"]).read_text()  # the crash's log has it
    assert "cut off" in rows[(64, 1)]["reason"] and "cut off" in rows[(128, 1)]["reason"]
    # The hung command was stopped at the time limit, not left running behind the sweep.
    assert f"over trial.time_limit_s={F.FAULT_TIME_LIMIT_S}, stopping it" in proc.stdout
    assert F.hang_stopped(sweep_dir)
    # Every trial now has a whole record: the torn ones (the trial's own files) give way to the sweep's ended.json.
    assert {k: v[0] for k, v in F.finished(sweep_dir).items()} == {f"accum{a}_split1": s for a, (_, s, _, _) in F.FAULTS.items()}


def test_a_second_orchestrator_on_the_same_dir_is_refused_and_writes_nothing(tmp_path):
    r = F.second_orchestrator(tmp_path)
    for second in (r["b"], r["b_resume"]):
        assert second.returncode == 2, second.stdout + second.stderr
        assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr
        assert f"another sweep is running in {r['sweep_dir']}" in second.stderr
        assert "choose another hydra.sweep.dir" in second.stderr
        assert second.stdout == ""
    assert r["unchanged"], "the refused sweep changed files in the running sweep's dir"
    code, out, _ = r["a"]
    assert code == 130 and f"resume with: python -m sweep resume={r['sweep_dir']}" in out
    assert r["resumed"].returncode == 0, r["resumed"].stdout + r["resumed"].stderr
    assert {s for s, _ in F.statuses(r["sweep_dir"]).values()} == {"ok"}


def test_a_full_disk_gives_one_clear_line_and_corrupts_nothing(tmp_path):
    try:
        r = F.full_disk(tmp_path)
    except F.Unavailable as e:
        pytest.skip(f"full disk not simulated: {e}")
    failed = r["failed"]
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert failed.stderr.count("\n") == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert f"cannot write the sweep dir {r['sweep_dir']}: No space left on device" in failed.stderr
    hint = shlex.quote(f"resume={r['sweep_dir']}")  # the dir has a space: the pasted command must keep it whole
    assert f"resume with: python -m sweep {hint}" in failed.stderr
    # What was there stayed whole (check_whole parsed trials.csv and every result.json).
    assert r["whole"]["accum1_split1"][0] == "ok"
    # With space again, a resume finishes the sweep; the finished trial is reused, not rerun.
    assert r["resumed"].returncode == 0, r["resumed"].stdout + r["resumed"].stderr
    assert "reusing 1 finished trial(s)" in r["resumed"].stdout
    assert r["after"]["accum1_split1"] == r["whole"]["accum1_split1"]
    assert r["counts"][(1, 1)] == 1
    assert r["final"] == {(1, 1): ("ok", ""), (2, 1): ("ok", ""), (4, 1): ("ok", "")}


def test_a_read_only_sweep_dir_gives_one_clear_line_and_changes_nothing(tmp_path):
    try:
        r = F.read_only_dir(tmp_path)
    except F.Unavailable as e:
        pytest.skip(f"read-only dir not simulated: {e}")
    for proc, where in ((r["resume"], r["sweep_dir"]), (r["fresh"], r["new_dir"])):
        assert proc.returncode == 2, (r["how"], proc.stdout + proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"cannot write the sweep dir {where}" in proc.stderr, proc.stderr
    assert r["unchanged"], f"files changed under {r['how']}"
    assert all(n == 1 for n in r["counts"].values())
    assert not r["new_dir"].exists()


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(F.DAMAGE))
def test_a_damaged_record_found_on_resume_is_reported_and_rerun_not_trusted(tmp_path, damage):
    r = F.torn_record_on_resume(tmp_path, damage)
    assert r["resumed"].returncode == 0, r["resumed"].stdout + r["resumed"].stderr
    assert f"ignoring {r['path']}: {r['said']}" in r["resumed"].stdout
    assert "reusing 1 finished trial(s)" in r["resumed"].stdout
    assert r["counts"] == {(1, 1): 1, (2, 1): 2}  # only the torn one ran again
    assert r["final"] == {(1, 1): ("ok", ""), (2, 1): ("ok", "")}
    assert json.loads(r["path"].read_text())["status"] == "ok"


# -- issue 30: processes and launches (scenarios in tests/support/launch_cases.py) -------------------------


def test_a_stopped_trial_job_is_ended_within_a_bounded_grace(tmp_path):
    from support import launch_cases as L

    r = L.stopped_job(tmp_path)
    assert r["exit"] == 1 and "Traceback" not in r["stderr"], r["stderr"]  # 1: no trial ran ok
    assert r["row"]["status"] == "timeout", r["row"]
    assert r["wall_s"] < 60, r  # SIGCONT, SIGINT, SIGTERM, SIGKILL: seconds past the limit, not 600
    assert r["left_running"] == []


def test_a_killed_trial_job_does_not_leave_its_command_running(tmp_path):
    from support import launch_cases as L

    r = L.killed_job(tmp_path)
    assert r["exit"] == 1 and "Traceback" not in r["stderr"], r["stderr"]  # 1: no trial ran ok
    assert r["row"]["status"] == "failed", r["row"]
    assert r["left_running"] == []  # the command and its setsid child, ended from the trial's record


def test_a_child_that_leaves_the_session_ends_with_its_trial(tmp_path):
    from support import launch_cases as L

    r = L.escaping_child(tmp_path)
    assert r["exit"] == 0 and r["row"]["status"] == "ok", r
    assert r["left_running"] == []


def test_a_reused_pid_of_another_sweeps_controller_is_not_reattached(tmp_path):
    from support import launch_cases as L

    assert L.reused_pid(tmp_path) == {"attached": False, "attached_without_time": False}


def test_a_rerun_reads_only_its_own_attempts_log(tmp_path):
    from support import launch_cases as L

    r = L.rerun_reads_its_own_log(tmp_path)
    assert r["first"].throughput == pytest.approx(1600) and r["rerun"].throughput == pytest.approx(4800)
    assert r["first"].log != r["rerun"].log


@pytest.mark.parametrize("noise_mib, warmup", [(6, False), (8, True)])
def test_figures_after_megabytes_of_output_are_read(tmp_path, noise_mib, warmup):
    from support import launch_cases as L

    result = L.large_log(tmp_path, noise_mib, warmup)["result"]
    assert result.status == "ok" and result.throughput == pytest.approx(1600.0), result
