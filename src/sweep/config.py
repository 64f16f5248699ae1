"""Typed config schemas, registered in Hydra's ConfigStore.

`conf/*.yaml` extend these schemas, so a typo or a wrong type in YAML or on the
command line fails at composition time with the key named, before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class MachineConfig:
    name: str = "local"  # profile name, shown in the table and in results
    device: str = "cpu"  # "cpu" or "cuda": what each trial trains on
    num_devices: int = 1  # devices per trial in all (data-parallel ranks)
    nodes: int = 1  # hosts per trial; num_devices is split evenly across them
    memory_gib: float = 0.02  # device memory per device; on CPU the emulated budget each rank may allocate
    cpu_threads: Optional[int] = None  # torch intra-op threads per rank; None: torch's default
    description: str = ""  # one line for humans, e.g. "8 x A100 80GB SXM"


@dataclass
class RNNTWorkloadConfig:
    name: str = "rnnt"  # the built-in PyTorch RNN-T training step
    feat_dim: int = 40  # input features per frame (e.g. log-mel bins)
    frames: int = 160  # input frames per utterance, before subsampling
    subsample: int = 2  # time-stacking factor in front of the encoder
    label_len: int = 8  # target tokens per utterance (U)
    vocab: int = 448  # output vocabulary incl. blank (V)
    enc_hidden: int = 16  # encoder LSTM width
    enc_layers: int = 16  # encoder LSTM depth
    pred_hidden: int = 32  # prediction-network width
    joint_hidden: int = 32  # joint-network width
    optimizer: str = "adam"  # "adam" (state = 2x params) or "sgd"
    seed: int = 0  # model init and synthetic data


@dataclass
class CommandWorkloadConfig:
    name: str = "command"  # an external training command, one process per trial
    argv: List[str] = field(default_factory=list)  # argv template; placeholders like {accum}, {split}
    env: Any = field(default_factory=dict)  # extra environment variables (values may use placeholders)
    cwd: Optional[str] = None  # working directory for the command; None: the trial dir
    parser: Any = field(default_factory=dict)  # how throughput is read from the log (see sweep.parsers)
    splits_apply: bool = True  # False: the script has no batch_split_factor; the space is 1-D
    phase_patterns: Any = None  # {encoder|joint|optimizer: [regex on traceback frames]}; None: the RNN-T defaults


@dataclass
class TrialConfig:
    warmup_steps: int = 2  # optimizer steps run and discarded before timing (the seed compares epoch 2)
    measure_steps: int = 8  # timed optimizer steps; throughput is their median
    time_limit_s: float = 300.0  # a trial still running after this is stopped and recorded as timeout
    seed: int = 0  # data seed, identical for every candidate


@dataclass
class SearchConfig:
    name: str = "grid"  # grid | staircase | powers
    max_trials: Optional[int] = None  # stop after this many launched trials; None: the strategy decides


@dataclass
class SweepConfig:
    global_batch_size: int = 16  # samples per optimizer step over all devices (1024 for RNN-T)
    accum: Any = None  # grad_accumulation_batches to try; None: every valid power of two
    split: Any = None  # batch_split_factor to try; None: powers of two up to the per-device batch
    machine: MachineConfig = field(default_factory=MachineConfig)
    workload: Any = None  # one of the `workload` group's schemas
    search: SearchConfig = field(default_factory=SearchConfig)
    trial: TrialConfig = field(default_factory=TrialConfig)
    max_in_flight: int = 1  # trials running at once; CPU trials must not share cores, so 1 here
    dry_run: bool = False  # print the candidate table and exit; nothing is launched
    resume: Optional[str] = None  # an earlier sweep dir: rerun its command there, reusing finished trials
    live: Optional[bool] = None  # live table; None: only when stdout is a terminal
    keep_jobs_on_interrupt: bool = False  # Ctrl-C leaves this sweep's running jobs alone (resume picks them up)


def register_configs() -> None:
    from omegaconf import OmegaConf

    # Profiles derive per-node launcher settings from the machine: ${sweep_div:${machine.num_devices},${machine.nodes}}.
    if not OmegaConf.has_resolver("sweep_div"):
        OmegaConf.register_new_resolver("sweep_div", lambda a, b: int(a) // int(b))
    cs = ConfigStore.instance()
    cs.store(name="sweep_schema", node=SweepConfig)
    cs.store(group="machine", name="machine_schema", node=MachineConfig, package="machine")
    cs.store(group="workload", name="rnnt_schema", node=RNNTWorkloadConfig, package="workload")
    cs.store(group="workload", name="command_schema", node=CommandWorkloadConfig, package="workload")
    cs.store(group="search", name="search_schema", node=SearchConfig, package="search")
