"""Typed config schemas of the sweep itself (plain dataclasses; Hydra registers them in sweep.cli.config).

`conf/*.yaml` extend these schemas, so a typo or a wrong type in YAML or on the
command line fails at composition time with the key named, before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class MachineConfig:
    name: str = "local"  # profile name, shown in the table and in results
    device: str = "cpu"  # "cpu" or "cuda": what each trial trains on
    num_devices: int = 1  # devices per trial in all (data-parallel ranks)
    nodes: int = 1  # hosts per trial; num_devices is split evenly across them
    memory_gib: float = 0.0163  # device memory per device; on CPU the emulated budget each rank may allocate
    cpu_threads: Optional[int] = None  # torch intra-op threads per rank; None: torch's default
    description: str = ""  # one line for humans, e.g. "8 x A100 80GB SXM"
    # Run-to-run noise: the relative sd of one pair's throughput between fresh trial processes here,
    # beyond what a trial's own step scatter shows (clocks, placement, neighbours). The confidence score
    # cannot tell pairs apart more finely. None: RUN_TO_RUN_NOISE[device]. Estimate it from sweeps that
    # measured the same pairs: sweep.run_to_run(sweep.load("outputs/*")).
    run_to_run_noise: Optional[float] = None


@dataclass
class TrialConfig:
    warmup_steps: int = 2  # optimizer steps run and discarded before timing (the seed compares epoch 2)
    measure_steps: int = 8  # timed optimizer steps; throughput is their median. The minimum when measuring adaptively
    # Adaptive measurement: keep timing steps until the 95% interval of the median throughput is
    # within +-target_precision of it (0.02: +-2%), as core/measure.py's enough_measured decides.
    target_precision: float = 0.02
    max_measure_steps: int = 32  # cap on timed steps however noisy the trial (>= measure_steps)
    time_limit_s: float = 300.0  # a trial still running after this is stopped and recorded as timeout
    seed: int = 0  # data seed, identical for every candidate
    # Fraction of device capacity an ok pair must leave free at its peak, in [0, 0.5); below it the pair
    # is marked tight and not recommended over a roomier one ("fits in the finder, OOMs in training").
    # None: MEMORY_MARGIN[machine.device].
    memory_margin: Optional[float] = None


@dataclass
class SearchConfig:
    name: str = "grid"  # grid | staircase | powers
    max_trials: Optional[int] = None  # stop after this many launched trials; None: the strategy decides
    # Skip pairs the memory model (core/memory_model.py) predicts to exceed machine.memory_gib with
    # probability >= 0.95, fitted on the peaks measured so far; false: launch them to find out.
    trust_memory_model: bool = True
    # Stop a running trial once its interval lies wholly below the leader's (orchestration/racing.py);
    # false: every trial measures to its own end, e.g. for repeats that sweep.run_to_run compares.
    racing: bool = True
    # At the end, re-time the leader and the runner-up briefly (trial.measure_steps timed steps each) and,
    # when they moved more than machine.run_to_run_noise allows, score the confidence with the noise seen
    # (core/drift.py); false: trust machine.run_to_run_noise as given.
    drift_check: bool = True
    # Measure to the decision (core/decision.py, with racing on): also stop a running trial once the
    # throughput ordering rules it out, or once its interval already lies above every rival's, instead
    # of timing each pair to trial.target_precision or the cap; false: racing's rule alone.
    measure_to_decision: bool = True
    # Parallel screening with machine.num_devices=N > 1 (core/screening.py): first every candidate as a
    # one-rank trial at global_batch_size / N, N at a time, one per device (one-GPU jobs on Slurm), kept
    # in <sweep dir>/screening/; then the pairs inside the leader's noise as full N-device trials, which
    # the table and recommendation rest on. auto: on CUDA only (CPU ranks would share cores); on; off.
    screen: str = "auto"


@dataclass
class SweepConfig:
    # Samples per optimizer step over all devices. 1024 for RNN-T on 8 devices (the GPU profiles);
    # 128 on one device is one rank's share of that, so the CPU demo searches the same 35 pairs.
    global_batch_size: int = 128
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
    # Built-in trials of one device on the local launcher run in a warm worker per device group, which pays
    # interpreter start, imports and the CUDA context once (launch/warm_pool.py); false: a fresh process per trial.
    warm_workers: bool = True


# machine.run_to_run_noise when unset, by device. cuda: the confidence score's calibrated floor (fresh
# processes at a realistic model scale agreed within 0.3% on one GPU); cpu: sweep.run_to_run over 5
# back-to-back sweeps of the same 3 pairs on a shared 2-core host (docs/search.md, "Run-to-run noise").
RUN_TO_RUN_NOISE = {"cpu": 0.07, "cuda": 0.01}


def run_to_run_noise(machine: Any) -> float:
    """The machine's run-to-run noise: its own setting, else its device's default."""
    configured = machine.run_to_run_noise
    return float(configured) if configured is not None else RUN_TO_RUN_NOISE[machine.device]


# trial.memory_margin when unset, by device.
# cuda: after Lightning's BatchSizeFinder, which takes 5% off the batch it finds since batch sizes that
# "fit in the finder" crashed once training started (Lightning #21154, margin=0.05); here it is room
# left at the reserved peak, what the card really loses. Not yet checked on a GPU here.
# cpu: the emulated budget caps the address space, and under the cap the allocator reuses freed memory,
# so a trial's capped peak understates its uncapped need by up to about 5%: the built-in workload's
# accum=2 split=4 peaked at 19.3-20.5 MiB of 20.48 and ran out of memory at a late step in about 1 run
# in 10, while the next roomiest pair peaked at 16.2 MiB at most (docs/gpus.md, "Headroom and tight").
MEMORY_MARGIN = {"cpu": 0.1, "cuda": 0.05}


def memory_margin(trial: Any, machine: Any) -> float:
    """The headroom below which an ok pair is tight: the trial's own setting, else its device's default."""
    configured = trial.memory_margin
    return float(configured) if configured is not None else MEMORY_MARGIN[machine.device]
