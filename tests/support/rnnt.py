"""The built-in RNN-T workload measured as a trial measures it, for a child process of the test (tests/test_rnnt.py)."""

from __future__ import annotations

import torch

from sweep.core.schema import PHASE_JOINT
from sweep.workloads.rnnt.config import RNNTWorkloadConfig
from sweep.workloads.rnnt.memory import PeakMemory, configure_cpu_allocator
from sweep.workloads.rnnt.model import RNNTWorkload

CPU = torch.device("cpu")


def joint_phase_peaks(cfg: RNNTWorkloadConfig, splits: tuple[int, ...]) -> dict[int, int]:
    """{split: the joint phase's resident peak above what the encoder holds}, measured as a trial measures:
    in a fresh process whose allocator is configured before the first tensor (run in a child process)."""
    torch.set_num_threads(1)
    configure_cpu_allocator()  # as a trial does: big tensors get their own mappings, freed on release
    w = RNNTWorkload(cfg, CPU)
    w.warm_up(8)
    peaks, meter, previous = {}, PeakMemory(CPU), [None]

    def on_phase(phase):
        if phase == PHASE_JOINT:
            meter.rebase()  # the joint alone, above what the encoder already holds
        elif previous[0] == PHASE_JOINT:
            peaks[split] = meter.peak_bytes()
        previous[0] = phase

    w.on_phase = on_phase
    for split in splits:
        w.gradients(per_device_batch=8, accum=1, split=split)
    return peaks
