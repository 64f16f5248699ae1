"""Search cost, measurement rules and the memory model, side by side in one run.

    python bench/bench_search.py [--sim-only] [EXTRA OVERRIDES...]

1. Built-in CPU workload (real trials): the default sweep three times, `search=grid` with fixed
   steps and no racing (what the grid cost before them), `search=grid`, then the default
   `search=staircase`, each a real `python -m sweep`. Prints trial seconds (sum of every trial's
   wall time), trials, the staircase's share of the grid's (target <= 0.25), whether its pick (the
   recommendation: the fastest pair not tight) equals the grid's or lies within its interval,
   seconds to the first recommendation, and the orchestrator's CPU share of wall time (target
   < 5%); and the staircase's own pairs at the grid's prices, about the least any order of those
   trials costs, and what a search that rules pairs out only by measuring them pays for the grid's
   answer at those prices (the share the throughput ordering saves). The fixed-step grid's answer is judged by the same
   rule, for how often two grids agree on this box. Then the memory model against the grid's
   outcomes: fitted on the staircase's trials, and each pair fitted on all the grid's others.
2. Simulated 8-GPU landscapes (tests/support/landscapes.py): "typical", whose best pair lies off the
   constant-product staircase, and "split1_best", whose best is the staircase's split=1 base.
   The grid (fixed steps, then adaptive measurement plus racing) vs the default staircase with the
   memory model, fixed measurement and then adaptive measurement plus racing (core/measure.py);
   and the like-for-like ratio, both with adaptive measurement plus racing.
3. The memory model's confusion table over those and 200 random landscapes: each sweep's model,
   fitted on the staircase's results, asked about every pair, against the truth; and the pairs a
   sweep really skipped on a prediction. Target: predicted OOMs right >= 95% of the time.
Exits non-zero when a target is missed.
"""

from __future__ import annotations

import csv
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.landscapes import LANDSCAPES, Landscape, random_landscape  # noqa: E402
from support.landscapes_measure import Measurement, run_measured_sweep  # noqa: E402

from sweep.core.config import DEMO_MEMORY_GIB, TrialConfig  # noqa: E402
from sweep.core.implications import leader_key  # noqa: E402
from sweep.core.measure import cannot_win  # noqa: E402
from sweep.core.memory_model import OOM_PROBABILITY, fit_from_results, p_exceeds  # noqa: E402
from sweep.core.schema import OK, OOM, TrialResult  # noqa: E402
from sweep.core.strategies import make_strategy  # noqa: E402

FIT_PROBABILITY = 1 - OOM_PROBABILITY  # p_exceeds at or below this: "predicted fit"


# --- 1. the built-in CPU workload ---------------------------------------------------------------


def run(search: str, root: Path, extra: list[str], name: str | None = None) -> dict:
    sweep_dir = root / (name or search)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "sweep", f"search={search}", f"hydra.sweep.dir={sweep_dir}", "live=false", *extra],
        capture_output=True, text=True, cwd=root,
    )
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"{search} sweep failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout[-500:]}")
    rows = list(csv.DictReader((sweep_dir / "trials.csv").open()))
    ran = [r for r in rows if r["wall_s"]]
    meta = json.loads((sweep_dir / "sweep.json").read_text())
    first_rec = next((float(m.group(1)) for m in re.finditer(r"\[\s*([0-9.]+)s\] recommended", proc.stdout)), float("nan"))
    # The answer is the recommendation: the fastest pair that is not tight (rank 1 may be tight).
    rec = yaml.safe_load((sweep_dir / "recommendation.yaml").read_text())
    return {
        "rows": {(r["accum"], r["split"]): r for r in rows},
        "trials": len(ran),
        "trial_s": sum(float(r["wall_s"]) for r in ran),
        "wall_s": wall,
        "first_rec_s": first_rec,
        "pick": (str(rec["accum"]), str(rec["split"])),
        "baseline": (str(rec["baseline"]["accum"]), "1") if rec.get("baseline") else None,
        "orchestrator_share": meta["orchestrator_cpu_s"] / meta["wall_s"],
        "startup_cpu_s": meta["startup_cpu_s"],
    }


def as_result(row: dict) -> TrialResult:
    num = lambda k: float(row[k]) if row.get(k) else None  # noqa: E731
    return TrialResult(
        int(row["accum"]), int(row["split"]), int(row["per_device_batch"]), int(row["joint_batch"]),
        int(row["global_batch_size"]), int(row["num_devices"]), row["status"],
        oom_phase=row["oom_phase"] or None, peak_mem_gib=num("peak_mem_gib"), peak_reserved_gib=num("peak_reserved_gib"),
    )


