"""The end-of-sweep drift check (core/drift.py): re-timed pairs that moved more than the assumed
run-to-run noise allows make the sweep score with the noise seen; moves within it change nothing."""

from __future__ import annotations

import math

import pytest

from sweep.core.confidence import leader_probability
from sweep.core.drift import Retimed, drift
from sweep.core.run_to_run import Repeat
from sweep.core.schema import OK, TrialResult


def pair(accum: int, first: float, again: float, width: float = 0.01) -> Retimed:
    """A pair measured at `first` and re-timed at `again`, each with a +-width 95% interval."""
    return Retimed(accum, 1, Repeat(first, first * (1 - width), first * (1 + width)), Repeat(again, again * (1 - width), again * (1 + width)))


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
    assert d.noise == (d.seen if exceeded else assumed)
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
    assert math.isclose(d.noise, d.seen)
