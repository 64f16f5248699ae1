"""Trainer scripts the tests write and sweep as command workloads (tests/test_command_workload.py,
test_slurm_sweep.py)."""

from __future__ import annotations

DDP_TRAINER = r'''
import argparse, json, os, time
import torch
import torch.distributed as dist
args = argparse.ArgumentParser()
args.add_argument("--accum", type=int)
args.add_argument("--gbs", type=int)
a = args.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
with open(os.path.join(os.environ["SWEEP_TRIAL_DIR"], f"rank{rank}-{os.getpid()}.json"), "w") as f:
    json.dump({"world": world, "port": os.environ["MASTER_PORT"], "cwd": os.getcwd()}, f)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ends = [time.perf_counter()]
for step in range(12):
    for _ in range(a.accum):
        model(torch.randn(a.gbs // (world * a.accum), 16)).sum().backward()
    time.sleep(0.02)
    opt.step()
    opt.zero_grad()
    ends.append(time.perf_counter())
for epoch in (1, 2, 3):  # its own figure, as Myrtle's DLL line gives it: the global batch over its steps' mean time
    took = (ends[4 * epoch] - ends[4 * epoch - 4]) / 4
    if rank == 0:
        print(f"DLL 2024-01-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : {a.gbs / took:.2f} | train_avg_took : {took:.4f}", flush=True)
dist.destroy_process_group()
'''


# accum=2's screening trial (one rank) holds the screening phase open until the test's `go` file; accum=1 leads by 2x.
GATED = r'''
import os, sys, time
accum, ndev = int(sys.argv[1]), int(sys.argv[2])
here = os.path.dirname(os.path.abspath(__file__))
if ndev == 1 and accum == 2:
    open(os.path.join(here, "screening"), "w").close()
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(here, "go")) and time.time() < deadline:
        time.sleep(0.05)
speed = 1000.0 / accum
for epoch in (1, 2, 3):
    print(f"DLL 2024-01-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : {speed:8.2f} | train_avg_took : {0.016 * accum:6.2f}", flush=True)
'''