def warm_up() -> float:
    """Load what every trial loads once, in a throwaway process: whichever sweep ran first would
    otherwise pay the cold page cache alone (its first trial took 9.9 s instead of about 3 here)."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch, submitit, hydra, sweep.workloads.rnnt.runner"], check=True)
    return time.monotonic() - t0


def cpu_workload(extra: list[str]) -> tuple[bool, list[tuple[str, str, bool]], list[tuple[str, str, bool]]]:
    warm_s = warm_up()
    with tempfile.TemporaryDirectory() as tmp:
        # What the grid cost before adaptive measurement and racing: every pair timed for exactly
        # trial.measure_steps steps.
        measure_steps = next((a.split("=", 1)[1] for a in reversed(extra) if a.startswith("trial.measure_steps=")),
                             TrialConfig().measure_steps)
        fixed = run("grid", Path(tmp), [*extra, "search.racing=false", f"trial.max_measure_steps={measure_steps}"], "grid_fixed")
        grid = run("grid", Path(tmp), extra)
        stair = run("staircase", Path(tmp), extra)
    share = stair["trial_s"] / grid["trial_s"]
    g_pick = grid["rows"][grid["pick"]]
    lo, hi = float(g_pick["throughput_low_samples_per_s"]), float(g_pick["throughput_high_samples_per_s"])
    same = same_answer(stair["pick"], grid)
    print(f"== built-in CPU workload (real trials; warm-up import {warm_s:.1f} s first, so neither sweep pays a cold cache) ==")
    print(f"{'':18}{'trials':>8}{'trial s':>10}{'wall s':>9}{'first rec s':>13}{'orch. CPU':>11}{'start-up CPU s':>16}"
          f"{'launch gap':>12}  recommended (accum, split)")
    for name, r in (("grid, fixed steps", fixed), ("grid", grid), ("staircase", stair)):
        gap = max(0.0, r["wall_s"] - r["trial_s"]) / r["wall_s"]
        print(f"{name:18}{r['trials']:>8}{r['trial_s']:>10.1f}{r['wall_s']:>9.1f}{r['first_rec_s']:>13.1f}{r['orchestrator_share']:>10.1%}"
              f"{r['startup_cpu_s']:>16.1f}{gap:>11.1%}  {r['pick']}")
    print(f"staircase / grid trial seconds: {share:.2f} (target <= 0.25)")
    steps = lambda r: sum(int(x["steps_measured"] or 0) for x in r["rows"].values() if x["status"] == OK)  # noqa: E731
    print(f"staircase / grid with fixed steps, no racing: {stair['trial_s'] / fixed['trial_s']:.2f}; timed steps of the "
          f"pairs that fit: grid {steps(grid)}, fixed-step grid {steps(fixed)} (adaptive measurement stops at "
          f"trial.target_precision or trial.max_measure_steps)")
    # The same pairs at the grid's prices: its accum-ascending order meets a strong leader early and
    # racing stops most other pairs that fit, so this is about the least any order of them costs.
    ran_both = [k for k, r in stair["rows"].items() if r["wall_s"] and grid["rows"][k]["wall_s"]]
    floor = sum(float(grid["rows"][k]["wall_s"]) for k in ran_both)
    print(f"the staircase's {len(ran_both)} pairs at the grid's prices (as the grid ran them, racing stopping most): "
          f"{floor:.1f} s, {floor / grid['trial_s']:.2f} of the grid")
    needed = pairs_the_answer_needs(grid["rows"], grid["pick"], grid["baseline"])
    least = sum(float(grid["rows"][k]["wall_s"]) for k in needed)
    print(f"without the throughput ordering, the grid's answer needs the pick, its baseline, and every pair racing cannot "
          f"rule slower: {', '.join(f'({a}, {b})' for a, b in needed)}; no OOM boundary tried; at the grid's prices: "
          f"{least:.1f} s, {least / grid['trial_s']:.2f} of the grid")
    print(f"same answer: {same} (staircase {stair['pick']}, grid {grid['pick']} [{lo:.1f}, {hi:.1f}] samples/s)")
    if not same:  # how each sweep measured both picks: noise, or a pair one sweep never ran?
        for name, r in (("staircase", stair), ("grid", grid)):
            print(f"  {name} measured: " + "; ".join(_figure(k, r["rows"].get(k)) for k in (stair["pick"], grid["pick"])))
    # Two grids over the same pairs, one after the other: how often this box agrees with itself.
    print(f"the fixed-step grid's answer, by the same rule (this box's own run-to-run agreement): "
          f"{same_answer(fixed['pick'], grid)} (fixed-step grid {fixed['pick']})")
    print(f"orchestrator overhead (staircase): {stair['orchestrator_share']:.1%} of wall time while it ran (target < 5%); "
          f"{stair['startup_cpu_s']:.1f} s of CPU before its first trial")
    # The memory model, fitted on what the staircase measured, asked about every pair the grid ran.
    # The built-in demo's emulated budget unless the run set one (machine.memory_gib defaults to none: core/config.py).
    capacity = next((float(a.split("=", 1)[1]) for a in extra if a.startswith("machine.memory_gib=")), DEMO_MEMORY_GIB)
    fit = fit_from_results([as_result(r) for r in stair["rows"].values() if r["status"] in (OK, OOM)], capacity)
    verdicts = []
    for row in grid["rows"].values():
        if row["status"] in (OK, OOM):
            verdicts.append((_verdict(p_exceeds(fit, as_result(row), capacity)), row["status"], False))
    ok = share <= 0.25 and same and stair["orchestrator_share"] < 0.05
    return ok, verdicts, leave_one_out(grid["rows"], capacity)


def same_answer(pick: tuple[str, str], grid: dict) -> bool:
    """The issue's rule: `pick` is the grid's pick, or the grid measured it inside its pick's interval."""
    g_pick, row = grid["rows"][grid["pick"]], grid["rows"][pick]
    lo, hi = float(g_pick["throughput_low_samples_per_s"]), float(g_pick["throughput_high_samples_per_s"])
    return pick == grid["pick"] or (row["status"] == OK and lo <= float(row["throughput_samples_per_s"]) <= hi)


