"""A gloo DDP trainer for the two-node Slurm tests (tests/test_slurm_nodes.py), started on each node by torchrun or by
the deepspeed launcher (the +sweep=deepspeed preset's line: --local_rank, and --deepspeed_config, whose
train_batch_size and gradient_accumulation_steps stand for --gbs and --accum, as a DeepSpeed script reads them).

Each rank writes what it saw to $SWEEP_TRIAL_DIR/rank<R>.json after every step: its host, node (torchrun's
GROUP_RANK, the deepspeed launcher's CROSS_RANK), world size and the end time of each optimizer step, so a test
can set the trial's figure beside the ranks' own timings. Each micro-batch sleeps --micro_s, so accum=4 is slower
than accum=1 by design.

--behaviours=KEY:WHAT[@RANK],... picks what a trial does on rank RANK (default 3; the others train on); KEY is the trial's
ACCUM, or ACCUM/SPLIT (with --split) for one pair of that accum:
  oom        the joint asks the CPU allocator for 16 TiB at step --at (a real out-of-memory error, in `joint`)
  crash      RuntimeError("bad shard 7") at step --at
  slow_node  no gradient all-reduce (each rank steps alone) and node 1's ranks sleep --slow_s a step: only ranks
             that never wait for each other show whose step the figure is (under DDP every rank's lasts as long
             as the slowest's); a barrier at the end
  slow       every rank sleeps --slow_s a step (DDP kept): a pair the decision stops for being slower
  heavy_node node 1's ranks each hold --heavy_mib MiB, touched, from the start: the trial's memory is node 1's
  stall      every rank sleeps --stall_s before its first step: a trial with no step to judge, which only the time limit ends
  late_slow  every rank sleeps --stall_s before its first step, then --slow_s a step: a slow pair that starts after its rival
"""

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--accum", type=int)
p.add_argument("--split", type=int, default=1, help="only picks the behaviour (ACCUM/SPLIT): a pair the sweep tells apart")
p.add_argument("--gbs", type=int)
p.add_argument("--local_rank", type=int, default=0, help="passed by the deepspeed launcher")
p.add_argument("--deepspeed", action="store_true", help="passed by the deepspeed preset's line")
p.add_argument("--deepspeed_config", default="", help="the preset's per-trial config: the global batch and the accumulation")
p.add_argument("--steps", type=int, default=400)
p.add_argument("--behaviours", default="")
p.add_argument("--at", type=int, default=4)
p.add_argument("--micro_s", type=float, default=0.01)
p.add_argument("--slow_s", type=float, default=0.12)
p.add_argument("--heavy_mib", type=int, default=512)
p.add_argument("--stall_s", type=float, default=600.0)
a = p.parse_args()
if a.deepspeed_config:
    with open(a.deepspeed_config) as f:
        config = json.load(f)
    a.gbs, a.accum = config["train_batch_size"], config["gradient_accumulation_steps"]
behaviours = dict(b.split(":") for b in a.behaviours.split(",") if b)
what, _, on = (behaviours.get(f"{a.accum}/{a.split}", behaviours.get(str(a.accum), "")) + "@").partition("@")
on_rank = int(on.rstrip("@") or 3)

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
node = int(os.environ.get("GROUP_RANK") or os.environ.get("CROSS_RANK") or 0)  # torchrun's, the deepspeed launcher's
ballast = torch.ones(a.heavy_mib << 20, dtype=torch.uint8) if what == "heavy_node" and node == 1 else None  # ones: every page touched


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(32, 32)
        self.joint = Joint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.joint(self.encoder(x))


class Joint(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = torch.nn.Linear(32, 1)
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if rank == on_rank and self.step >= a.at:
            if what == "oom":
                torch.empty(1 << 44, dtype=torch.uint8)  # refused at once: the CPU allocator's out-of-memory error
            if what == "crash":
                raise RuntimeError("bad shard 7")
        return self.out(x)


net = Net()
model = net if what == "slow_node" else torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
per_rank = max(1, a.gbs // (world * a.accum))
if what in ("stall", "late_slow"):
    time.sleep(a.stall_s)
ends = [time.time()]
record = os.path.join(os.environ["SWEEP_TRIAL_DIR"], f"rank{rank}.json")
for step in range(a.steps):
    net.joint.step = step
    for _ in range(a.accum):
        model(torch.randn(per_rank, 32)).sum().backward()
        time.sleep(a.micro_s)
    if what == "slow_node" and node == 1 or what in ("slow", "late_slow"):
        time.sleep(a.slow_s)
    opt.step()
    opt.zero_grad()
    ends.append(time.time())
    with open(record + ".tmp", "w") as f:
        json.dump({"rank": rank, "node": node, "host": socket.gethostname(), "world": world, "ends": ends}, f)
    os.replace(record + ".tmp", record)
if what == "slow_node":
    dist.barrier()
dist.destroy_process_group()
