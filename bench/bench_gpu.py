"""GPU cost of a sweep, today's policy against the new one, on the recorded H100 landscapes and simulated ones.

    python bench/bench_gpu.py [--seeds N]

Landscapes:
* recorded: the three H100 sweeps in tests/data/h100/ (base80, large80, base24; README there).
  Recorded pairs keep what the card did (status, late OOMs, peaks, their own step times); the
  pairs a recording lacks are filled from a landscape model (tests/support/landscapes_h100.py): step time
  fitted on the recorded ok pairs by non-negative least squares on accum and accum * split (at a
  fixed per-device total, a fixed cost per micro-batch and per joint chunk, so throughput follows
  the per-device and joint batch), memory from what the recorded peaks imply and else the memory
  model fitted on them, per-step spread drawn from the recorded steps, start-up from the recorded
  start-ups (11.8-16.3 s);
* simulated: tests/support/landscapes.py's named landscapes and random ones, as one rank's share, with
  start-ups in the recorded range.

Policies (tests/support/landscapes_gpu.py simulates them step by step with the real staircase, memory
model, racing and decision rules):
* before (today): a fresh process per trial, 2 warm-up steps, adaptive measurement to +-2% or the
  32-step cap, racing against the finished leader, one trial at a time; on an 8-GPU host
  (machine.num_devices=8, global batch 1024) one 8-rank trial at a time;
* measure to the decision alone (core/decision.py; implemented) on a workload without a stress
  step (a command trial's rule: a pair may stop for being ahead after one timed step), then with
  the built-in RNN-T's stress step (workload.stress_step=9, the 8th timed step: a pair stops for
  being ahead only once past it, core/decision.ahead_after_steps, and a late OOM is met there;
  beside it the rule before, which let a pair stop for being ahead as soon as separated),
  then with warm workers too, then with tied pairs stopped past the stress step (core/decision.py's
  rule 4: a possible answer whose every unseparated rival's median lies inside the run-to-run noise,
  machine.run_to_run_noise's cuda default of 1% as the orchestrator hands it in), then with the
  search's first pair stopped provisionally after one timed step and run again in full when the
  search ends if it may be the answer (rule 0, orchestration/remeasure.py). Every row measured to
  the decision has rule 5 too (a pair past its stress step whose 95% interval lies inside a finished
  rival's stops: its own steps cannot separate them) and counts as rivals only pairs with a real 95%
  interval; neither has a setting to turn it off.
* then screening on the 8-GPU host (8 one-rank trials at once at global batch 128, at most
  trial.measure_steps timed steps each, measured to the decision with the stress step like a full
  trial (core/screening.py), the first pair provisional and never run again, the spare devices
  given the last stair's split-doubled pair (core/strategies.Staircase's spare_retry); then the
  pairs inside the leader's noise as full 8-rank trials (core/screening.confirm_candidates), measured
  to the decision with the stress step; the answer is the best full trial).

Warm workers as built (launch/warm_pool.py): one-rank trials only, so on one device the first trial
pays a recorded fresh start-up and later ones WARM_START_S; on the 8-GPU host each screening device
keeps a worker, while every 8-rank confirmation is a fresh process per rank and pays a recorded
start-up; a cancelled trial ends its worker. WARM_START_S (3 s) is the one cost the recordings
cannot give: they time each trial's start-up only as a whole (an ok trial's wall minus its warm-up
and timed steps; 13.8-15.1 s of wall for an OOM at step 0), and a warm worker still pays part of it
(the model build, optimizer and data, a one-sample warm-up pass, the hand-off). What they do give
is printed first: start-up by model, which does not grow from rnnt_base to rnnt_large (2.3 times
the parameters), so the build is a small part of it; and the headline ratios are printed again
with a warm start of 1 s and of 0 s, so a reader sees whether the assumption decides a target.
Last, where the one-device policy's GPU-seconds go (spent_on, by each trial's stop reason).

Figures: GPU-seconds to the answer (every device a trial holds, for its wall time) and wall time on
one device; wall time on the 8-GPU host; how often the answer is the grid's (every pair measured to
the cap; or a pair whose grid median lies inside the grid answer's interval). Assumptions that no
recording measured are printed with the results.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import landscapes_gpu as sim  # noqa: E402
from support.landscapes import LANDSCAPES, random_landscape  # noqa: E402
from support.landscapes_h100 import RECORDINGS, load  # noqa: E402

from sweep.core.decision import PROVISIONAL  # noqa: E402

ONE_DEVICE = (sim.OLD, sim.DECISION, sim.STRESS_EARLY, sim.STRESS, sim.WARM_ONLY, sim.TIED, sim.WARM)  # on one device screening has nothing to split
HOST = (sim.OLD, sim.NEW)


def measure(lands: list, seeds: int) -> dict[str, dict[str, float]]:
    """Per policy: summed GPU-seconds and walls, and answers like the grid's, over every landscape and seed."""
    out: dict[str, dict[str, float]] = {}
    for land in lands:
        for seed in range(seeds):
            grid = sim.grid_answer(land, seed)
            if grid[0] is None:
                continue
            for policy in ONE_DEVICE:
                o = sim.one_device(land, policy, seed)
                row = out.setdefault(policy.name, dict.fromkeys(("gpu_s", "wall_s", "same", "n", "host_wall_s", "host_same", "host_n"), 0.0))
                row["gpu_s"] += o.gpu_s
                row["wall_s"] += o.wall_s
                row["same"] += sim.same_answer(o.pick, grid)
                row["n"] += 1
            for policy in HOST:
                o = sim.eight_gpu_host(land, policy, seed)
                row = out.setdefault(policy.name, dict.fromkeys(("gpu_s", "wall_s", "same", "n", "host_wall_s", "host_same", "host_n"), 0.0))
                row["host_wall_s"] += o.wall_s
                row["host_gpu_s"] = row.get("host_gpu_s", 0.0) + o.gpu_s
                row["host_same"] += sim.same_answer(o.pick, grid)
                row["host_n"] += 1
    return out