def leave_one_out(rows: dict, capacity: float) -> list[tuple[str, str, bool]]:
    """The memory model asked about each pair the grid ran, fitted on every other pair's peak: how
    well it predicts this workload's real peaks (the staircase's own few trials may be too few)."""
    results = {k: as_result(r) for k, r in rows.items() if r["status"] in (OK, OOM)}
    return [(_verdict(p_exceeds(fit_from_results([o for j, o in results.items() if j != k], capacity), r, capacity)), r.status, False)
            for k, r in results.items()]


def pairs_the_answer_needs(rows: dict, pick: tuple[str, str], baseline: tuple[str, str] | None) -> list[tuple[str, str]]:
    """The pairs a search that rules pairs out only by measuring them cannot leave unmeasured and still
    give `pick` as its answer on this evidence: the pick, the baseline its speedup is quoted against,
    and every pair that ran ok and that racing's rule (core/measure.cannot_win) does not rule slower
    than the pick. That includes a faster tight pair: only running it shows it is tight. OOM pairs
    are left out, although a search must find the boundary somehow. The staircase also rules pairs
    out by the throughput ordering (core/implications.no_faster_than), so it may pay less."""
    p = rows[pick]
    p_interval = (float(p["throughput_low_samples_per_s"]), float(p["throughput_high_samples_per_s"]))
    needed = [pick] + ([baseline] if baseline and baseline != pick else [])
    for key, r in rows.items():
        if key in needed or r["status"] != OK or not r["throughput_low_samples_per_s"]:
            continue
        interval = (float(r["throughput_low_samples_per_s"]), float(r["throughput_high_samples_per_s"]))
        if not cannot_win(interval, p_interval, candidate_steps=int(r["steps_measured"] or 0),
                          leader_steps=int(p["steps_measured"] or 0)):
            needed.append(key)
    return needed


def _figure(key: tuple[str, str], row: dict | None) -> str:
    if row is None or not row["wall_s"]:
        return f"{key} not run"
    if row["status"] != OK:
        return f"{key} {row['status']}"
    tight = ", tight" if row.get("tight") == "True" else ""
    return (f"{key} {float(row['throughput_samples_per_s']):.1f} [{float(row['throughput_low_samples_per_s']):.1f}, "
            f"{float(row['throughput_high_samples_per_s']):.1f}]{tight}")


# --- 2. simulated landscapes --------------------------------------------------------------------


def _verdict(p: float | None) -> str:
    if p is None:
        return "no prediction"
    return "predicted OOM" if p >= OOM_PROBABILITY else "predicted fit" if p <= FIT_PROBABILITY else "uncertain"


