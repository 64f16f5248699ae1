"""Racing and the memory model's verdicts in the orchestrator (orchestration/racing.py), and the
trials' side of the protocol: adaptive step counts and stop.json honoured between steps."""

from __future__ import annotations

import csv
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from support.results import trial_result

from sweep.core.config import TrialConfig
from sweep.core.decision import losers
from sweep.core.decision import race_leader as leader
from sweep.core.measure import PROGRESS_FILE, STOP_FILE, progress_record
from sweep.core.ranking import SweepMeta
from sweep.core.schema import RESULT_FILE, Status, TrialResult, trial_dir
from sweep.core.space import enumerate_candidates
from sweep.core.strategies import make_strategy
from sweep.orchestration.racing import PREDICTED_FILE, Predictions, Racing
from sweep.records import progress_step_times, read_result, stop_requested

GBS = 64


def ok(accum: int, times: list[float], split: int = 1, peak: float | None = None) -> TrialResult:
    return trial_result(accum, split, gbs=GBS, status=Status.OK, times=times, peak_mem_gib=peak)


STEADY = [0.010, 0.0101, 0.0099, 0.010, 0.0102, 0.0098, 0.010, 0.0100]  # ~6400 samples/s, tight
LEADER = {"accum1_split1": ok(1, STEADY)}


# (name, the running trial's step times so far, stopped?)
RACES = [
    ("ten times slower, six steps", [0.1, 0.12, 0.08, 0.1, 0.12, 0.08], True),
    ("ten times slower, five steps: too few for a 95% interval", [0.1, 0.12, 0.08, 0.1, 0.12], False),
    ("as fast as the leader", STEADY, False),
    ("overlapping: within the margin", [0.0102, 0.0103, 0.0101, 0.0102, 0.0103, 0.0101], False),
    # Issue 50: a slow step counts in the wall-time figure, and widens its interval into the leader's: not stopped on it.
    ("one outlier step reaches the leader's interval", [0.0101, 0.0100, 0.0101, 0.0100, 0.0101, 0.03], False),
    ("no steps yet", [], False),
]


@pytest.mark.parametrize("name, times, stopped", RACES, ids=[r[0] for r in RACES])
def test_a_running_trial_is_stopped_only_when_its_interval_lies_below_the_leaders(name, times, stopped):
    out = losers({"accum2_split1": times}, LEADER, GBS)
    assert ("accum2_split1" in out) is stopped
    if stopped:
        assert "cannot beat the leader accum1_split1" in out["accum2_split1"] and "95% upper bound" in out["accum2_split1"]


def test_no_leader_no_race():
    assert leader({}) is None
    assert losers({"accum2_split1": [1.0] * 8}, {}, GBS) == {}
    # An ok figure without step times (one epoch average) cannot lead a race.
    flat = replace(LEADER["accum1_split1"], step_times_s=[])
    assert losers({"accum2_split1": [1.0] * 8}, {"accum1_split1": flat}, GBS) == {}


def test_a_tight_pair_never_leads_a_race():
    """It is not what the sweep recommends: a slower roomy pair may still be the answer."""
    tight = replace(LEADER["accum1_split1"], tight=True)
    slow = [0.1, 0.12, 0.08, 0.1, 0.12, 0.08]
    assert losers({"accum2_split1": slow}, {"accum1_split1": tight}, GBS) == {}
    roomy = ok(4, [0.02] * 8)
    results = {"accum1_split1": tight, roomy.key: roomy}
    assert leader(results) is roomy
    assert "cannot beat the leader accum4_split1" in losers({"accum2_split1": slow}, results, GBS)["accum2_split1"]


