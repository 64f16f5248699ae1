"""Is sweep.core.confidence calibrated? Simulated sweeps with known truth.

Runs staircase and grid sweeps over randomised synthetic landscapes
(tests/landscapes.py), scores the confidence after every landed result, and
compares, per confidence band, the mean stated confidence with how often the
leader really was the fastest feasible pair (by noiseless throughput: near-ties
count as they fall). Exits 1 if a band of the pooled table with at least
--min-samples samples is off by more than --tolerance points. The per-strategy
and final-only tables are printed for information: their samples come from fewer
sweeps (one sweep gives up to ~35 correlated samples), so they are noisier.

    python bench/bench_confidence.py [--sweeps 1500] [--seed 0] [--workers 2]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from landscapes import random_landscape, run_sweep  # noqa: E402

from sweep.core.confidence import confidence_score, leader_key  # noqa: E402
from sweep.core.strategies import make_strategy  # noqa: E402

BANDS = [(0, 20), (20, 40), (40, 60), (60, 80), (80, 90), (90, 100)]
STRATEGIES = ("staircase", "grid")

Sample = tuple[int, bool, str]  # (stated confidence, leader truly fastest, sweep id)


def simulate(seed: int, strategy: str) -> tuple[list[Sample], int]:
    """One sweep: (a sample after every landed result that has a leader, trials run)."""
    rng = random.Random(seed)
    land = random_landscape(rng)
    cands = land.candidates()
    best = land.best()
    samples: list[Sample] = []

    def on_result(finished, in_flight) -> None:  # type: ignore[no-untyped-def]
        score = confidence_score(cands, finished)
        if score is not None:
            samples.append((score, best is not None and leader_key(finished) == best.key, f"{strategy}:{seed}"))

    res = run_sweep(make_strategy(strategy, cands), land, rng.choice([1, 2, 3]), seed, on_result)
    return samples, len(res)


def _job(args: tuple[int, str]) -> tuple[str, list[Sample], int]:
    seed, strategy = args
    samples, trials = simulate(seed, strategy)
    return strategy, samples, trials


def calibration_table(samples: list[Sample]) -> list[tuple[str, int, int, float, float]]:
    """(band, samples, sweeps, mean stated %, observed %) per band; nan when empty."""
    rows = []
    for lo, hi in BANDS:
        got = [(s, ok, seed) for s, ok, seed in samples if lo <= s < hi]
        n = len(got)
        stated = sum(s for s, _, _ in got) / n if n else float("nan")
        observed = 100.0 * sum(ok for _, ok, _ in got) / n if n else float("nan")
        rows.append((f"{lo}-{min(hi, 99)}", n, len({seed for _, _, seed in got}), stated, observed))
    return rows


def print_table(title: str, rows: list[tuple[str, int, int, float, float]], min_samples: int, tol: float) -> bool:
    """Print one table; False if a band with enough samples is off by more than tol."""
    print(title)
    print(f"  {'band':>6} {'samples':>8} {'sweeps':>7} {'stated':>7} {'observed':>9} {'gap':>6}")
    good = True
    for band, n, sweeps, stated, observed in rows:
        gap = observed - stated
        mark = ""
        if n < min_samples:
            mark = "  (few)"
        elif abs(gap) > tol:
            mark, good = "  OFF", False
        print(f"  {band:>6} {n:>8} {sweeps:>7} {stated:>7.1f} {observed:>9.1f} {gap:>+6.1f}{mark}")
    return good


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweeps", type=int, default=1500, help="sweeps per strategy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--min-samples", type=int, default=50)
    ap.add_argument("--tolerance", type=float, default=10.0)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    jobs = [(args.seed * 1_000_003 + i, s) for s in STRATEGIES for i in range(args.sweeps)]
    if args.workers > 1:
        with Pool(args.workers) as pool:
            out = pool.map(_job, jobs, chunksize=16)
    else:
        out = [_job(j) for j in jobs]

    every: list[Sample] = []
    finals: list[Sample] = []
    by_strategy: dict[str, list[Sample]] = {s: [] for s in STRATEGIES}
    trials: dict[str, list[int]] = {s: [] for s in STRATEGIES}
    for strategy, samples, n in out:
        every += samples
        by_strategy[strategy] += samples
        trials[strategy].append(n)
        if samples:
            finals.append(samples[-1])

    good = print_table(
        f"confidence calibration: {len(jobs)} sweeps, {len(every)} samples (after every landed result)",
        calibration_table(every),
        args.min_samples,
        args.tolerance,
    )
    print("for information (noisier, not gating):")
    for s in STRATEGIES:
        print_table(f"{s} only", calibration_table(by_strategy[s]), args.min_samples, args.tolerance)
    print_table("final results only", calibration_table(finals), args.min_samples, args.tolerance)
    for s in STRATEGIES:
        t = trials[s]
        print(f"{s}: {sum(t) / len(t):.1f} trials per sweep on average")
    verdict = "calibrated" if good else "NOT calibrated"
    print(f"{verdict}: pooled bands with >= {args.min_samples} samples within {args.tolerance:g} points "
          f"({time.perf_counter() - t0:.1f}s)")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
