"""`python -m sweep.workloads.rnnt.train`: the built-in RNN-T as a standalone training script.

It takes Myrtle.ai-style flags and prints Myrtle v1.12 dllogger epoch lines, so the
`workload=command` path (argv templates, log parsers, log-based OOM classification)
can be exercised end to end on a machine without the real recipe. On OOM it prints
the original traceback (whose frames name the phase: encode, joint_and_loss,
optimizer_step) and exits 1, as a real training script would.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from dataclasses import fields


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from sweep.workloads.rnnt.config import RNNTWorkloadConfig

    p = argparse.ArgumentParser(prog="python -m sweep.workloads.rnnt.train", description=__doc__.splitlines()[0])
    p.add_argument("--global_batch_size", type=int, default=128)
    p.add_argument("--grad_accumulation_batches", type=int, default=1)
    p.add_argument("--batch_split_factor", type=int, default=1)
    p.add_argument("--epochs", type=int, default=3, help="epoch 1 includes warm-up; compare epoch 2 on")
    p.add_argument("--steps_per_epoch", type=int, default=2)
    p.add_argument("--memory_gib", type=float, default=None, help="emulated device memory (CPU); default: no cap")
    for f in fields(RNNTWorkloadConfig):
        if f.name != "name":
            p.add_argument(f"--{f.name}", type=type(f.default), default=f.default)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gbs, accum, split = args.global_batch_size, args.grad_accumulation_batches, args.batch_split_factor
    if min(gbs, accum, split) < 1 or gbs % accum or (gbs // accum) % split:
        print(f"error: global_batch_size={gbs} must divide into accum={accum} micro-batches of a multiple of split={split}", file=sys.stderr)
        return 2

    import torch

    from sweep.workloads.rnnt.config import RNNTWorkloadConfig
    from sweep.workloads.rnnt.memory import DeviceOOM, MemoryBudget
    from sweep.workloads.rnnt.model import RNNTWorkload

    cfg = RNNTWorkloadConfig(**{f.name: getattr(args, f.name) for f in fields(RNNTWorkloadConfig) if f.name != "name"})
    device = torch.device("cpu")
    workload = RNNTWorkload(cfg, device)
    per_device = gbs // accum
    # At the real batch: CPU kernels set up under the cap could fail for the wrong reason.
    workload.warm_up(per_device)
    with MemoryBudget(device, args.memory_gib):
        step = 0
        for epoch in range(1, args.epochs + 1):
            t0 = time.perf_counter()
            for _ in range(args.steps_per_epoch):
                try:
                    workload.train_step(per_device, accum, split, step_index=step)
                except DeviceOOM as oom:
                    print(oom.traceback_text or f"{type(oom).__name__}: {oom}", file=sys.stderr, flush=True)
                    return 1
                step += 1
            took = time.perf_counter() - t0
            stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
            print(
                f"DLL {stamp} - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : "
                f"{gbs * args.steps_per_epoch / took:8.2f} | train_avg_took : {took:6.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