def test_racing_writes_stop_once_and_a_resubmitted_trial_starts_clean(tmp_path):
    tdir = trial_dir(tmp_path, "accum2_split1")
    tdir.mkdir(parents=True)
    (tdir / PROGRESS_FILE).write_text(progress_record([0.1, 0.12, 0.08, 0.1, 0.12, 0.08]))
    racing = Racing(tmp_path, GBS)
    assert stop_requested(tdir) is None
    told = racing.stop_losers(["accum2_split1"], LEADER)
    assert list(told) == ["accum2_split1"]
    assert stop_requested(tdir) == told["accum2_split1"] == json.loads((tdir / STOP_FILE).read_text())["reason"]
    assert racing.stop_losers(["accum2_split1"], LEADER) == {}  # told once
    racing.forget("accum2_split1")
    assert stop_requested(tdir) is None and not (tdir / STOP_FILE).exists()


@pytest.mark.parametrize(
    "text, expected",
    [
        (None, []),
        ("not json", []),
        ('{"step_times_s": "x"}', []),
        ('{"step_times_s": [0.1, -1, true, "a", 0.2]}', [0.1, 0.2]),
    ],
)
def test_progress_step_times_reads_only_positive_numbers(tmp_path, text, expected):
    if text is not None:
        (tmp_path / PROGRESS_FILE).write_text(text)
    assert progress_step_times(tmp_path) == expected


# --- predicted OOMs: the orchestrator's own record, never result.json --------------------------


