"""A tiny torch.compile'd trainer for the probe's tests (tests/test_probe_compile.py), on the CPU.

--how module|method|function|optimize: torch.compile(model), model.compile(), torch.compile of the whole
step's forward, or torch._dynamo.optimize(backend)(model). --backend: dynamo's backend (eager: dynamo's tracing and guards, no code generation, so it is quick).
--oom-step K: at step K the batch is large enough that the encoder's output cannot be allocated under an
address-space cap (--cap-mib), inside the compiled code. Prints one JSON line: dynamo's frame and recompile
counts, its warnings, and the step times.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import warnings

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, wide: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, wide), nn.ReLU())
        self.joint = nn.Linear(wide, 4)

    def forward(self, x):
        return self.joint(self.encoder(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--how", choices=["module", "method", "function", "optimize"], default="module")
    p.add_argument("--backend", default="eager")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--oom-step", type=int, default=-1)
    p.add_argument("--cap-mib", type=int, default=256)
    args = p.parse_args()
    torch.manual_seed(0)
    net = Net(4096)
    if args.how == "module":
        model = torch.compile(net, backend=args.backend)
    elif args.how == "method":
        net.compile(backend=args.backend)
        model = net
    elif args.how == "function":
        model = torch.compile(lambda x: net(x), backend=args.backend)
    else:  # dynamo's own entry point, not torch.compile
        model = torch._dynamo.optimize(args.backend)(net)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    if args.oom_step >= 0:
        size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + args.cap_mib * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))
    times = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(args.steps):
            start = time.perf_counter()
            batch = 32768 if step == args.oom_step else 16  # 32768 x 4096 floats: 512 MiB, over the cap
            model(torch.randn(batch, 8)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            times.append(round(time.perf_counter() - start, 4))
    from torch._dynamo.utils import counters

    print(json.dumps({"frames": counters["frames"]["total"], "recompiles": sum(counters["recompiles"].values()),
                      "warnings": [str(w.message) for w in caught], "times": times}))


if __name__ == "__main__":
    main()