def show(title: str, rows: dict[str, dict[str, float]]) -> tuple[float, float, float, float]:
    """Print one table; (GPU-s ratio, 8-GPU wall ratio, same-answer share before, after)."""
    before = rows[sim.OLD.name]
    print(f"-- {title}: sums over landscapes and seeds --")
    print(f"{'policy':68}{'GPU-s, 1 dev':>14}{'ratio':>7}{'wall 8-GPU':>12}{'ratio':>7}{'GPU-s 8-GPU':>13}{'ratio':>7}"
          f"{'same, 1 dev':>13}{'same, 8-GPU':>13}")
    for name, r in rows.items():
        gpu = f"{r['gpu_s']:>14.0f}{r['gpu_s'] / before['gpu_s']:>7.2f}" if r["n"] else f"{'':>14}{'':>7}"
        host = (f"{r['host_wall_s']:>12.0f}{r['host_wall_s'] / before['host_wall_s']:>7.2f}"
                f"{r['host_gpu_s']:>13.0f}{r['host_gpu_s'] / before['host_gpu_s']:>7.2f}") if r["host_n"] else f"{'':>12}{'':>7}{'':>13}{'':>7}"
        same = f"{r['same'] / r['n']:>13.0%}" if r["n"] else f"{'':>13}"
        host_same = f"{r['host_same'] / r['host_n']:>13.0%}" if r["host_n"] else f"{'':>13}"
        print(f"{name:68}{gpu}{host}{same}{host_same}")
    after_1, after_8 = rows[sim.WARM.name], rows[sim.NEW.name]
    same_before = (before["same"] + before["host_same"]) / (before["n"] + before["host_n"])
    same_after = (after_1["same"] + after_8["host_same"]) / (after_1["n"] + after_8["host_n"])
    return after_1["gpu_s"] / before["gpu_s"], after_8["host_wall_s"] / before["host_wall_s"], same_before, same_after


