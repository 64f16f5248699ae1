"""What the probe costs: the built-in workload's step time with the probe armed and not, in one process.

Blocks of --steps optimizer steps alternate between armed (sweep.probe.install, then begin_step /
end_step around each step, as the built-in trial runs) and disarmed (every hook taken out again), in
ABBA order so drift (another process on the host, thermal) falls on both alike. Each step is timed from
outside the probe (perf_counter around the whole step, the probe's own bookkeeping included); the first
step of every block is left out (it pays for arming or disarming). Prints each side's median, their
ratio, and a 95% bootstrap interval of the ratio; the target is under 1% (issue 29).

    PYTHONPATH=src python bench/bench_probe.py [--rounds 16] [--steps 6] [--batch 16 --accum 1 --split 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from sweep import probe
from sweep.workloads.rnnt.config import RNNTWorkloadConfig
from sweep.workloads.rnnt.memory import configure_cpu_allocator
from sweep.workloads.rnnt.model import RNNTWorkload


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=16, help="ABBA rounds: each has an armed and a disarmed block")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per block (the first is left out)")
    p.add_argument("--batch", type=int, default=16, help="global batch (one process)")
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--split", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    configure_cpu_allocator()  # as the trial does
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    workload = RNNTWorkload(RNNTWorkloadConfig(), device)
    per_device = args.batch // args.accum
    workload.warm_up(per_device)
    measured = probe.runtime().PROBE
    times: dict[bool, list[float]] = {True: [], False: []}
    step = 0
    with tempfile.TemporaryDirectory() as records:
        for round_index in range(args.rounds):
            order = (True, False) if round_index % 2 == 0 else (False, True)
            for armed in order:
                if armed:
                    probe.install(Path(records) / f"round{round_index}")
                else:
                    measured.disarm()
                for i in range(args.steps):
                    workload.sync()
                    t0 = time.perf_counter()
                    if armed:
                        measured.begin_step()
                    workload.train_step(per_device, args.accum, args.split, step_index=step)
                    if armed:
                        measured.end_step()
                    workload.sync()
                    if i > 0:
                        times[armed].append(time.perf_counter() - t0)
                    step += 1
        measured.disarm()
    armed, plain = np.array(times[True]), np.array(times[False])
    ratio = statistics.median(armed) / statistics.median(plain)
    rng = np.random.default_rng(args.seed)
    boot = [
        np.median(rng.choice(armed, armed.size)) / np.median(rng.choice(plain, plain.size)) for _ in range(2000)
    ]
    low, high = np.percentile(boot, [2.5, 97.5])
    print(f"built-in workload (CPU demo model), global batch {args.batch}, accum {args.accum}, split {args.split}, "
          f"{args.threads} thread(s), device {device}: {armed.size} armed and {plain.size} disarmed steps, interleaved")
    print(f"median step: armed {statistics.median(armed) * 1e3:.2f} ms, disarmed {statistics.median(plain) * 1e3:.2f} ms")
    print(f"overhead: {100 * (ratio - 1):+.2f}% (ratio {ratio:.4f}; 95% bootstrap interval {low:.4f}-{high:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
