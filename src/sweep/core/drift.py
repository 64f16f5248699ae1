"""Drift inside one sweep (pure): did the machine's run-to-run noise hold while the sweep ran?

The confidence score assumes machine.run_to_run_noise; on a busy host the truth can be several times
that, and the score is then confidently wrong. At the end of a sweep the orchestrator re-times the
leader and the runner-up briefly (orchestration/retime.py); each pair then has two figures from two
trial processes, which is what core/run_to_run.py estimates the noise from. When that estimate is
above the assumed noise beyond chance (a one-sided chi-square test at 5% on its degrees of freedom:
two or three re-timed figures say little), the sweep is scored with the noise it saw, and says so.

What it saw rests on a couple of degrees of freedom, so it is scored with the upper end of that
estimate's one-sided 80% interval, not its point value: two pairs that both slowed by about as much
give a small estimate on a host that is anything but quiet (the noisy-host bench: 3.8% seen, 99/100
on a wrong answer, when scored with the point value).

Either way the re-timings are evidence about the pairs the answer turns on: each re-timed pair then has two
figures from two processes, and the table's rank, the answer and its score all rest on both (pooled: their geometric
mean), so every output names the same pair. On a busy
host the leader and the runner-up of one sweep's first figures swapped places in the re-timing as often as not;
the first figures alone gave one sweep accum=8 split=1 at 95 while the next gave accum=4 split=2 at 99.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sweep.core.ranking import ranked_ok, recommendable
from sweep.core.run_to_run import Repeat, estimate_run_to_run
from sweep.core.schema import TrialResult
from sweep.core.stats import special


def chi2_quantile(q: float, dof: int) -> float:
    """scipy.stats.chi2.ppf(q, dof), as it computes it, without scipy.stats' 0.5 s import (core/stats.py)."""
    return float(2.0 * special().gammaincinv(dof / 2.0, q))


SIGNIFICANCE = 0.05  # chance of calling drift on a machine whose noise is as assumed
MAX_NOISE = 0.49
SCORED_BOUND = 0.80  # the one-sided bound on the seen noise that is scored with once drift is called


@dataclass(frozen=True)
class Retimed:
    """One pair measured in the sweep and again at its end."""

    accum: int
    split: int
    first: Repeat  # the sweep's own figure (and interval)
    again: Repeat  # the re-timing's

    @property
    def moved(self) -> float:
        """Relative change of the re-timed figure from the first: again / first - 1."""
        return self.again.throughput / self.first.throughput - 1.0


@dataclass(frozen=True)
class Drift:
    retimed: tuple[Retimed, ...]
    assumed: float  # machine.run_to_run_noise the score assumed
    seen: float  # the run-to-run noise the re-timing shows (relative sd beyond each figure's own error)
    dof: int  # degrees of freedom behind `seen`
    exceeded: bool  # seen is above assumed beyond chance

    @property
    def seen_upper(self) -> float:
        """The upper end of the seen noise's one-sided SCORED_BOUND interval (chi-square on dof)."""
        return self.seen * math.sqrt(self.dof / chi2_quantile(1.0 - SCORED_BOUND, self.dof))

    @property
    def noise(self) -> float:
        """The noise to score with: what was seen (its upper bound) where it exceeded the assumption, else the assumption."""
        # Kept inside machine.run_to_run_noise's valid range, [0, 0.5): beyond it every pair is a coin toss anyway.
        return min(MAX_NOISE, max(self.assumed, self.seen_upper)) if self.exceeded else self.assumed

    def line(self) -> str:
        """The one line the sweep prints about it."""
        pairs = " and ".join(f"accum={r.accum} split={r.split} {r.moved:+.1%}" for r in self.retimed)
        if self.exceeded:
            return (f"drift: re-timed {pairs}: run-to-run noise {self.seen:.1%} seen, above the {self.assumed:.1%} assumed; "
                    f"confidence scored with {self.noise:.1%} (its upper {SCORED_BOUND:.0%} bound on {self.dof} degree(s) of freedom)")
        # The noise seen beside the assumed one: a pair that moved by more than the assumption can still be chance
        # on so few degrees of freedom, and the line must not read as if it had not moved.
        # "Beyond their own intervals": moves the trials' own intervals explain count as no noise (0.0% beside +11.5%).
        return (f"drift check: re-timed {pairs}: run-to-run noise {self.seen:.1%} seen beyond their own intervals, on {self.dof} "
                f"degree(s) of freedom: not beyond chance above the {self.assumed:.1%} assumed")

    def record(self) -> dict[str, Any]:
        """recommendation.yaml's `drift` block."""
        return {
            "assumed_noise": round(self.assumed, 6),
            "seen_noise": round(self.seen, 6),
            "dof": self.dof,
            "exceeded": self.exceeded,
            "scored_with": round(self.noise, 6),
            "retimed": [
                {"accum": r.accum, "split": r.split, "first": round(r.first.throughput, 3), "again": round(r.again.throughput, 3),
                 "moved": round(r.moved, 4)}
                for r in self.retimed
            ],
        }


