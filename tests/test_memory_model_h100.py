"""No confident wrong memory predictions on real trials (issue 31): the H100 sweeps of the built-in
RNN-T at caiman-asr's sizes (tests/data/h100/, copied from the recorded runs), replayed one trial
at a time in the order the sweep ran them. No pair that ran ok may ever be predicted to OOM with
P >= 0.95 by the fit of the trials before it.

The files list trials by key; the run order is the default staircase's, reconstructed by running
the staircase of the code that made the recordings (with its memory model, on one device) on the
recorded results: it reproduces the records' own account (at 24 GiB, accum=1 split=32 and split=64
predicted to OOM at 34.8 and 31.5 GiB, then accum=1 split=64 run at 13.7 GiB).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweep.core.memory_model import OOM_PROBABILITY, fit_from_results, p_exceeds
from sweep.core.schema import OK, TrialResult
from sweep.core.space import enumerate_candidates
from sweep.core.strategies import make_strategy

DATA = Path(__file__).parent / "data" / "h100"
GLOBAL_BATCH, DEVICES = 128, 1

RUN_ORDER = {
    "base80": [(8, 1), (2, 1), (4, 1), (2, 2), (1, 4), (1, 8)],
    "large80": [(8, 1), (2, 1), (4, 1), (4, 2), (2, 4), (1, 8), (1, 16)],
    "base24": [(8, 1), (32, 1), (16, 1), (8, 2), (4, 4), (2, 8), (2, 16), (1, 64)],
}


def recorded(name: str) -> dict[str, TrialResult]:
    trials = json.loads((DATA / f"{name}.json").read_text())["trials"]
    return {
        f"accum{t['accum']}_split{t['split']}": TrialResult(global_batch_size=GLOBAL_BATCH, num_devices=DEVICES, **t)
        for t in trials
    }


def confident_wrong(done: list[TrialResult], records: dict[str, TrialResult], capacity: float) -> dict[str, float]:
    """Pairs that ran ok in the records, not run yet, that the fit of `done` puts over capacity with P >= 0.95."""
    fit = fit_from_results(done, capacity)
    ran = {r.key for r in done}
    wrong = {}
    for key, r in records.items():
        if r.status == OK and key not in ran:
            p = p_exceeds(fit, r, capacity)
            if p is not None and p >= OOM_PROBABILITY:
                wrong[key] = p
    return wrong


@pytest.mark.parametrize("name", sorted(RUN_ORDER))
def test_no_pair_that_fit_is_ever_predicted_to_oom(name):
    records = recorded(name)
    assert {f"accum{a}_split{s}" for a, s in RUN_ORDER[name]} == set(records)  # every recorded trial, once
    capacity = next(iter(records.values())).capacity_gib
    done: list[TrialResult] = []
    for accum, split in RUN_ORDER[name]:
        assert confident_wrong(done, records, capacity) == {}, f"after {[r.key for r in done]}"
        done.append(records[f"accum{accum}_split{split}"])
    assert confident_wrong(done, records, capacity) == {}


@pytest.mark.parametrize("name", sorted(RUN_ORDER))
def test_the_staircase_replayed_on_the_records_never_skips_a_pair_that_fit(name):
    """The search itself, fed the recorded results in the order it asks for them, until it asks for a
    pair the records lack (at 24 GiB the sweep was cut short)."""
    records = recorded(name)
    capacity = next(iter(records.values())).capacity_gib
    strategy = make_strategy("staircase", enumerate_candidates(GLOBAL_BATCH, DEVICES), capacity_gib=capacity)
    finished: dict[str, TrialResult] = {}
    while True:
        skipped = strategy.predicted_ooms(finished)
        assert not [k for k in skipped if k in records and records[k].status == OK], skipped
        proposal = strategy.propose(finished, ())
        if proposal.done or not proposal.candidates or proposal.candidates[0].key not in records:
            break
        key = proposal.candidates[0].key
        finished[key] = records[key]
    assert len(finished) >= 6
