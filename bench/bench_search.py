"""Search cost and overhead, measured side by side in one run on the built-in CPU workload.

    python bench/bench_search.py [EXTRA OVERRIDES...]

Runs the default sweep twice, `search=grid` then `search=staircase`, each a real
`python -m sweep` with real trials, and prints:
- trial seconds (the sum of every trial's wall time) of each, and staircase's share of grid's
  (target: <= 40%), and whether staircase's pick equals grid's best or lies within its interval;
- seconds from launch to the first interim recommendation;
- the orchestrator's own share of sweep wall time: its process's CPU time (Hydra start-up,
  planning, polling, writing tables; trials excluded) over the sweep's wall time (target < 5%),
  and, for information, the launch gap: wall time not inside any trial (process starts, polling).
Exits non-zero when a target is missed.
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(search: str, root: Path, extra: list[str]) -> dict:
    sweep_dir = root / search
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
    meta = __import__("json").loads((sweep_dir / "sweep.json").read_text())
    first_rec = next((float(m.group(1)) for m in re.finditer(r"\[\s*([0-9.]+)s\] recommended", proc.stdout)), float("nan"))
    best = next(r for r in rows if r["rank"] == "1")
    return {
        "rows": {(r["accum"], r["split"]): r for r in rows},
        "trials": len(ran),
        "trial_s": sum(float(r["wall_s"]) for r in ran),
        "wall_s": wall,
        "first_rec_s": first_rec,
        "best": (best["accum"], best["split"]),
        "orchestrator_share": meta["orchestrator_cpu_s"] / meta["wall_s"],
    }


def main() -> int:
    extra = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        grid = run("grid", Path(tmp), extra)
        stair = run("staircase", Path(tmp), extra)
    share = stair["trial_s"] / grid["trial_s"]
    g_best = grid["rows"][grid["best"]]
    s_in_grid = grid["rows"][stair["best"]]
    lo, hi = float(g_best["throughput_low_samples_per_s"]), float(g_best["throughput_high_samples_per_s"])
    same = stair["best"] == grid["best"] or (s_in_grid["status"] == "ok" and lo <= float(s_in_grid["throughput_samples_per_s"]) <= hi)
    print(f"{'':12}{'trials':>8}{'trial s':>10}{'wall s':>9}{'first rec s':>13}{'orch. CPU':>11}{'launch gap':>12}  best (accum, split)")
    for name, r in (("grid", grid), ("staircase", stair)):
        gap = max(0.0, r["wall_s"] - r["trial_s"]) / r["wall_s"]
        print(f"{name:12}{r['trials']:>8}{r['trial_s']:>10.1f}{r['wall_s']:>9.1f}{r['first_rec_s']:>13.1f}{r['orchestrator_share']:>10.1%}{gap:>11.1%}  {r['best']}")
    stair_overhead = stair["orchestrator_share"]
    print(f"staircase / grid trial seconds: {share:.2f} (target <= 0.40)")
    print(f"same answer: {same} (staircase {stair['best']}, grid {grid['best']} [{lo:.1f}, {hi:.1f}] samples/s)")
    print(f"orchestrator overhead (staircase): {stair_overhead:.1%} of wall time (target < 5%)")
    return 0 if share <= 0.40 and same and stair_overhead < 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