def per_recording(seeds: int) -> None:
    print(f"{'recording':10}{'pairs recorded':>16}{'grid answer':>18}  {'GPU-s 1 dev: before -> after':>30}  {'8-GPU wall: before -> after':>30}")
    for name in RECORDINGS:
        land = load(name)
        recorded = sum(land.source(c) == "recorded" for c in land.valid())
        answers = [sim.grid_answer(land, s)[0] for s in range(seeds)]
        common = statistics.mode(answers)
        g0 = statistics.mean(sim.one_device(land, sim.OLD, s).gpu_s for s in range(seeds))
        g1 = statistics.mean(sim.one_device(land, sim.WARM, s).gpu_s for s in range(seeds))
        w0 = statistics.mean(sim.eight_gpu_host(land, sim.OLD, s).wall_s for s in range(seeds))
        w1 = statistics.mean(sim.eight_gpu_host(land, sim.NEW, s).wall_s for s in range(seeds))
        print(f"{name:10}{recorded:>10} of {len(land.valid()):<3}{common:>18}  {g0:>14.0f} -> {g1:<6.0f}({g1 / g0:.2f})"
              f"  {w0:>14.0f} -> {w1:<6.0f}({w1 / w0:.2f})")


def startup_by_model() -> str:
    """The recorded fresh start-ups, by model: what says how much of a start-up is the model build."""
    by: dict[str, list[float]] = {}
    for name in RECORDINGS:
        by.setdefault("rnnt_large" if name.startswith("large") else "rnnt_base", []).extend(load(name).startups_s)
    return ", ".join(f"{m} {statistics.mean(v):.1f} s over {len(v)} trials ({min(v):.1f}-{max(v):.1f})" for m, v in by.items())


def warm_start_sensitivity(recorded: list, seeds: int) -> str:
    """The headline ratios again with a cheaper warm start: whether the assumed 3 s decides the targets."""
    before_1 = sum(sim.one_device(land, sim.OLD, s).gpu_s for land in recorded for s in range(seeds))
    before_8 = sum(sim.eight_gpu_host(land, sim.OLD, s).wall_s for land in recorded for s in range(seeds))
    assumed, out = sim.WARM_START_S, []
    try:
        for warm_start in (1.0, 0.0):
            sim.WARM_START_S = warm_start
            gpu = sum(sim.one_device(land, sim.WARM, s).gpu_s for land in recorded for s in range(seeds))
            wall = sum(sim.eight_gpu_host(land, sim.NEW, s).wall_s for land in recorded for s in range(seeds))
            out.append(f"{warm_start:g} s: gpu-seconds {gpu / before_1:.2f} of before, 8-GPU wall {wall / before_8:.2f}")
    finally:
        sim.WARM_START_S = assumed
    return "; ".join(out)


# Why a timed step was spent, by the trial's stop reason (core/decision.py), for where_it_goes.
SPENT_BY_REASON = (
    (("cannot beat", "outranked"), "timed steps of pairs that could not win"),
    ((PROVISIONAL,), "timed steps of the first pair, stopped provisionally"),
    (("no other pair",), "timed steps of a pair with no rival measured yet, in full"),
    (("tied with",), "timed steps of tied pairs (past the stress step, inside the run-to-run noise)"),
    (("cannot separate",), "timed steps of pairs their own steps could not separate (past the stress step)"),
    (("ahead",), "timed steps of pairs stopped ahead (past the stress step)"),
)