def simulated(land: Landscape, seeds: int = 20) -> None:
    best = land.best()
    base = min((c.accum for c in land.valid() if c.split == 1 and land.feasible(c)), default=None)
    where = "on" if best is not None and base is not None and best.product == base else "off"
    print(f"-- {land.name}: best {best.key if best else None}, {where} the constant-product staircase; mean of {seeds} seeds")
    print(f"{'':44}{'trials':>8}{'trial s':>10}{'share':>7}{'same':>6}{'stopped':>9}")
    runs = [
        ("grid, fixed steps", "grid", None, Measurement()),
        ("grid, adaptive measurement + racing", "grid", None, Measurement(adaptive=True, racing=True)),
        ("staircase + memory model, fixed steps", "staircase", land.budget_gib, Measurement()),
        ("  + adaptive measurement", "staircase", land.budget_gib, Measurement(adaptive=True)),
        ("  + adaptive measurement + racing", "staircase", land.budget_gib, Measurement(adaptive=True, racing=True)),
        ("  + both, measure_steps=6 as the minimum", "staircase", land.budget_gib, Measurement(True, True, min_steps=6)),
    ]
    grid_s = None
    shares: dict[str, float] = {}
    for label, name, cap, how in runs:
        n = s = same = stopped = 0.0
        for seed in range(seeds):
            sweep = run_measured_sweep(make_strategy(name, land.candidates(), capacity_gib=cap), land, how, seed)
            n += len(sweep.results)
            s += sweep.trial_s
            stopped += sweep.stopped_early
            same += leader_key(sweep.results) == (best.key if best else None)
        grid_s = grid_s or s
        print(f"{label:44}{n / seeds:>8.1f}{s / seeds:>10.1f}{s / grid_s:>7.2f}{same / seeds:>6.0%}{stopped / seeds:>9.1f}")
        shares[label] = s / grid_s
    # Both under the same measuring rules, as on the CPU workload above.
    like_for_like = shares["  + adaptive measurement + racing"] / shares["grid, adaptive measurement + racing"]
    print(f"staircase / grid, both with adaptive measurement + racing: {like_for_like:.2f}")


def model_verdicts(land: Landscape, seed: int) -> tuple[list[tuple[str, str, bool]], dict[str, bool]]:
    """(verdict, truth) for every valid pair from the staircase's final fit; and its real skips."""
    sweep = run_measured_sweep(make_strategy("staircase", land.candidates(), capacity_gib=land.budget_gib), land, Measurement(), seed)
    fit = fit_from_results(sweep.results.values(), land.budget_gib)
    out = []
    for c in land.valid():
        truth = land.outcome(c)[0]
        if truth in (OK, OOM):
            out.append((_verdict(p_exceeds(fit, c, land.budget_gib)), truth, c.key in sweep.results))
    return out, sweep.skipped_on_prediction


def confusion(title: str, verdicts: list[tuple[str, str, bool]]) -> float | None:
    print(f"-- {title}")
    rows = ["predicted OOM", "predicted fit", "uncertain", "no prediction"]
    print(f"{'':16}{'actual OOM':>12}{'actual fit':>12}")
    for v in rows:
        print(f"{v:16}{sum(1 for a, t, _ in verdicts if a == v and t == OOM):>12}{sum(1 for a, t, _ in verdicts if a == v and t == OK):>12}")
    said = [t for a, t, _ in verdicts if a == "predicted OOM"]
    right = sum(t == OOM for t in said) / len(said) if said else None
    print(f"predicted OOMs right: {'-' if right is None else f'{right:.1%}'} of {len(said)}")
    return right


def main() -> int:
    args = sys.argv[1:]
    sim_only = "--sim-only" in args
    extra = [a for a in args if a != "--sim-only"]
    ok = True
    if not sim_only:
        cpu_ok, cpu_verdicts, cpu_loo = cpu_workload(extra)
        ok &= cpu_ok
        right = confusion("memory model on the CPU workload (fitted on the staircase's trials) vs the grid", cpu_verdicts)
        ok &= right is None or right >= 0.95
        right = confusion("memory model on the CPU workload, each pair the grid ran fitted on all the others", cpu_loo)
        ok &= right is None or right >= 0.95
    print("\n== simulated 8-GPU landscapes (trial seconds include 5-30 s start-up per trial) ==")
    for name in ("typical", "split1_best"):
        simulated(LANDSCAPES[name])
    print("\n== memory model vs the truth ==")
    verdicts, skips = [], {}
    lands = [LANDSCAPES["typical"], LANDSCAPES["split1_best"], LANDSCAPES["stair_joint_oom"]]
    rng = random.Random(0)
    lands += [random_landscape(rng) for _ in range(200)]
    for i, land in enumerate(lands):
        v, s = model_verdicts(land, i)
        verdicts += v
        skips.update({f"{i}/{k}": t for k, t in s.items()})
    right = confusion(f"every pair of {len(lands)} simulated landscapes, from the staircase's final fit", verdicts)
    ok &= right is None or right >= 0.95
    right_skips = sum(skips.values()) / len(skips) if skips else None
    print(f"pairs the staircase skipped on a prediction: {len(skips)}, truly OOM: {sum(skips.values())}"
          f" ({'-' if right_skips is None else f'{right_skips:.1%}'}; target >= 95%)")
    ok &= right_skips is None or right_skips >= 0.95
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
