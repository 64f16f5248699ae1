"""A probe that does not tilt the answer (issue 50): what it does per step does not grow with the accumulation. No record
per backward pass; where no torch.optim optimizer exists, one wait for the device a step (the pass that ends it, which
times the step) and a watched-parameter comparison a few times a step, not at every pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.probe import probe_env

ATTACK = Path(__file__).parent / "attack_train.py"
STEPS = 12

# Runs a hand-written loop with its own parameter update (no torch.optim: the probe times its backward passes and
# watches a parameter), counting the probe's device waits and its comparisons of the watched parameter.
COUNTING_LOOP = r"""
import json, sys
import torch
import _sweep_probe

probe = _sweep_probe.PROBE
counts = {"syncs": 0, "compares": 0, "passes": 0}
sync = probe._sync
def counting_sync():
    counts["syncs"] += 1
    sync()
probe._sync = counting_sync
equal = torch.equal
def counting_equal(*args, **kwargs):
    counts["compares"] += 1
    return equal(*args, **kwargs)
torch.equal = counting_equal
accum, steps = int(sys.argv[1]), int(sys.argv[2])
net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
for step in range(steps):
    for micro in range(accum):
        net(torch.randn(4, 8)).pow(2).mean().backward()
        counts["passes"] += 1
    with torch.no_grad():
        for p in net.parameters():
            p -= 1e-3 * p.grad
            p.grad = None
print(json.dumps(counts))
"""


def _run_loop(tmp_path: Path, accum: int) -> dict[str, int]:
    env = {**os.environ, **probe_env(tmp_path / f"loop{accum}", base_env=os.environ, accum=accum), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", COUNTING_LOOP, str(accum), str(STEPS)], env=env, check=True, capture_output=True,
                         text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_with_no_torch_optimizer_the_probe_waits_for_the_device_once_a_step_and_samples_a_few_times_a_step(tmp_path):
    """The device wait (a CUDA synchronise) once per step, at the pass that ends it, not at every backward pass; and
    the watched parameter compared at most three times a step (torch.equal reads its result on the host: on CUDA a wait
    each time), not at every pass. The update evidence is unchanged: updates every accum passes."""
    from sweep.core.probe_report import backward_per_update
    from sweep.probe import read_probe

    one, eight = _run_loop(tmp_path, 1), _run_loop(tmp_path, 8)
    assert one["passes"] == STEPS and eight["passes"] == 8 * STEPS
    assert one["syncs"] <= STEPS + 1 and eight["syncs"] <= STEPS + 1, (one, eight)
    assert eight["compares"] <= 3 * STEPS, eight
    assert backward_per_update(read_probe(tmp_path / "loop8")) == 8.0
    assert backward_per_update(read_probe(tmp_path / "loop1")) == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["none", "own_optimizer"])
def test_the_records_written_a_step_do_not_grow_with_the_accumulation(tmp_path, attack):
    """One record per backward pass made the probe's cost grow with accum (a JSON line and a flush each): accum=8 wrote
    eight records a step more than accum=1. Now the passes are counted in memory (the step record holds the count), or,
    where they time the steps (no torch.optim optimizer), written in batches."""
    lines = {}
    for accum in (1, 8):
        record_dir = tmp_path / f"{attack}{accum}"
        env = {**os.environ, **probe_env(record_dir, base_env=os.environ, accum=accum), "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, str(ATTACK), "--batch=2", f"--accum={accum}", f"--global-batch={2 * accum}", f"--steps={STEPS}",
                        f"--attack={attack}", f"--rates={accum}:1=100000"], env=env, check=True, capture_output=True, timeout=120)
        lines[accum] = sum(len(path.read_text().splitlines()) for path in record_dir.glob("*.jsonl"))
    assert lines[8] <= lines[1] + 3, lines
    assert lines[1] <= 3 * STEPS, lines  # a record or two a step, not one a pass