def spent_on(phase: sim.Phase) -> dict[str, float]:
    """Where one device's GPU-seconds went: start-up and warm-up, timed steps by why they ended, OOM trials,
    and the re-runs in full of provisional pairs that could be the answer."""
    out: dict[str, float] = {}
    again = {r.key for r in phase.provisional}
    for r, rerun in [*((r, r.key in again) for r in phase.results.values()), *((r, False) for r in phase.provisional)]:
        wall = r.wall_s or 0.0
        if r.status == "oom":
            kind, timed = "out-of-memory trials (start-up and the steps until the OOM)", wall
        elif rerun:
            kind, timed = "re-runs in full of provisional pairs that could be the answer (start-up, warm-up, steps)", wall
        else:
            timed = sum(r.step_times_s)
            out["start-up and warm-up steps of ok trials"] = out.get("start-up and warm-up steps of ok trials", 0.0) + wall - timed
            why = r.stopped_early or ""
            kind = next((k for marks, k in SPENT_BY_REASON if any(why.startswith(m) or m in why for m in marks)),
                        "timed steps to the trial's own end (a possible answer, not separated)")
        out[kind] = out.get(kind, 0.0) + timed
    return out


def where_it_goes(recorded: list, seeds: int) -> None:
    """Per replayed sweep on one device, where the one-device policy's GPU-seconds go: what is left to save."""
    total: dict[str, float] = {}
    for land in recorded:
        for seed in range(seeds):
            for kind, s in spent_on(sim.one_device_phase(land, sim.WARM, seed)).items():
                total[kind] = total.get(kind, 0.0) + s
    n = len(recorded) * seeds
    before = sum(sim.one_device(land, sim.OLD, s).gpu_s for land in recorded for s in range(seeds)) / n
    print(f"where '{sim.WARM.name}' spends its GPU-seconds on one device, per replayed sweep "
          f"({sum(total.values()) / n:.0f} in all; today {before:.0f}; 1/3 of today is {before / 3:.0f}):")
    for kind, s in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"  {s / n:6.0f}  {kind}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20, help="replays per landscape (default 20)")
    ap.add_argument("--random", type=int, default=30, help="random simulated landscapes (default 30)")
    args = ap.parse_args()
    print(f"recorded fresh start-ups (wall before the first step): {startup_by_model()}")
    print(f"assumed, not recorded: a trial in a warm worker starts in {sim.WARM_START_S:g} s (model build, allocator reset); "
          f"an 8-rank step is {sim.DDP_OVERHEAD:.0%} slower than one rank's, with the same memory; the workload's stress step meets a "
          f"late OOM the recording met at that step or later (step {sim.STRESS_STEP}, timed step {sim.STRESS_STEP - sim.WARMUP_STEPS + 1}), "
          f"and its step time is drawn like any other step's")
    print("\n== recorded H100 landscapes (tests/data/h100; unrecorded pairs from the landscape model) ==")
    per_recording(min(args.seeds, 5))
    recorded = [load(name) for name in RECORDINGS]
    x, y, z0, z1 = show(f"recorded, {args.seeds} seeds each", measure(recorded, args.seeds))
    print(f"with a warm start of {warm_start_sensitivity(recorded, args.seeds)}")
    where_it_goes(recorded, args.seeds)
    print("\n== simulated landscapes (tests/support/landscapes.py, one rank's share; start-up in the recorded range) ==")
    rng = random.Random(0)
    simulated = [sim.Simulated(LANDSCAPES[n]) for n in ("typical", "split1_best", "stair_joint_oom", "pressure", "noisy")]
    simulated += [sim.Simulated(random_landscape(rng), name=f"random{i}") for i in range(args.random)]
    xs, ys, zs0, zs1 = show(f"simulated, {len(simulated)} landscapes x {max(1, args.seeds // 4)} seeds", measure(simulated, max(1, args.seeds // 4)))
    print(f"simulated: gpu-seconds {xs:.2f} of before; 8-GPU wall {ys:.2f}; same answer {zs1:.0%} (before {zs0:.0%})")
    print(f"\ntargets on the recorded landscapes: GPU-seconds <= 0.33 of before, 8-GPU wall <= 0.20, same answer >= before ({z0:.0%})")
    print(f"gpu-seconds to the answer: {x:.2f} of before; 8-GPU wall: {y:.2f} of before; same answer: {z1:.0%}")
    return 0 if x <= 1 / 3 and y <= 0.2 and z1 >= z0 else 1


if __name__ == "__main__":
    sys.exit(main())
