"""Is sweep.core.confidence calibrated, in sample and out of sample? Simulated sweeps with known truth.

Runs staircase and grid sweeps over two families of synthetic landscapes (tests/support/landscapes.py):
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

--run-to-run X sets every landscape's run-to-run noise (the lognormal offset one trial draws) to X,
as on a host whose processes drift, e.g. 0.07 on a shared CPU. The score is then told X
(machine.run_to_run_noise), which is gated; and, for information, it is scored again told nothing
(its 1% default floor), which is what a sweep there claimed before it could be told.

    python bench/bench_confidence.py [--sweeps 1500] [--seed 0] [--workers 2] [--run-to-run 0.07]
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.landscapes import BANDS, FAMILIES, Sample, calibration_table, simulate_calibration  # noqa: E402

STRATEGIES = ("staircase", "grid")
OUTCOMES = ("strict", "near")


def _job(args: tuple[int, str, str, float | None, float | None]) -> tuple[str, str, list[Sample], int]:
    seed, strategy, family, trial_noise, run_to_run = args
    samples, trials = simulate_calibration(seed, strategy, family, trial_noise, run_to_run)
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
    ap.add_argument("--run-to-run", type=float, default=None, metavar="X",
                    help="every landscape's run-to-run noise; the score is told it (gated) and, apart, not told")
    args = ap.parse_args(argv)
    if args.run_to_run is None:
        return 0 if calibrate(args, None, None) else 1
    print(f"every landscape's run-to-run noise set to {args.run_to_run:g}; the score told so "
          f"(machine.run_to_run_noise={args.run_to_run:g}):\n")
    good = calibrate(args, args.run_to_run, args.run_to_run)
    print("\nfor information, the same landscapes scored without being told (the score's default floor):\n")
    calibrate(args, args.run_to_run, None, gate=False)
    return 0 if good else 1


def calibrate(args: argparse.Namespace, trial_noise: float | None, run_to_run: float | None, gate: bool = True) -> bool:
    """Run the sweeps, print the tables; False if a gated band is off (never, with gate=False)."""
    t0 = time.perf_counter()
    jobs = [(args.seed * 1_000_003 + i, s, f, trial_noise, run_to_run)
            for f in FAMILIES for s in STRATEGIES for i in range(args.sweeps)]
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
        gating = set(FAMILIES) if outcome == "strict" and gate else set()
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
    verdict = ("calibrated" if good else "NOT calibrated") if gate else "not gated"
    print(f"{verdict}: strict, in and out of sample, bands with >= {args.min_samples} samples within {args.tolerance:g} points "
          f"({time.perf_counter() - t0:.1f}s)")
    return good


if __name__ == "__main__":
    sys.exit(main())