def drift(retimed: Sequence[Retimed], assumed: float) -> Drift | None:
    """The drift the re-timed pairs show against the assumed noise; None without a usable re-timing."""
    usable = tuple(r for r in retimed if r.first.throughput > 0 and r.again.throughput > 0)
    est = estimate_run_to_run({(r.accum, r.split): [r.first, r.again] for r in usable})
    if est is None:
        return None
    # dof * seen^2 / assumed^2 ~ chi-square(dof) when the noise is as assumed (own errors aside: they err toward more noise).
    threshold = assumed**2 * chi2_quantile(1.0 - SIGNIFICANCE, est.dof) / est.dof
    return Drift(usable, assumed, est.noise, est.dof, bool(est.noise**2 > threshold))


def _geometric_mean(a: float | None, b: float | None) -> float | None:
    return math.sqrt(a * b) if a and b and a > 0 and b > 0 else None


def pooled(results: Mapping[str, TrialResult], drift: Drift | None) -> dict[str, TrialResult]:
    """The records every ranking of the sweep rests on (the table's rank, its speedups, the recommendation and its
    score): each re-timed pair's figure and interval the geometric mean of its two timings (the sweep's and the
    re-timing's, two processes); every other record as it is. trials.csv keeps each trial's own figure in its own
    columns and this one beside it (ranking.build_table), so a reader sees both and which one ranks."""
    out = dict(results)
    if drift is None:
        return out
    by_pair = {(r.accum, r.split): key for key, r in results.items()}
    for again in drift.retimed:
        key = by_pair.get((again.accum, again.split))
        if key is None:
            continue
        first = results[key]
        both = _geometric_mean(again.first.throughput, again.again.throughput)
        if both is None:
            continue
        out[key] = replace(first, throughput=both, throughput_low=_geometric_mean(again.first.low, again.again.low) or first.throughput_low,
                           throughput_high=_geometric_mean(again.first.high, again.again.high) or first.throughput_high)
    return out


def retimed_figures(results: Mapping[str, TrialResult], drift: Drift | None) -> dict[str, float]:
    """{key: the drift check's figure} of each re-timed pair of `results` (trials.csv's retimed column)."""
    if drift is None:
        return {}
    by_pair = {(r.accum, r.split): key for key, r in results.items()}
    return {by_pair[(r.accum, r.split)]: r.again.throughput for r in drift.retimed if (r.accum, r.split) in by_pair}


def pooled_note(results: Mapping[str, TrialResult], basis: Mapping[str, TrialResult], recommended: str, unit: str,
                drift: Drift | None) -> str | None:
    """One line where the answer on both timings is not the pair the sweep's first figures alone would recommend (the
    fastest roomy one); None where it is. It states each figure the ranking used, so that every word of it can be
    checked against the numbers beside it: the pooled pair leads on the geometric mean, not necessarily on each timing."""
    first = recommendable(ranked_ok(results))
    if not first or first[0].key == recommended or recommended not in basis:
        return None
    lead_key, rival_key = recommended, first[0].key
    lead, rival = basis[lead_key], basis[rival_key]
    again = retimed_figures(results, drift)

    def figure(value: float | None) -> str:
        return "not re-timed" if value is None else f"{value:.1f}"

    def pair(r: TrialResult) -> str:
        return f"accum={r.accum} split={r.split}"

    on_sweep = f"{figure(results[lead_key].throughput)} against {figure(results[rival_key].throughput)} on the sweep's timings"
    on_check = f"{figure(again.get(lead_key))} against {figure(again.get(rival_key))} on the drift check's"
    return (f"{pair(lead)} ranks above {pair(rival)} on both timings of each re-timed pair (their geometric mean): "
            f"{lead.throughput:.1f} against {rival.throughput:.1f} {unit}; {on_sweep}, {on_check}")