def test_predicted_ooms_are_recorded_logged_and_dropped_when_the_fit_changes(tmp_path):
    cands = enumerate_candidates(GBS, 1)
    meta = SweepMeta(sweep_id="s", machine="m", workload="w", global_batch_size=GBS, num_devices=1)
    strategy = make_strategy("grid", cands, capacity_gib=1.0)
    # Peaks 0.1 + 0.02 x per-device batch: the model puts per_device_batch 64 (1.38 GiB) far above 1 GiB.
    measured = {r.key: r for r in (ok(a, STEADY, peak=0.1 + 0.02 * (GBS // a)) for a in (2, 4, 8, 16))}
    predictions = Predictions(tmp_path, meta, {c.key: c for c in cands}, 1.0)
    lines = predictions.update(strategy, measured, 0)
    assert "accum1_split1" in predictions.records
    record = predictions.records["accum1_split1"]
    assert record.status == Status.PREDICTED_OOM and record.capacity_gib == 1.0
    assert record.peak_mem_gib == pytest.approx(1.38, rel=0.02)
    assert any(line.startswith("accum=1 split=1: predicted_oom, not launched: predicted OOM: 1.38 GiB > 1 GiB") for line in lines)
    path = trial_dir(tmp_path, "accum1_split1")
    saved = json.loads((path / PREDICTED_FILE).read_text())
    assert (saved["status"], saved["peak_mem_gib"], saved["capacity_gib"]) == ("predicted_oom", record.peak_mem_gib, 1.0)
    assert not (path / RESULT_FILE).exists()
    assert predictions.p_exceeds["accum1_split1"] >= 0.95
    assert predictions.update(strategy, measured, 0) == []  # nothing new: no refit, no lines
    # The pair ran after all (trust_memory_model=false elsewhere) and fitted: the prediction goes.
    ran = {**measured, "accum1_split1": ok(1, STEADY, peak=0.9)}
    lines = predictions.update(make_strategy("grid", cands, capacity_gib=1.0), ran, 0)
    assert "accum1_split1" not in predictions.records and not (path / PREDICTED_FILE).exists()


def test_trust_memory_model_false_predicts_nothing(tmp_path):
    cands = enumerate_candidates(GBS, 1)
    meta = SweepMeta(sweep_id="s", machine="m", workload="w", global_batch_size=GBS, num_devices=1)
    measured = {r.key: r for r in (ok(a, STEADY, peak=0.1 + 0.02 * (GBS // a)) for a in (2, 4, 8, 16))}
    predictions = Predictions(tmp_path, meta, {c.key: c for c in cands}, 1.0)
    assert predictions.update(make_strategy("grid", cands, capacity_gib=1.0, trust_memory_model=False), measured, 0) == []
    assert predictions.records == {}


# --- the built-in trial: adaptive step count, and stop.json between steps ------------------------


def test_builtin_trial_measures_at_least_min_and_at_most_the_cap(tmp_path):
    from support.trials import make_spec

    from sweep.workloads.rnnt.runner import run_trial

    spec = make_spec(tmp_path)
    spec = replace(spec, trial=TrialConfig(warmup_steps=1, measure_steps=6, max_measure_steps=9, target_precision=0.49))
    res = run_trial(spec)
    # target 49%: six steps (the least a 95% interval needs) are enough unless the CPU is very noisy.
    timed = res.steps_measured + res.transient_steps  # a busy box's slow leading steps are timed but left out
    assert res.status == Status.OK and 6 <= timed <= 9 and res.steps_measured == len(res.step_times_s)
    assert progress_step_times(spec.trial_dir) == pytest.approx(res.step_times_s, abs=1e-6)


def test_builtin_trial_stops_when_told_and_keeps_its_partial_measurement(tmp_path):
    from support.trials import make_spec

    from sweep.workloads.rnnt.runner import run_trial

    spec = make_spec(tmp_path)
    spec = replace(spec, trial=TrialConfig(warmup_steps=1, measure_steps=8, max_measure_steps=8))
    Path(spec.trial_dir).mkdir(parents=True)
    (Path(spec.trial_dir) / STOP_FILE).write_text(json.dumps({"reason": "cannot beat the leader accum1_split1"}))
    res = run_trial(spec)
    assert res.status == Status.OK and res.stopped_early == "cannot beat the leader accum1_split1"
    assert res.steps_measured == 1 and res.throughput and res.throughput_low <= res.throughput <= res.throughput_high
    assert read_result(Path(spec.trial_dir) / RESULT_FILE).stopped_early == res.stopped_early


# --- end to end: a slow command trial is raced out by a faster one that already finished ----------

RACE_SCRIPT = '''
"""nanoGPT-style log: accum=1 is fast and steady and ends; other accums are 10x slower, noisy, and never end."""
import sys, time
accum = int(sys.argv[1].split("=")[1])
it = 0
while accum != 1 or it < 40:
    jitter = (1.2 if it % 2 else 0.8) if accum != 1 else 1 + 0.001 * (it % 3)
    print(f"iter {it}: loss 1.0000, time {(10.0 if accum == 1 else 100.0) * jitter:.2f}ms, mfu 30.00%", flush=True)
    time.sleep(0.05 if accum == 1 else 0.25)
    it += 1
'''


def race_sweep(tmp_path: Path, *extra: str):
    """A real sweep of RACE_SCRIPT's fast accum=1 and slow accum=2 side by side: (the process, its sweep dir)."""
    from support.sweep_run import run_sweep

    script = tmp_path / "race_train.py"
    script.write_text(RACE_SCRIPT)
    sweep_dir = tmp_path / "s"
    argv = f'["{sys.executable}","{script}","--accum={{accum}}"]'
    args = [
        f"hydra.sweep.dir={sweep_dir}", "workload=command", f"workload.argv={argv}", "workload.parser.type=nanogpt",
        f"global_batch_size={GBS}", "search=grid", "accum=1,2", "split=1", "max_in_flight=2", "trial.time_limit_s=120", "live=false",
        *extra,
    ]
    proc = run_sweep(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, sweep_dir


@pytest.mark.e2e
def test_a_command_trial_that_cannot_win_is_stopped_and_counts_as_ok(tmp_path):
    # Racing's rule alone: measuring to the decision (the default) stops it sooner, on the ordering (below).
    proc, sweep_dir = race_sweep(tmp_path, "search.measure_to_decision=false")
    rows = {int(r["accum"]): r for r in csv.DictReader((sweep_dir / "trials.csv").open())}
    assert rows[1]["status"] == rows[2]["status"] == "ok"
    assert rows[2]["reason"].startswith("stopped early: cannot beat the leader accum1_split1")
    assert "timed steps" not in rows[2]["reason"]  # the steps column says how many: one count, not two
    # The slow script never ends by itself: only the stop request ended it, long before the time limit.
    slow = read_result(trial_dir(sweep_dir, "accum2_split1") / RESULT_FILE)
    assert slow.stopped_early and slow.wall_s < 60 and slow.steps_measured >= 6
    assert "accum=2 split=1: stopping it, cannot beat the leader accum1_split1" in proc.stdout
    assert re.search(r"recommended .*\(accum=1\): ", proc.stdout)  # 1-D (the command has no {split}): the flags, then the pair
    # Adaptive measurement stopped the fast one too: it prints 40 steps, far more than it needed.
    fast = read_result(trial_dir(sweep_dir, "accum1_split1") / RESULT_FILE)
    assert not fast.stopped_early and 6 <= fast.steps_measured < 39


@pytest.mark.e2e
def test_measured_to_the_decision_the_outranked_trial_stops_after_its_first_step(tmp_path):
    """The default: accum=2 has no bigger micro-batch than accum=1 and its first step agrees: it cannot be the answer."""
    proc, sweep_dir = race_sweep(tmp_path)
    rows = {int(r["accum"]): r for r in csv.DictReader((sweep_dir / "trials.csv").open())}
    assert rows[1]["status"] == rows[2]["status"] == "ok"
    slow = read_result(trial_dir(sweep_dir, "accum2_split1") / RESULT_FILE)
    assert "outranked by accum1_split1" in slow.stopped_early and slow.steps_measured >= 1 and slow.wall_s < 60
    assert re.search(r"recommended .*\(accum=1\): ", proc.stdout)  # 1-D (the command has no {split}): the flags, then the pair


@pytest.mark.e2e
def test_with_racing_off_the_trial_that_cannot_win_measures_to_its_own_end(tmp_path):
    """search.racing=false: repeats for sweep.run_to_run need whole measurements, not ones racing cut short."""
    proc, sweep_dir = race_sweep(tmp_path, "trial.max_measure_steps=12", "search.racing=false")
    slow = read_result(trial_dir(sweep_dir, "accum2_split1") / RESULT_FILE)
    # Its alternating +-20% steps never reach +-2%: adaptive measurement ran it to the cap, and nothing raced it.
    assert slow.status == Status.OK and not slow.stopped_early and slow.steps_measured == 12
    assert "stopping it" not in proc.stdout and not (trial_dir(sweep_dir, "accum2_split1") / STOP_FILE).exists()
    assert re.search(r"recommended .*\(accum=1\): ", proc.stdout)  # 1-D (the command has no {split}): the flags, then the pair


def test_reruns_in_full_move_the_provisional_record_aside_once(tmp_path):
    """orchestration/remeasure.py: the provisional pair the recommendation would take is readied to run again, its
    record kept as provisional.json, its progress cleared; never once it runs in full, never in screening."""
    from types import SimpleNamespace

    from sweep.orchestration.remeasure import PROVISIONAL_FILE, reruns_in_full
    from sweep.records import write_progress, write_result

    first = replace(ok(2, [0.01]), stopped_early="provisional: the search's first pair")
    tdir = trial_dir(tmp_path, first.key)
    tdir.mkdir(parents=True)
    write_result(first, tdir)
    write_progress(tdir, progress_record([0.01]))
    by_key = {c.key: c for c in enumerate_candidates(GBS, 1, None, None) if c.valid}
    results = {first.key: first}

    def plan(nominates_only: bool) -> SimpleNamespace:
        return SimpleNamespace(nominates_only=nominates_only, sweep_dir=tmp_path, meta=SweepMeta("s", "cpu", "command", GBS, 1))

    assert reruns_in_full(plan(nominates_only=True), results, by_key, set()) == []  # a screening row is never the answer
    [(key, line)] = reruns_in_full(plan(nominates_only=False), results, by_key, set())
    assert key == first.key and "running it again in full (the provisional record is kept as provisional.json)" in line
    assert not (tdir / RESULT_FILE).exists() and read_result(tdir / PROVISIONAL_FILE) == first
    assert not (tdir / PROGRESS_FILE).exists()
    # Until the re-run lands the provisional record stands (the strategy sees the pair as run); once it runs in full,
    # it is not readied again.
    assert results[first.key] is first and reruns_in_full(plan(nominates_only=False), results, by_key, {first.key}) == []


FIRST_PAIR_WINS_SCRIPT = '''
"""nanoGPT-style log: accum=1 runs out of memory at once; accum=2 is steady and ends; accum=4 is slower."""
import sys, time
accum = int(sys.argv[1].split("=")[1])
if accum == 1:
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr, flush=True)
    sys.exit(1)
for it in range(40):
    print(f"iter {it}: loss 1.0000, time {10.0 * accum * (1 + 0.001 * (it % 3)):.2f}ms, mfu 30.00%", flush=True)
    time.sleep(0.3)  # slower than the orchestrator's poll: a stop request lands within a step or two
'''


@pytest.mark.e2e
def test_a_provisional_first_pair_that_is_the_answer_is_run_again_in_full(tmp_path):
    """The staircase's first pair, accum=2, stops provisionally after one timed step (nothing measured yet); accum=1
    runs out of memory, accum=4 is outranked, so the search ends with the provisional pair first: it runs again in
    its own dir, in full, and the recommendation rests on that run (orchestration/remeasure.py)."""
    from support.sweep_run import run_sweep

    from sweep.orchestration.remeasure import PROVISIONAL_FILE

    script = tmp_path / "first_wins.py"
    script.write_text(FIRST_PAIR_WINS_SCRIPT)
    sweep_dir = tmp_path / "s"
    argv = f'["{sys.executable}","{script}","--accum={{accum}}"]'
    proc = run_sweep(
        [f"hydra.sweep.dir={sweep_dir}", "workload=command", f"workload.argv={argv}", "workload.parser.type=nanogpt", f"global_batch_size={GBS}",
         "search=staircase", "accum=1,2,4", "split=1", "max_in_flight=1", "trial.time_limit_s=120", "live=false"],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tdir = trial_dir(sweep_dir, "accum2_split1")
    first = read_result(tdir / PROVISIONAL_FILE)
    # Told after its first timed step; it stops at the step under way when it reads the request (a box under a load of
    # 5 once read it after six).
    again = read_result(tdir / RESULT_FILE)
    assert first.stopped_early.startswith("provisional") and first.steps_measured < again.steps_measured
    assert again.status == Status.OK and not again.stopped_early.startswith("provisional") and again.steps_measured >= 6
    assert re.search(r"accum=2 split=1: stopped provisionally after \d timed step\(s\) .* running it again in full", proc.stdout)
    rows = {int(r["accum"]): r for r in csv.DictReader((sweep_dir / "trials.csv").open())}
    assert rows[1]["status"] == "oom" and rows[2]["status"] == "ok" and int(rows[2]["steps_measured"]) == again.steps_measured
    assert re.search(r"recommended .*\(accum=2\): ", proc.stdout)


STEADY_SCRIPT = '''
import time
for it in range(12):
    print(f"iter {it}: loss 1.0000, time {10.0 * (1 + 0.001 * (it % 3)):.2f}ms, mfu 30.00%", flush=True)
    time.sleep(0.02)
'''


@pytest.mark.slow
@pytest.mark.e2e
def test_pairs_predicted_to_oom_are_not_launched_and_shown_with_peak_and_capacity(tmp_path):
    """Nine finished trials (as a resumed sweep finds them) with peaks 0.1 + 0.02 p + 0.01 j + 0.05 (s > 1) GiB;
    capacity 1 GiB: the accum=1 pairs (>= 1.6 GiB) and accum=2 split=1 (1.06 GiB) are not launched."""
    from support.sweep_run import run_sweep

    from sweep.records import write_result

    sweep_dir = tmp_path / "s"
    script = tmp_path / "steady.py"
    script.write_text(STEADY_SCRIPT)
    # The batch placeholders, as every command must use (the script ignores them); {split} makes the sweep 2-D.
    argv = f'["{sys.executable}","{script}","--accum={{accum}}","--split={{split}}"]'
    settings = [
        "workload=command", f"workload.argv={argv}", "workload.parser.type=nanogpt", f"global_batch_size={GBS}", "search=grid",
        "machine.memory_gib=1.0", "trial.time_limit_s=60", "live=false",
    ]
    # One real trial first, so sweep.json holds the fingerprint the stand-in records must carry to be adopted.
    first = run_sweep([f"hydra.sweep.dir={sweep_dir}", *settings, "accum=16", "split=1"], cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    fingerprint = json.loads((sweep_dir / "sweep.json").read_text())["fingerprint"]
    # Every pair that fits has a record too: a command trial's real (host) peak would refit the model.
    for accum, split in [(a, s) for a in (4, 8, 16) for s in (1, 2, 4)] + [(2, 2), (2, 4)]:
        p = GBS // accum
        res = replace(ok(accum, STEADY, split=split), peak_mem_gib=0.1 + 0.02 * p + 0.01 * (p // split) + (0.05 if split > 1 else 0.0),
                      fingerprint=fingerprint)
        tdir = trial_dir(sweep_dir, res.key)
        tdir.mkdir(parents=True, exist_ok=True)
        write_result(res, tdir)
    common = [*settings, "accum=1,2,4,8,16", "split=1,2,4"]
    proc = run_sweep([f"hydra.sweep.dir={sweep_dir}", *common], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {(int(r["accum"]), int(r["split"])): r for r in csv.DictReader((sweep_dir / "trials.csv").open())}
    doomed = [(1, 1), (1, 2), (1, 4), (2, 1)]
    for pair in doomed:
        row = rows[pair]
        assert row["status"] == "predicted_oom" and not row["wall_s"], row
        assert row["reason"].startswith("predicted OOM: ") and "> 1 GiB" in row["reason"]
        assert float(row["peak_mem_gib"]) > 1.0
        assert f"accum={pair[0]} split={pair[1]}: predicted_oom, not launched: predicted OOM:" in proc.stdout
        saved = json.loads((trial_dir(sweep_dir, f"accum{pair[0]}_split{pair[1]}") / PREDICTED_FILE).read_text())
        assert saved["capacity_gib"] == 1.0 and saved["status"] == "predicted_oom"
        assert not (trial_dir(sweep_dir, f"accum{pair[0]}_split{pair[1]}") / RESULT_FILE).exists()
    assert rows[(2, 2)]["status"] == rows[(2, 4)]["status"] == "ok"  # predicted to fit: launched

    # search.trust_memory_model=false: the same sweep launches them (the command does not really OOM here).
    off_dir = tmp_path / "off"
    for tdir in (sweep_dir / "trials").iterdir():
        if (tdir / RESULT_FILE).exists() and tdir.name.startswith(("accum4", "accum8", "accum16")):
            (off_dir / "trials" / tdir.name).mkdir(parents=True)
            (off_dir / "trials" / tdir.name / RESULT_FILE).write_text((tdir / RESULT_FILE).read_text())
    proc = run_sweep([f"hydra.sweep.dir={off_dir}", *common, "search.trust_memory_model=false"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {(int(r["accum"]), int(r["split"])): r for r in csv.DictReader((off_dir / "trials.csv").open())}
    assert all(rows[pair]["status"] == "ok" for pair in doomed) and "predicted_oom" not in proc.stdout
