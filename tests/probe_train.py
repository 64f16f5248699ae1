"""A plain PyTorch training script the probe tests run as a user would (python or torchrun).

It knows nothing of sweep. It times its own iterations (from the end of one optimizer step to the end
of the next, what the probe calls a step) and writes them to --own-times (one JSON list per rank), so a
test can set the probe's figures beside an independent measurement.

--optimizers 2: two optimizers per iteration (one step to the probe). --skip-step K: an inf gradient at
iteration K under a CPU GradScaler, which then skips that step. --oom forward|backward|recover: run out
of memory (an allocation over the address-space cap --cap-mib sets) at iteration --oom-step (2) inside
the module `encoder.block`'s forward, inside `joint`'s backward, or in `encoder.block` and carry on with
a smaller batch.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

HUGE = 1 << 36  # 64 GiB of float32 elements / 4: far over any cap a test sets


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.explode = False

    def forward(self, x):
        if self.explode:
            torch.empty(HUGE, dtype=torch.uint8)  # the allocator fails here, inside encoder.block
        return torch.relu(self.linear(x))


class _BigBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        torch.empty(HUGE, dtype=torch.uint8)
        return grad * 2


class Joint(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.out = nn.Linear(width, 4)
        self.explode_backward = False

    def forward(self, x):
        y = self.out(x)
        return _BigBackward.apply(y) if self.explode_backward else y


class Net(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential()
        self.encoder.add_module("block", Block(width))
        self.joint = Joint(width)

    def forward(self, x):
        return self.joint(self.encoder(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--optimizers", type=int, default=1)
    p.add_argument("--skip-step", type=int, default=-1)
    p.add_argument("--oom", choices=["", "forward", "backward", "recover"], default="")
    p.add_argument("--oom-step", type=int, default=2)
    p.add_argument("--cap-mib", type=int, default=512)
    p.add_argument("--own-times", default="")
    args = p.parse_args()
    torch.manual_seed(0)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    net = Net(args.width)
    model = nn.parallel.DistributedDataParallel(net) if distributed else net
    if args.optimizers == 2:
        optimizers = [torch.optim.SGD(net.encoder.parameters(), lr=1e-3), torch.optim.AdamW(net.joint.parameters(), lr=1e-3)]
    else:
        optimizers = [torch.optim.SGD(net.parameters(), lr=1e-3)]
    scaler = torch.amp.GradScaler("cpu") if args.skip_step >= 0 else None
    if args.oom:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + args.cap_mib * 2**20, hard))
    own: list[float] = []
    batch = args.batch
    last = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(batch, args.width)
        net.encoder.block.explode = args.oom in ("forward", "recover") and step == args.oom_step
        net.joint.explode_backward = args.oom == "backward" and step == args.oom_step
        try:
            loss = model(x).pow(2).mean()
        except RuntimeError as exc:  # torch.OutOfMemoryError on CUDA; the CPU allocator's is a RuntimeError
            if args.oom != "recover" or "can't allocate memory" not in str(exc):
                raise
            batch //= 2  # what a trainer with automatic batch sizing does
            net.encoder.block.explode = False
            loss = model(torch.randn(batch, args.width)).pow(2).mean()
        if scaler is not None:
            scaler.scale(loss).backward()
            if step == args.skip_step:
                next(net.parameters()).grad.fill_(float("inf"))
            for opt in optimizers:
                scaler.step(opt)
        else:
            loss.backward()
            for opt in optimizers:
                opt.step()
        now = time.perf_counter()  # where the probe's step ends too: as the last optimizer step returns
        own.append(now - last)
        last = now
        if scaler is not None:
            scaler.update()
        for opt in optimizers:
            opt.zero_grad()
    if args.own_times:
        rank = dist.get_rank() if distributed else 0
        with open(f"{args.own_times}.rank{rank}.json", "w") as f:
            json.dump(own, f)
    if distributed:
        dist.barrier()  # both ranks past their last collective
        # Then out without gloo's teardown, as tests/test_rnnt.py's ranks leave: it aborts a rank now and then ("terminate
        # called without an active exception") when the peer closes its side first, past the barrier too (a full run with
        # three workers on two cores). The exit handlers still run: the probe writes its exit record in one.
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(0)


if __name__ == "__main__":
    main()
