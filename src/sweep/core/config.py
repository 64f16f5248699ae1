"""Typed config schemas of the sweep itself, and the rule each value must meet.

`conf/*.yaml` extend these schemas (Hydra composes a mutable twin of each: sweep.cli.config), so a typo or a
wrong type in YAML or on the command line fails at composition time with the key named, before anything runs.
What a value must be beyond its type (a range, a choice) is declared beside its field as a `Rule`, and checked
once, at the edge (orchestration/settings.py), which turns the composed config into these frozen specs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Optional

INTEGER, NUMBER, CHOICE = "integer", "number", "choice"


@dataclass(frozen=True)
class Rule:
    """What a config value must be beyond its type; `expected` is what a refusal says is valid."""

    expected: str  # e.g. "a positive integer": the refusal reads "KEY=VALUE is not valid: expected ..."
    kind: str = NUMBER  # INTEGER (an int, not a bool), NUMBER (finite int or float), CHOICE (one of choices)
    above: Optional[float] = None  # the value must be > above
    at_least: Optional[float] = None  # the value must be >= at_least
    below: Optional[float] = None  # the value must be < below
    choices: tuple[str, ...] = ()  # CHOICE: the valid values
    optional: bool = False  # None is valid too (the device's default, say)

    def accepts(self, value: object) -> bool:
        if value is None:
            return self.optional
        if self.kind == CHOICE:
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.kind == INTEGER and not isinstance(value, int):
            return False
        return ((self.above is None or value > self.above) and (self.at_least is None or value >= self.at_least)
                and (self.below is None or value < self.below))

    def refusal(self, key: str, value: object) -> Optional[str]:
        """The one line refusing `value` at `key`, or None when the rule accepts it."""
        return None if self.accepts(value) else f"{key}={value!r} is not valid: expected {self.expected}"


def ruled(default: Any, rule: Rule) -> Any:
    """A dataclass field with its default and its rule (in the field's metadata, which OmegaConf ignores)."""
    return field(default=default, metadata={"rule": rule})


def rule_of(schema_field: Any) -> Optional[Rule]:
    found = schema_field.metadata.get("rule")
    return found if isinstance(found, Rule) else None


def refusal(spec: Any, prefix: str, schema: Optional[type] = None) -> Optional[str]:
    """The first value of `spec` whose field's rule (in `schema`, by default spec's own class) refuses it, as one
    line naming prefix+field; None when every ruled field passes."""
    for schema_field in fields(schema or type(spec)):
        rule = rule_of(schema_field)
        why = rule.refusal(prefix + schema_field.name, getattr(spec, schema_field.name)) if rule is not None else None
        if why:
            return why
    return None


def one_of(choices: tuple[str, ...]) -> Rule:
    return Rule("one of " + ", ".join(choices), CHOICE, choices=choices)


POSITIVE_INT = Rule("a positive integer", INTEGER, above=0)
OPTIONAL_POSITIVE_INT = Rule("a positive integer, or null", INTEGER, above=0, optional=True)
DEVICES = ("cpu", "cuda")
SEARCHES = ("grid", "staircase", "powers")  # core/strategies.STRATEGIES' names (tests/test_settings.py)
SCREEN_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class MachineConfig:
    name: str = "local"  # profile name, shown in the table and in results
    device: str = ruled("cpu", one_of(DEVICES))  # what each trial trains on
    num_devices: int = ruled(1, POSITIVE_INT)  # devices per trial in all (data-parallel ranks)
    nodes: int = ruled(1, POSITIVE_INT)  # hosts per trial; num_devices is split evenly across them
    # Device memory per device; on CPU the emulated budget each rank may allocate. None (unset): a budget only where one
    # was asked for: the built-in demo's emulated DEMO_MEMORY_GIB on CPU (resolved_memory_gib); a command's trials have
    # the card (CUDA) or the host's memory (CPU), and the memory model predicts nothing against a budget no one set.
    memory_gib: Optional[float] = ruled(None, Rule("a positive number of GiB, or null (unset)", above=0, optional=True))
    cpu_threads: Optional[int] = ruled(None, OPTIONAL_POSITIVE_INT)  # torch intra-op threads per rank; None: torch's default
    description: str = ""  # one line for humans, e.g. "8 x A100 80GB SXM"
    # Run-to-run noise: the relative sd of one pair's throughput between fresh trial processes here,
    # beyond what a trial's own step scatter shows (clocks, placement, neighbours). The confidence score
    # cannot tell pairs apart more finely. None: RUN_TO_RUN_NOISE[device]. Estimate it from sweeps that
    # measured the same pairs: sweep.run_to_run(sweep.load("outputs/*")).
    run_to_run_noise: Optional[float] = ruled(
        None, Rule("a relative sd in [0, 0.5), e.g. 0.01, or null for the device's default", at_least=0, below=0.5, optional=True))


@dataclass(frozen=True)
class TrialConfig:
    # Optimizer steps run and discarded before timing (the seed compares epoch 2).
    warmup_steps: int = ruled(2, Rule("an integer >= 0", INTEGER, at_least=0))
    # Timed optimizer steps; throughput is their median. The minimum when measuring adaptively.
    measure_steps: int = ruled(8, POSITIVE_INT)
    # Adaptive measurement: keep timing steps until the 95% interval of the median throughput is
    # within +-target_precision of it (0.02: +-2%), as core/measure.py's enough_measured decides.
    target_precision: float = ruled(0.02, Rule("a number in (0, 0.5), e.g. 0.02 for +-2%", above=0, below=0.5))
    # Cap on timed steps however noisy the trial (>= measure_steps, checked with it at the edge).
    max_measure_steps: int = ruled(32, POSITIVE_INT)
    # A trial still running after this is stopped and recorded as timeout (finite: submitit takes minutes).
    time_limit_s: float = ruled(300.0, Rule("a finite positive number of seconds", above=0))
    seed: int = 0  # data seed, identical for every candidate
    # Fraction of device capacity an ok pair must leave free at its peak, in [0, 0.5); below it the pair
    # is marked tight and not recommended over a roomier one ("fits in the finder, OOMs in training").
    # None: MEMORY_MARGIN[machine.device].
    memory_margin: Optional[float] = ruled(
        None, Rule("a fraction of device memory in [0, 0.5), e.g. 0.1, or null for the device's default", at_least=0, below=0.5, optional=True))


@dataclass(frozen=True)
class SearchConfig:
    name: str = ruled("grid", one_of(SEARCHES))  # core/strategies.py
    max_trials: Optional[int] = ruled(None, OPTIONAL_POSITIVE_INT)  # stop after this many launched trials; None: the strategy decides
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
    # YAML's `on` and `off` are read as the words they spell (orchestration/settings.py), not as booleans.
    screen: str = ruled("auto", one_of(SCREEN_MODES))


@dataclass(frozen=True)
class SweepConfig:
    # Samples per optimizer step over all devices. 1024 for RNN-T on 8 devices (the GPU profiles);
    # 128 on one device is one rank's share of that, so the CPU demo searches the same 35 pairs.
    global_batch_size: int = ruled(128, POSITIVE_INT)
    accum: Any = None  # grad_accumulation_batches to try; None: every valid power of two
    split: Any = None  # batch_split_factor to try; None: powers of two up to the per-device batch
    machine: MachineConfig = field(default_factory=MachineConfig)
    workload: Any = None  # one of the `workload` group's schemas
    search: SearchConfig = field(default_factory=SearchConfig)
    trial: TrialConfig = field(default_factory=TrialConfig)
    max_in_flight: int = ruled(1, POSITIVE_INT)  # trials running at once; CPU trials must not share cores, so 1 here
    dry_run: bool = False  # print the candidate table and exit; nothing is launched
    resume: Optional[str] = None  # an earlier sweep dir: rerun its command there, reusing finished trials
    live: Optional[bool] = None  # live table; None: only when stdout is a terminal
    keep_jobs_on_interrupt: bool = False  # Ctrl-C leaves this sweep's running jobs alone (resume picks them up)
    # The search goes on without the terminal (a process of its own session, its output in the sweep dir's
    # search.log); `python -m sweep.status DIR` watches it and `python -m sweep.cancel DIR` stops it.
    detach: bool = False
    # Built-in trials of one device on the local launcher run in a warm worker per device group, which pays
    # interpreter start, imports and the CUDA context once (launch/warm_pool.py); false: a fresh process per trial.
    warm_workers: bool = True


# The built-in demo's emulated device-memory budget on CPU (docs/concepts.md: 16.7 MiB past a trial's start-up
# address space, so the CPU allocator itself runs out of memory as a card would). The demo's alone: a command workload
# on a CPU host never inherits it (issue 50: it predicted OOMs of 0.296 GiB > 0.0163 GiB for pairs that fit).
DEMO_MEMORY_GIB = 0.0163


def resolved_memory_gib(memory_gib: Optional[float], device: str, builtin_demo: bool) -> Optional[float]:
    """machine.memory_gib as the sweep runs it: the user's value, else the demo's budget for the built-in workload on
    CPU, else None (no budget: the memory model predicts nothing, a trial's peak is read against what it has)."""
    if memory_gib is not None:
        return float(memory_gib)
    return DEMO_MEMORY_GIB if builtin_demo and device == "cpu" else None


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


def checked(top: Any, machine: MachineConfig, trial: TrialConfig, search: SearchConfig, workload: Any) -> TrialConfig:
    """Every level's rules, in the order a user reads them (the top level, machine, trial, search, workload); a
    ValueError with the first refusal's line, else the trial as the sweep runs it: its memory margin resolved for
    the machine's device (before the fingerprint, so a sweep records, and a rerun compares, the margin it used)."""
    why = (refusal(top, "", SweepConfig) or machine_refusal(machine) or trial_refusal(trial) or refusal(search, "search.")
           or refusal(workload, "workload."))
    if why:
        raise ValueError(why)
    return replace(trial, memory_margin=memory_margin(trial, machine))


def machine_refusal(machine: MachineConfig) -> Optional[str]:
    """Its fields' rules, then what relates them: every node runs the same number of ranks."""
    why = refusal(machine, "machine.")
    if why is None and machine.num_devices % machine.nodes:
        why = (f"machine.num_devices={machine.num_devices} is not divisible by machine.nodes={machine.nodes}: "
               "each node runs the same number of ranks")
    return why


def trial_refusal(trial: TrialConfig) -> Optional[str]:
    """Its fields' rules, then what relates them: the cap on timed steps is at least their minimum."""
    why = refusal(trial, "trial.")
    if why is None and trial.max_measure_steps < trial.measure_steps:
        why = (f"trial.max_measure_steps={trial.max_measure_steps} is not valid: expected at least "
               f"trial.measure_steps={trial.measure_steps} (the minimum)")
    return why
