"""Is sweep.core.confidence calibrated, in sample and out of sample? Simulated sweeps with known truth.

Runs staircase and grid sweeps over two families of synthetic landscapes (tests/landscapes.py):
`in-sample`, the family the confidence priors were fitted on, and `out-of-sample`, a roofline
model generated differently (compute roofline with tile padding, an allocator reserve and a
ragged OOM edge, heavy-tailed step noise with stalls). After every landed result it scores the
confidence and records two outcomes:

- strict: the recommendation is the truly fastest feasible pair (noiseless throughput). This is the
  event the score claims, and the one gated: every band with at least --min-samples samples must be
  within --tolerance points, in sample and out of sample (issue 10 item 8, issue 14 item 5).
- near: the recommendation is the grid's best, or inside its interval (a full grid run of the
  same landscape: the recommended pair's median lies at or above the low end of the grid best's
  95% interval). This is what a user can check, and what bench_search calls "same answer". It is a
  wider event than the score claims, so the score sits below it: printed for information only.

Per confidence band it prints the mean stated confidence and the observed frequency of each
outcome, in sample and out of sample side by side. Exits 1 if a gated band is off.

    python bench/bench_confidence.py [--sweeps 1500] [--seed 0] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from landscapes import BANDS, FAMILIES, Sample, calibration_table, simulate_calibration  # noqa: E402

STRATEGIES = ("staircase", "grid")
OUTCOMES = ("strict", "near")


def _job(args: tuple[int, str, str]) -> tuple[str, str, list[Sample], int]:
    seed, strategy, family = args
    samples, trials = simulate_calibration(seed, strategy, family)
    return family, strategy, samples, trials


def print_side_by_side(
    title: str, tables: dict[str, list[tuple[str, int, float, float]]], gating: set[str], min_samples: int, tol: float
) -> bool:
    """Print the families' tables side by side; False if a gating one has a band off by more than tol."""
    names = list(tables)
    print(title)
    print("  " + f"{'band':>6}" + "".join(f" | {name:^32}" for name in names))
    print("  " + " " * 6 + "".join(f" | {'samples':>7} {'stated':>7} {'observed':>8} {'gap':>6}" for _ in names))
    good = True
    for i, (lo, hi) in enumerate(BANDS):
        line = f"  {f'{lo}-{hi}':>6}"
        for name in names:
            _, n, stated, observed = tables[name][i]
            gap = observed - stated
            mark = " " if n >= min_samples else "~"  # ~: too few samples to judge
            if n >= min_samples and abs(gap) > tol:
                mark = "!" if name in gating else "?"
                good = good and name not in gating
            line += f" | {n:>7} {stated:>7.1f} {observed:>8.1f} {gap:>+6.1f}{mark}"
        print(line)
    return good


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweeps", type=int, default=1500, help="sweeps per strategy and family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--min-samples", type=int, default=50)
    ap.add_argument("--tolerance", type=float, default=10.0)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    jobs = [(args.seed * 1_000_003 + i, s, f) for f in FAMILIES for s in STRATEGIES for i in range(args.sweeps)]
    if args.workers > 1:
        with Pool(args.workers) as pool:
            out = pool.map(_job, jobs, chunksize=16)
    else:
        out = [_job(j) for j in jobs]

    every: dict[str, list[Sample]] = {f: [] for f in FAMILIES}
    finals: dict[str, list[Sample]] = {f: [] for f in FAMILIES}
    trials: dict[tuple[str, str], list[int]] = {}
    for family, strategy, samples, n in out:
        every[family] += samples
        trials.setdefault((family, strategy), []).append(n)
        if samples:
            finals[family].append(samples[-1])

    counts = ", ".join(f"{f} {len(every[f])}" for f in FAMILIES)
    print(f"confidence calibration: {len(jobs)} sweeps ({args.sweeps} per strategy and family); samples after every "
          f"landed result: {counts}")
    print(f"gap = observed - stated, in points; ! off by more than {args.tolerance:g} on a gating table, "
          f"? off on a table shown for information, ~ fewer than {args.min_samples} samples")
    good = True
    for outcome in OUTCOMES:
        gating = set(FAMILIES) if outcome == "strict" else set()
        what = ("the recommendation is the grid's best or inside its interval" if outcome == "near"
                else "the recommendation is the truly fastest feasible pair")
        tables = {f: calibration_table(every[f], outcome) for f in FAMILIES}
        role = "gating: " + ", ".join(sorted(gating)) if gating else "information only"
        good &= print_side_by_side(f"\n{outcome}: {what} ({role})", tables, gating, args.min_samples, args.tolerance)
    print("\nfinal results only (for information):")
    for outcome in OUTCOMES:
        print_side_by_side(outcome, {f: calibration_table(finals[f], outcome) for f in FAMILIES}, set(),
                           args.min_samples, args.tolerance)
    for (family, strategy), t in sorted(trials.items()):
        print(f"{family} {strategy}: {sum(t) / len(t):.1f} trials per sweep on average")
    verdict = "calibrated" if good else "NOT calibrated"
    print(f"{verdict}: strict, in and out of sample, bands with >= {args.min_samples} samples within {args.tolerance:g} points "
          f"({time.perf_counter() - t0:.1f}s)")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
