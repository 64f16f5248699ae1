"""bench_reliability's validity cases for issue 50: the figure is the training's, at the speed a user trains at, and
no assumption (an ordering, a median, which steps are training, a backward-pass count at one pair) is scored as a
measurement. Each case runs the real `python -m sweep` over tests/attack_train.py with set true speeds; a
recommendation other than the true best at 80/100 or more, or a figure 1.5x its truth filed `ok`, is a wrong answer
given with confidence.
"""

from __future__ import annotations

import os
from pathlib import Path

from attack_sweeps import answer as _answer
from attack_sweeps import attack_sweep as _sweep
from attack_sweeps import wrong as _wrong
from reliability_evidence import Case

FULL = ("search=grid", "split=1", "search.drift_check=false", "search.measure_to_decision=false", "search.racing=false")


def _figures_true(rows: dict, truths: dict[tuple[int, int], float]) -> tuple[bool, bool, str]:
    """(every pair ok within 20% of its truth, some pair ok at 1.5x its truth or more: a figure of another thing, the
    pairs' figures as seen)."""
    seen, right, far = [], True, False
    for pair, truth in truths.items():
        row = rows.get(pair, {})
        figure = float(row.get("throughput_samples_per_s") or 0.0)
        right = right and row.get("status") == "ok" and abs(figure / truth - 1) < 0.2
        far = far or (row.get("status") == "ok" and figure >= 1.5 * truth)
        seen.append(f"accum={pair[0]}: {row.get('status')} {figure:.0f} (truth {truth:.0f})")
    return right, far, ", ".join(seen)


def preparation_subprocess(root: Path):
    """A subprocess steps an SGD optimizer 40 times before each trial's training and exits: not the figure."""
    truths = {(1, 1): 800.0, (2, 1): 1000.0}
    _, rows, rec = _sweep(root, ',"--attack=prep_subprocess","--steps=30","--rates=1:1=800,2:1=1000"', "accum=1,2", *FULL)
    right, far, seen = _figures_true(rows, truths)
    return right and rec.get("accum") == 2, f"{seen}; {_answer(rec)}", far or _wrong(rec, (2, 1))


def lr_range_test(root: Path):
    """A learning-rate range test (40 steps, 4x faster, the rate rising 1.3x a step) before the fit: not the figure."""
    truths = {(1, 1): 1000.0, (2, 1): 800.0}
    _, rows, rec = _sweep(root, ',"--attack=lr_find","--steps=30","--rates=1:1=1000,2:1=800"', "accum=1,2", *FULL)
    right, far, seen = _figures_true(rows, truths)
    return right and rec.get("accum") == 1, f"{seen}; {_answer(rec)}", far or _wrong(rec, (1, 1))


def two_losses_without_accumulation(root: Path):
    """Two backward passes a micro-batch and --accum ignored: 2 passes a step at any accum (accum=2 passed alone)."""
    _, rows, rec = _sweep(root, ',"--attack=two_losses_no_accum","--steps=30","--rates=1:1=1000,2:1=900,4:1=800"', "accum=1,2,4", *FULL)
    statuses = {a: rows.get((a, 1), {}).get("status") for a in (1, 2, 4)}
    promised = statuses == {1: "ok", 2: "rejected", 4: "rejected"} and rec.get("accum") == 1
    return promised, f"{statuses}; {_answer(rec)}", _wrong(rec, (1, 1)) or statuses[2] == "ok" or statuses[4] == "ok"


def averaged_losses_accumulation(root: Path):
    """Accumulation by averaging the micro-batches' losses, one backward pass a step: accum=2 is truly 25% faster."""
    truths = {(1, 1): 800.0, (2, 1): 1000.0, (4, 1): 900.0}
    _, rows, rec = _sweep(root, ',"--attack=mean_loss","--steps=30","--rates=1:1=800,2:1=1000,4:1=900"', "accum=1,2,4", *FULL)
    right, far, seen = _figures_true(rows, truths)
    return right and rec.get("accum") == 2, f"{seen}; {_answer(rec)}", far or _wrong(rec, (2, 1))


def slurm_ntasks_inherited(root: Path):
    """A one-process trainer in a sweep started inside a 4-task allocation (SLURM_NTASKS=4 in its environment)."""
    os.environ["SLURM_NTASKS"] = "4"
    try:
        _, rows, rec = _sweep(root, ',"--steps=20","--rates=1:1=1000,2:1=800"', "accum=1,2", *FULL)
    finally:
        del os.environ["SLURM_NTASKS"]
    statuses = {a: rows.get((a, 1), {}).get("status") for a in (1, 2)}
    return statuses == {1: "ok", 2: "ok"} and rec.get("accum") == 1, f"{statuses}; {_answer(rec)}", _wrong(rec, (1, 1))


def stalls_every_third_step(root: Path):
    """accum=1's typical step is the fastest (1200 samples/s) but every third takes 4.2x: 580 over wall time, against
    accum=2's 867 and accum=4's 907 (steady). The median step ranked accum=1 first at 99."""
    _, rows, rec = _sweep(root, ',"--steps=45","--attacks=1:1=stall","--rates=1:1=1200,2:1=867,4:1=907"', "accum=1,2,4", "split=1")
    stalls = rows.get((1, 1), {}).get("stalls") or ""
    promised = rec.get("accum") == 4 and "1 step in 3" in stalls
    return promised, f"accum=1 {rows.get((1, 1), {}).get('status')}: {stalls or 'no stalls mark'}; {_answer(rec)}", _wrong(rec, (4, 1))


def largest_fit_slower(root: Path):
    """accum=1 runs out of memory; accum=2, the largest micro-batch that fits, is slowed near the limit (600 samples/s);
    accum=4 runs 1.4x faster (840). The ordering ranked accum=4 below accum=2: never run, accum=2 at 99."""
    _, rows, rec = _sweep(root, ',"--oom-pairs=1:1","--rates=2:1=600,4:1=840,8:1=500"', "accum=1,2,4,8", "split=1", "search=staircase")
    status = rows.get((4, 1), {}).get("status")
    return rec.get("accum") == 4, f"accum=4 {status}; {_answer(rec)}", _wrong(rec, (4, 1))


ASSUMPTION_CASES = [
    Case("preparation_subprocess_stepping_an_optimizer", "fault", preparation_subprocess),
    Case("learning_rate_range_test_before_the_fit", "fault", lr_range_test),
    Case("two_losses_without_accumulation", "fault", two_losses_without_accumulation),
    Case("accumulation_by_averaged_losses", "fault", averaged_losses_accumulation),
    Case("slurm_ntasks_inherited_from_an_allocation", "fault", slurm_ntasks_inherited),
    Case("stalls_every_third_step", "fault", stalls_every_third_step),
    Case("largest_micro_batch_that_fits_is_slower", "fault", largest_fit_slower),
]
