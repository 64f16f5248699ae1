"""What one trial job is told: a frozen, typed spec the plan builds once per candidate.

It is pickled into the submitit job, so it holds only plain dataclasses (the machine,
the workload's own config schema, the trial settings) and the numbers of the candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sweep.core.config import MachineConfig, TrialConfig
from sweep.core.space import Candidate, PairNumbers


@dataclass(frozen=True)
class TrialSpec:
    accum: int  # grad_accumulation_batches
    split: int  # batch_split_factor
    per_device_batch: int  # global_batch_size / (accum * num_devices)
    joint_batch: int  # per_device_batch / split
    global_batch_size: int  # samples per optimizer step over all devices
    num_devices: int  # devices (data-parallel ranks) of the trial in all
    machine: MachineConfig
    workload: Any  # the workload's own config dataclass (sweep.workloads registry)
    trial: TrialConfig
    trial_dir: str  # where the trial writes its result.json (and any files of its own)
    # The sweep's configuration fingerprint (core/fingerprint.py): the trial stamps it on its
    # result.json, so a result is only ever adopted by a sweep with the same settings.
    fingerprint: str = ""

    @property
    def key(self) -> str:
        return f"accum{self.accum}_split{self.split}"

    def numbers(self) -> PairNumbers:
        """The candidate's integers by name: what a command template may use, and a record's first fields."""
        pair = Candidate(self.accum, self.split, self.per_device_batch, self.joint_batch)
        return pair.numbers(self.global_batch_size, self.num_devices)
