"""The end-of-sweep drift check (core/drift.py): re-timed pairs that moved more than the assumed
run-to-run noise allows make the sweep score with the noise seen; moves within it change nothing."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from support.drift import retiming_sweep
from support.sweep_run import sweep_process

from sweep.core.confidence import leader_probability
from sweep.core.drift import Retimed, drift
from sweep.core.run_to_run import Repeat
from sweep.core.schema import OK, TrialResult


def pair(accum: int, first: float, again: float, width: float = 0.01, split: int = 1) -> Retimed:
    """A pair measured at `first` and re-timed at `again`, each with a +-width 95% interval."""
    return Retimed(accum, split, Repeat(first, first * (1 - width), first * (1 + width)), Repeat(again, again * (1 - width), again * (1 + width)))


@pytest.mark.parametrize(
    "moves, assumed, exceeded",
    [
        ([(1000, 1005), (900, 897)], 0.07, False),  # well within 7%
        ([(1000, 1250), (900, 700)], 0.07, True),  # the busy 2-core box: +25% and -22%
        ([(1000, 1030), (900, 880)], 0.01, True),  # 3% moves on a machine assumed at 1%
        ([(1000, 1030), (900, 880)], 0.07, False),
        ([(1000, 1000), (900, 900)], 0.01, False),  # no move at all
        ([(1000, 1200)], 0.07, False),  # one pair, one degree of freedom: +20% is not beyond chance at 7%
        ([(1000, 1600)], 0.07, True),
    ],
)
def test_drift_is_called_only_beyond_chance(moves, assumed, exceeded) -> None:
    d = drift([pair(2**i, a, b) for i, (a, b) in enumerate(moves)], assumed)
    assert d is not None and d.exceeded is exceeded and d.dof == len(moves)
    assert d.noise == (min(0.49, max(assumed, d.seen_upper)) if exceeded else assumed)
    assert d.seen <= d.seen_upper
    assert d.line().startswith("drift: " if exceeded else "drift check: ")
    assert len(d.line().splitlines()) == 1
    record = d.record()
    assert record["scored_with"] == round(d.noise, 6) and len(record["retimed"]) == len(moves)
    assert record["retimed"][0]["moved"] == round(moves[0][1] / moves[0][0] - 1, 4)


@pytest.mark.parametrize("retimed", [[], [pair(1, 1000, 0)], [pair(1, 0, 1000)]])
def test_no_drift_verdict_without_a_usable_re_timing(retimed) -> None:
    assert drift(retimed, 0.07) is None


def test_drift_lowers_a_confident_score() -> None:
    """Two pairs 10% apart: confident at 1% noise, not once the re-timing showed 20%."""
    def ok(accum: int, tp: float) -> TrialResult:
        times = [128 / tp * (1 + 0.002 * (i % 3 - 1)) for i in range(12)]
        return TrialResult(accum=accum, split=1, per_device_batch=128 // accum, joint_batch=128 // accum, global_batch_size=128,
                           num_devices=1, status=OK, throughput=tp, throughput_low=tp * 0.99, throughput_high=tp * 1.01,
                           step_times_s=times, steps_measured=12)

    results = {r.key: r for r in (ok(4, 1100.0), ok(8, 1000.0))}
    d = drift([pair(4, 1100, 1400), pair(8, 1000, 800)], assumed=0.01)
    assert d is not None and d.exceeded and d.seen > 0.1
    assumed, seen = leader_probability(results, 0.01), leader_probability(results, d.noise)
    assert assumed > 0.99 and seen < 0.8
    assert math.isclose(d.noise, d.seen_upper) and d.seen_upper > d.seen


def test_the_answer_and_its_score_rest_on_both_timings_of_each_re_timed_pair() -> None:
    """A busy host's default sweep: accum=8 split=1 led on the sweep's figures (998.5 against 845.2), and at the assumed
    7% noise scored 95; the re-timing put them the other way round (827 against 989). On both timings they are a coin
    toss, so the answer is the one ahead on both and its score is no longer confident. A re-timing that agrees keeps it."""
    from sweep.core.confidence import confidence_score
    from sweep.core.drift import pooled, pooled_note
    from sweep.core.ranking import ranked_ok
    from sweep.core.space import enumerate_candidates

    def ok(accum: int, split: int, tp: float) -> TrialResult:
        pdb = 128 // accum
        return TrialResult(accum=accum, split=split, per_device_batch=pdb, joint_batch=pdb // split, global_batch_size=128, num_devices=1,
                           status=OK, throughput=tp, throughput_low=tp * 0.96, throughput_high=tp * 1.04, steps_measured=8)

    results = {r.key: r for r in (ok(8, 1, 998.5), ok(4, 2, 845.2))}
    cands = [c for c in enumerate_candidates(128, 1, [4, 8], [1, 2]) if c.key in results]
    assert confidence_score(cands, results, run_to_run=0.07) >= 90  # the first figures alone: confidently accum=8
    swapped = drift([pair(8, 998.5, 827.0), pair(4, 845.2, 989.0, split=2)], 0.07)
    basis = pooled(results, swapped)
    assert [r.key for r in ranked_ok(basis)] == ["accum4_split2", "accum8_split1"]
    assert basis["accum4_split2"].throughput == pytest.approx(math.sqrt(845.2 * 989.0))
    assert results["accum4_split2"].throughput == 845.2  # the trial's own record is not changed
    assert confidence_score(cands, basis, run_to_run=swapped.noise) <= 60
    note = pooled_note(results, basis, "accum4_split2", "samples/s", swapped)
    # Every figure the ranking used, each true of the numbers it names: it trails on the sweep's timing and leads on the
    # drift check's and on their geometric mean (no claim that it "leads on both timings", nor that the table differs).
    assert note == ("accum=4 split=2 ranks above accum=8 split=1 on both timings of each re-timed pair (their geometric mean): "
                    f"{math.sqrt(845.2 * 989.0):.1f} against {math.sqrt(998.5 * 827.0):.1f} samples/s; "
                    "845.2 against 998.5 on the sweep's timings, 989.0 against 827.0 on the drift check's")
    agreeing = drift([pair(8, 998.5, 990.0), pair(4, 845.2, 850.0, split=2)], 0.07)
    assert ranked_ok(pooled(results, agreeing))[0].key == "accum8_split1"
    assert confidence_score(cands, pooled(results, agreeing), run_to_run=agreeing.noise) >= 90
    assert pooled_note(results, pooled(results, agreeing), "accum8_split1", "samples/s", agreeing) is None
    # A faster pair passed over for its memory (tight) is not the first figures' answer: no note where both agree.
    tight = {**results, "accum2_split1": replace(ok(2, 1, 1500.0), tight=True)}
    assert pooled_note(tight, pooled(tight, agreeing), "accum8_split1", "samples/s", agreeing) is None


def ok_result(accum: int, split: int, tp: float) -> TrialResult:
    times = [128 / tp * (1 + 0.002 * (i % 3 - 1)) for i in range(12)]
    return TrialResult(accum=accum, split=split, per_device_batch=128 // accum, joint_batch=128 // accum // split, global_batch_size=128,
                       num_devices=1, status=OK, throughput=tp, throughput_low=tp * 0.99, throughput_high=tp * 1.01,
                       step_times_s=times, steps_measured=12)


@pytest.mark.parametrize(
    "figures, retimed",
    [
        ({(4, 2): 1755.0, (8, 1): 1535.0}, [(4, 2), (8, 1)]),  # the CPU demo: 14% apart, a busy host could swap them
        ({(1, 1): 1100.0, (2, 1): 550.0}, []),  # twice as fast: no drift could change the answer
        ({(4, 2): 1755.0}, []),  # one pair: nothing to contest
        ({(4, 2): 1755.0, (8, 1): 1535.0, (16, 1): 1500.0}, [(4, 2), (8, 1)]),  # the leader and the runner-up only
    ],
)
def test_pairs_to_retime(figures, retimed) -> None:
    from sweep.orchestration.retime import pairs_to_retime

    results = {r.key: r for r in (ok_result(a, s, tp) for (a, s), tp in figures.items())}
    assert [(r.accum, r.split) for r in pairs_to_retime(results)] == retimed


def test_a_re_timing_stands_only_if_it_ended_after_every_trial(tmp_path) -> None:
    """What a resume's drift check owes (orchestration/retime.py): a pair whose re-timing ended after the sweep's last
    trial record is not re-timed again (a finished sweep's resume launches nothing); one older than a trial (trials ran
    since), cut short (cancelled) or missing is."""
    import os
    from dataclasses import replace
    from types import SimpleNamespace

    from sweep.core.schema import Status, trial_dir
    from sweep.orchestration.retime import _earlier, _newest_record, retime_dir
    from sweep.records import write_result

    first = replace(ok_result(4, 2, 1755.0), fingerprint="f")
    orch = SimpleNamespace(plan=SimpleNamespace(sweep_dir=tmp_path, fingerprint="f"))
    write_result(first, trial_dir(tmp_path, first.key))
    os.utime(trial_dir(tmp_path, first.key) / "result.json", (1000, 1000))
    newest = _newest_record(tmp_path, {first.key: first})
    assert newest == 1000 and _earlier(orch.plan, first, newest) is None  # never re-timed
    again = write_result(replace(first, throughput=1700.0), retime_dir(tmp_path, first.key))
    os.utime(again, (1001, 1001))
    assert _earlier(orch.plan, first, newest).throughput == 1700.0
    os.utime(again, (999, 999))  # re-timed before a trial that ran since: of the old figures
    assert _earlier(orch.plan, first, newest) is None
    write_result(replace(first, throughput=None, status=Status.CANCELLED), retime_dir(tmp_path, first.key))
    assert _earlier(orch.plan, first, newest) is None  # cut short by a Ctrl-C: owed


# A command whose speed changes after the sweep's two trials: the re-timings see split=2 30% slower, split=1 30% faster.
DRIFTING = """
import os, sys
accum, split, gbs = (int(a.split("=")[1]) for a in sys.argv[1:4])
fd = os.open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "starts"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, b"x"); os.close(fd)
starts = os.path.getsize(os.path.join(os.path.dirname(os.path.abspath(__file__)), "starts"))
speed = 1.0 if starts <= 2 else (0.7 if split == 2 else 1.3)
for epoch in range(1, 6):
    tput = 1000.0 * (1 + split / 10) / accum * speed * (1 + 0.001 * epoch)
    print(f"DLL 2024-01-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : {tput:8.2f} | train_avg_took : {gbs / tput:6.2f}", flush=True)
