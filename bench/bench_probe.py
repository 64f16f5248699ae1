"""What the probe costs: the built-in workload's step time with the probe armed and not, in one process.

Blocks of --steps optimizer steps alternate between armed (sweep.probe.install, then begin_step /
end_step around each step, as the built-in trial runs) and disarmed (every hook taken out again), in
ABBA order so drift (another process on the host, thermal) falls on both alike. Each step is timed from
outside the probe (perf_counter around the whole step, the probe's own bookkeeping included); the first
step of every block is left out (it pays for arming or disarming). Prints each side's median, their
ratio, and a 95% bootstrap interval of the ratio; the target is under 1% (issue 29). On a shared host
that interval is wide, so it also runs the same step structure (accum, split: the same module calls,
optimizer step and records) on a model too small to hide anything, and sets the probe's cost per step
measured there against the demo step's median. Each figure is given in wall time and in the CPU time of
the step's thread (one intra-op thread): on a loaded host the latter is the one to read.

It runs once per accumulation in --accums (default 1 and 8): a cost that grows with the backward passes of a
step would weigh more on pairs with more accumulation and tilt close calls toward less (issue 50).

    PYTHONPATH=src python bench/bench_probe.py [--rounds 64] [--steps 6] [--batch 32 --accums 1,8 --split 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from sweep import probe
from sweep.workloads.rnnt.config import RNNTWorkloadConfig
from sweep.workloads.rnnt.memory import configure_cpu_allocator
from sweep.workloads.rnnt.model import RNNTWorkload


def interleaved(
    workload: RNNTWorkload, per_device: int, accum: int, split: int, rounds: int, steps: int
) -> tuple[dict[bool, np.ndarray], dict[bool, np.ndarray]]:
    """Each step's wall seconds and this thread's CPU seconds, with the probe armed (True) and disarmed
    (False), ABBA blocks, the first step of each left out. With one intra-op thread the step's compute
    and the probe's work are all on this thread, and its CPU time leaves out the waits for a core that
    make wall time noisy on a shared host."""
    measured = probe.runtime().PROBE
    times: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    step = 0
    with tempfile.TemporaryDirectory() as records:
        for round_index in range(rounds):
            for armed in (True, False) if round_index % 2 == 0 else (False, True):
                if armed:
                    probe.install(Path(records) / f"round{round_index}")
                    measured.name_modules(workload.model)
                else:
                    measured.disarm()
                for i in range(steps):
                    workload.sync()
                    t0, c0 = time.perf_counter(), time.thread_time()
                    if armed:
                        measured.begin_step()
                    workload.train_step(per_device, accum, split, step_index=step)
                    if armed:
                        measured.end_step()
                    workload.sync()
                    if i > 0:
                        times[armed].append(time.perf_counter() - t0)
                        cpu[armed].append(time.thread_time() - c0)
                    step += 1
        measured.disarm()
    return {a: np.array(t) for a, t in times.items()}, {a: np.array(t) for a, t in cpu.items()}


def ratio_with_interval(times: dict[bool, np.ndarray], rng: np.random.Generator) -> tuple[float, float, float]:
    armed, plain = times[True], times[False]
    ratio = float(np.median(armed) / np.median(plain))
    boot = [np.median(rng.choice(armed, armed.size)) / np.median(rng.choice(plain, plain.size)) for _ in range(2000)]
    low, high = np.percentile(boot, [2.5, 97.5])
    return ratio, float(low), float(high)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=64, help="ABBA rounds: each has an armed and a disarmed block (16 leave a +-5%% interval on a shared host)")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per block (the first is left out)")
    p.add_argument("--batch", type=int, default=32, help="global batch (one process)")
    p.add_argument("--accums", default="1,8", help="accumulations to measure at, comma-separated")
    p.add_argument("--split", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    configure_cpu_allocator()  # as the trial does
    rng = np.random.default_rng(args.seed)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    for accum in [int(a) for a in args.accums.split(",") if a.strip()]:
        one_accumulation(args, accum, device, rng)
    return 0


def one_accumulation(args: argparse.Namespace, accum: int, device: torch.device, rng: np.random.Generator) -> None:
    per_device = args.batch // accum
    demo = RNNTWorkload(RNNTWorkloadConfig(), device)
    demo.warm_up(per_device)
    times, cpu = interleaved(demo, per_device, accum, args.split, args.rounds, args.steps)
    ratio, low, high = ratio_with_interval(times, rng)
    cpu_ratio, cpu_low, cpu_high = ratio_with_interval(cpu, rng)
    print(f"built-in workload (the CPU demo model), global batch {args.batch}, accum {accum}, split {args.split}, "
          f"{args.threads} thread(s), {device}: {times[True].size} armed and {times[False].size} disarmed steps, interleaved")
    print(f"  median step: armed {np.median(times[True]) * 1e3:.2f} ms, disarmed {np.median(times[False]) * 1e3:.2f} ms")
    print(f"  overhead (wall): {100 * (ratio - 1):+.2f}% (ratio {ratio:.4f}; 95% bootstrap interval {low:.4f}-{high:.4f})")
    print(f"  overhead (CPU time of the step's thread, medians {np.median(cpu[True]) * 1e3:.2f} vs {np.median(cpu[False]) * 1e3:.2f} ms): "
          f"{100 * (cpu_ratio - 1):+.2f}% (ratio {cpu_ratio:.4f}; 95% bootstrap interval {cpu_low:.4f}-{cpu_high:.4f})")
    # The same step structure (module calls, optimizer, records) on a model too small to hide anything:
    # the probe's cost per step in absolute terms, set against the demo step's median.
    tiny = RNNTWorkload(RNNTWorkloadConfig(feat_dim=4, frames=8, label_len=2, vocab=8, enc_hidden=4, enc_layers=2,
                                           pred_hidden=4, joint_hidden=4), device)
    tiny.warm_up(args.split)
    _, small = interleaved(tiny, args.split, accum, args.split, args.rounds * 4, args.steps)
    cost = float(np.median(small[True]) - np.median(small[False]))
    print(f"  probe's own CPU cost per step (same accum/split on a tiny model, medians {np.median(small[True]) * 1e6:.0f} vs "
          f"{np.median(small[False]) * 1e6:.0f} us): {cost * 1e6:.0f} us = {100 * cost / np.median(cpu[False]):.2f}% of the demo step's CPU time")


if __name__ == "__main__":
    raise SystemExit(main())