"""


@pytest.mark.e2e
def test_a_sweep_whose_pairs_drift_scores_with_the_noise_seen(tmp_path) -> None:
    import re
    import sys
    from pathlib import Path

    import yaml

    from sweep.analysis.api import load
    from sweep.records import read_trial_record

    script = tmp_path / "drifting_train.py"
    script.write_text(DRIFTING)
    argv = f'workload.argv=["{sys.executable}","{script}","--accum={{accum}}","--split={{split}}","--global_batch_size={{global_batch_size}}"]'
    sweep_dir = tmp_path / "s"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "HOME": str(tmp_path)}
    proc = sweep_process(["workload=command", argv, "search=grid", "accum=1", "split=1,2", "search.racing=false",
                          "machine.run_to_run_noise=0.01", "trial.time_limit_s=60", f"hydra.sweep.dir={sweep_dir}"], tmp_path, env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "starts").read_text() == "xxxx"  # two trials, two re-timings
    before_check = proc.stdout.split("drift check: re-timing")[0]
    assumed_score = int(re.findall(r"confidence (\d+)/100", before_check)[-1])
    rec = yaml.safe_load((sweep_dir / "recommendation.yaml").read_text())
    assert rec["drift"]["exceeded"] is True and rec["drift"]["seen_noise"] > 0.1
    assert rec["run_to_run_noise"] == pytest.approx(rec["drift"]["scored_with"], abs=1e-6)
    assert [(p["accum"], p["split"], round(p["moved"], 2)) for p in rec["drift"]["retimed"]] == [(1, 2, -0.3), (1, 1, 0.3)]
    assert rec["confidence"] < assumed_score  # the score on the assumed 1% was higher
    # The re-timing swapped the two: on both timings of each (1200 and 840 against 1100 and 1430) split=1 ranks first,
    # and the answer and the table both rest on both (core/drift.pooled); the note names each figure.
    assert (rec["accum"], rec["split"]) == (1, 1), rec
    assert rec["drift_note"].startswith("accum=1 split=1 ranks above accum=1 split=2 on both timings of each re-timed pair"), rec
    assert re.search(r"1,?10\d\.\d against 1,?20\d\.\d on the sweep's timings, 1,?4\d\d\.\d against 8\d\d\.\d on the drift check's",
                     rec["drift_note"]), rec
    assert rec["drift_note"] in proc.stdout and re.search(r"^recommended accum=1 split=1: ", proc.stdout, re.M), proc.stdout
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("drift")]
    assert "above the 1.0% assumed" in line
    # The re-timings sit beside the trials and replace nothing: trials.csv keeps the first figures.
    again = read_trial_record(sweep_dir / "retime" / "accum1_split2")
    assert again is not None and again.throughput == pytest.approx(1200 * 0.7, rel=0.01)
    df = load(sweep_dir)
    assert df.loc[df["split"] == 2, "throughput_samples_per_s"].item() == pytest.approx(1200, rel=0.01)
    assert df.loc[df["split"] == 2, "retimed_throughput_samples_per_s"].item() == pytest.approx(1200 * 0.7, rel=0.01)
    assert len(df) == 2
    # ... and ranks by both, as the recommendation does: its rank 1 is the answer.
    assert df.loc[df["rank"] == 1, ["accum", "split"]].values.tolist() == [[1, 1]]


def _until(what, done, run, out, timeout_s: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not done():
        if run.poll() is not None or time.monotonic() > deadline:
            run.kill()
            pytest.fail(f"{what} did not happen: rc={run.poll()}\n{out.read_text() if out.exists() else ''}")
        time.sleep(0.05)


@pytest.mark.e2e
def test_a_sweep_killed_in_its_drift_check_resumes_it_and_ends_the_re_timing(tmp_path) -> None:
    """kill -9 while the re-timing runs: its job outlives the sweep. The resume re-attaches to it (not a second
    re-timing of that pair), waits for it, re-times the other pair and prints the drift line; nothing is left running."""
    import json
    import re

    import psutil
    from support.interrupts import no_trial_left
    from support.sweep_run import background_sweep

    args, env, sweep_dir = retiming_sweep(tmp_path)
    first_out, resume_out = tmp_path / "first.out", tmp_path / "resume.out"
    first = background_sweep(args, tmp_path, env, first_out)
    _until("the re-timing", (tmp_path / "retiming").exists, first, first_out)
    first.kill()
    first.wait(30)
    assert psutil.pid_exists(int((tmp_path / "retiming").read_text()))  # the re-timing's command outlived the sweep
    resumed = background_sweep([f"resume={sweep_dir}"], tmp_path, env, resume_out)
    _until("the re-attach", lambda: "re-attached to running re-timing job" in resume_out.read_text(), resumed, resume_out)
    (tmp_path / "go").touch()
    code = resumed.wait(120)
    out = resume_out.read_text()
    print(out)
    assert code == 0, out
    assert re.search(r"re-attached to running re-timing job \d+ for accum=1 split=2 \(an earlier run's drift check\)", out), out
    assert re.search(r"drift check: re-timing accum=1 split=2 \(re-attached job \d+\) and accum=1 split=1 \(", out), out
    (line,) = [x for x in out.splitlines() if x.startswith(("drift check: re-timed", "drift: re-timed"))]
    assert "accum=1 split=2" in line and "accum=1 split=1" in line
    assert (tmp_path / "starts").read_text() == "xxxx"  # two trials, two re-timings: the re-attached one ran once
    assert json.loads((sweep_dir / "sweep.json").read_text())["state"] == "done"
    assert no_trial_left(sweep_dir, timeout_s=5)


@pytest.mark.e2e
def test_a_resume_that_runs_a_trial_again_ends_the_left_re_timing_first_and_re_times_after_it(tmp_path) -> None:
    """kill -9 while the re-timing runs, then one trial's dir is lost: the resume runs that trial again. The left
    re-timing would share the trial's device, so the resume ends it first (saying so), runs the trial, and only
    then re-times both pairs: a re-timing that did not end after every trial is not drift evidence."""
    import json
    import shutil

    import psutil
    from support.interrupts import no_trial_left
    from support.sweep_run import background_sweep

    args, env, sweep_dir = retiming_sweep(tmp_path)
    first_out, resume_out = tmp_path / "first.out", tmp_path / "resume.out"
    first = background_sweep(args, tmp_path, env, first_out)
    _until("the re-timing", (tmp_path / "retiming").exists, first, first_out)
    first.kill()
    first.wait(30)
    left = psutil.Process(int((tmp_path / "retiming").read_text()))  # the re-timing's command outlived the sweep
    shutil.rmtree(sweep_dir / "trials" / "accum1_split1")
    resumed = background_sweep([f"resume={sweep_dir}"], tmp_path, env, resume_out)
    _until("the left re-timing's end", lambda: "ending re-timing job" in resume_out.read_text(), resumed, resume_out)
    (tmp_path / "go").touch()
    code = resumed.wait(120)
    out = resume_out.read_text()
    print(out)
    assert code == 0, out
    assert not left.is_running() or left.status() == psutil.STATUS_ZOMBIE  # ended by the resume, not waited for
    lines = out.splitlines()
    ending = next(i for i, x in enumerate(lines) if "ending re-timing job" in x)
    assert "of accum=1 split=2: trials run again first, and the drift check re-times after them" in lines[ending], lines[ending]
    rerun = next(i for i, x in enumerate(lines) if "accum=1 split=1: ok" in x)
    check = next(i for i, x in enumerate(lines) if "drift check: re-timing accum=1 split=2 and accum=1 split=1 (" in x)
    assert ending < rerun < check, out  # ended, then the trial, then a fresh re-timing of both
    assert [x for x in lines if x.startswith(("drift check: re-timed", "drift: re-timed"))], out
    assert (tmp_path / "starts").read_text() == "x" * 6  # 2 trials, the killed re-timing; the trial again, 2 re-timings
    assert json.loads((sweep_dir / "sweep.json").read_text())["state"] == "done"
    assert no_trial_left(sweep_dir, timeout_s=5)


@pytest.mark.e2e
def test_ctrl_c_in_the_drift_check_exits_130_says_what_was_cut_short_and_the_resume_finishes_it(tmp_path) -> None:
    import json
    import os
    import signal
    import subprocess
    import sys

    from support.interrupts import hint, no_trial_left
    from support.sweep_run import run_sweep

    args, env, sweep_dir = retiming_sweep(tmp_path)
    out_file = tmp_path / "first.out"
    with out_file.open("w") as stream:  # as a terminal runs it: its own session, Ctrl-C to the whole group
        proc = subprocess.Popen([sys.executable, "-m", "sweep", *args], cwd=tmp_path, env=env, stdout=stream, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    _until("the re-timing", (tmp_path / "retiming").exists, proc, out_file)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(60) == 130
    out = out_file.read_text()
    print(out)
    assert "Traceback" not in out, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("interrupted: the drift check was cut short after every trial finished (re-timing of accum=1 split=2 "
                           "stopped, accum=1 split=1 not re-timed yet); finished results are kept in "), last
    assert hint(sweep_dir) in last
    assert json.loads((sweep_dir / "sweep.json").read_text())["state"] == "interrupted"
    assert no_trial_left(sweep_dir, timeout_s=5)
    (tmp_path / "go").touch()
    resumed = run_sweep([f"resume={sweep_dir}"], tmp_path, env=env, timeout=120)
    print(resumed.stdout)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "drift check: re-timing accum=1 split=2 and accum=1 split=1 (" in resumed.stdout
    assert [x for x in resumed.stdout.splitlines() if x.startswith(("drift check: re-timed", "drift: re-timed"))]
    assert (tmp_path / "starts").read_text() == "xxxxx"  # the stopped re-timing, then both again
