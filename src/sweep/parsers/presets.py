"""What sweep knows about each training framework: `workload.parser.type=NAME` (pure data).

A preset names the line parser, the figure it reads and its unit and scope, the warm-up
to skip, and the framework's own flags for the micro-batch and gradient accumulation, so
a 1-D sweep (`splits_apply: false`) can print a recommendation in the framework's terms:

    preset = get_preset("nanogpt")
    preset.recommend(per_device_batch=16, accum=2)   # "--batch_size=16 --gradient_accumulation_steps=2"
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep.parsers.frameworks import (
    DeepSpeedParser,
    FairseqParser,
    HFTrainerParser,
    LightningParser,
    MegatronParser,
    NanochatParser,
    NanoGPTParser,
    TimmParser,
    TorchTitanParser,
)
from sweep.parsers.lines import LineParser
from sweep.parsers.throughput import (
    BATCHES_PER_S,
    MS_PER_STEP,
    S_PER_BATCH,
    S_PER_STEP,
    SAMPLES_PER_S,
    STEPS_PER_S,
    TOKENS_PER_S,
)


@dataclass(frozen=True)
class Preset:
    name: str  # workload.parser.type
    framework: str  # as people call it
    source: str  # where the figure is printed (repository file)
    figure: str  # what is read, in the framework's words
    units: tuple[str, ...]  # figure units read, preferred first (sweep.parsers.throughput)
    per_device: bool  # the figure is one device's share; scaled by the device count
    skip_first: int  # warm-up figures (epochs for warmup_by="epochs") skipped by default
    micro_batch_flag: str | None  # the framework's flag for the per-device (micro-)batch; None: derived
    accum_flag: str | None  # its flag for gradient accumulation; None: derived from the global batch
    global_batch_flag: str | None = None  # where accumulation is derived, the flag that sets the global batch
    warmup_by: str = "figures"  # "figures" or "epochs"
    splits_apply: bool = False  # True: the framework has a batch_split_factor (Myrtle's joint split)
    flag_style: str = "--{flag}={value}"  # how a flag and its value are written on the command line
    warmup_reason: str = ""  # why the first figures are skipped
    accum_flag_is_total: bool = False  # the accumulation flag counts micro-batches over all devices (nanoGPT)
    global_batch_in_tokens: bool = False  # the global batch flag counts tokens (nanochat): left as the user set it
    # The line parser for the framework's own log lines (parsers/frameworks.py); None: a general format reads it
    # (myrtle's dllogger lines: parsers/formats.py). A preset is declared here once: its parser, its flags, and its
    # shipped sweeps/<name>.yaml are all found from this one entry (docs/development.md, "Adding a log preset").
    parser: Callable[[], LineParser] | None = None

    @property
    def unit(self) -> str:
        """The unit of the preferred figure."""
        return self.units[0]

    def flags_template(self) -> str:
        """The framework's flags with {placeholders} (per_device_batch, accum, accum_x_devices, global_batch_size)."""
        parts = []
        if self.micro_batch_flag:
            parts.append(self._flag(self.micro_batch_flag, "{per_device_batch}"))
        if self.accum_flag:
            parts.append(self._flag(self.accum_flag, "{accum_x_devices}" if self.accum_flag_is_total else "{accum}"))
        elif self.global_batch_flag and not self.global_batch_in_tokens:
            parts.append(self._flag(self.global_batch_flag, "{global_batch_size}"))
        return (", " if self.flag_style.startswith('"') else " ").join(parts)

    def recommend(self, *, per_device_batch: int, accum: int, global_batch_size: int | None = None, num_devices: int = 1) -> str:
        """The framework's own flags for a chosen candidate, e.g. `--batch_size=16 --gradient_accumulation_steps=2`."""
        gbs = global_batch_size if global_batch_size is not None else per_device_batch * accum * num_devices
        return self.flags_template().format(
            per_device_batch=per_device_batch, accum=accum, accum_x_devices=accum * num_devices, global_batch_size=gbs
        )

    def _flag(self, flag: str, value: str) -> str:
        if flag.startswith("-") or "=" in flag:
            return f"{flag}={value}"
        return self.flag_style.format(flag=flag, value=value)


_PRESETS = (
    Preset(
        "myrtle", "caiman-asr (Myrtle.ai)", "caiman_asr_train/train.py (dllogger)",
        "train throughput-audio-samples-per-sec (v1.12+) / avg train utts/s (to v1.11)", (SAMPLES_PER_S,), False, 1,
        None, "grad_accumulation_batches", "global_batch_size", warmup_by="epochs", splits_apply=True,
        warmup_reason="the first epoch includes warm-up and validation",
    ),
    Preset(
        "nanogpt", "nanoGPT", "karpathy/nanoGPT train.py", "time ...ms (per iter)", (MS_PER_STEP,), False, 5,
        "batch_size", "gradient_accumulation_steps",
        warmup_reason="iter 0 evaluates and compiles; nanoGPT itself waits 5 iters before its MFU",
        accum_flag_is_total=True,
        parser=NanoGPTParser,
    ),
    Preset(
        "megatron", "Megatron-LM", "NVIDIA/Megatron-LM megatron/training/training.py",
        "elapsed time per iteration (ms)", (MS_PER_STEP,), False, 2,
        "micro-batch-size", None, "global-batch-size",
        warmup_reason="the first iterations include allocation and NCCL set-up",
        parser=MegatronParser,
    ),
    Preset(
        "hf", "HF transformers Trainer", "huggingface/transformers trainer_callback.py, trainer.py",
        "progress bar it/s (optimizer steps), else train_samples_per_second", (STEPS_PER_S, S_PER_STEP, SAMPLES_PER_S),
        False, 5, "per_device_train_batch_size", "gradient_accumulation_steps",
        warmup_reason="tqdm's rate is smoothed over recent steps, so it carries the slow first steps for a while",
        parser=HFTrainerParser,
    ),
    Preset(
        "torchtitan", "torchtitan", "pytorch/torchtitan torchtitan/components/metrics.py", "tps", (TOKENS_PER_S,),
        True, 1, "training.local_batch_size", None, "training.global_batch_size",
        warmup_reason="step 1 includes compilation",
        parser=TorchTitanParser,
    ),
    Preset(
        "lightning", "Lightning / NeMo", "Lightning TQDMProgressBar/RichProgressBar; NVIDIA/NeMo progress printer",
        "train_step_timing in s with a global step (NeMo), Step N train_step_timing (NeMo DeltaTimingCallback), "
        "else progress bar it/s (micro-batches)",
        (S_PER_STEP, BATCHES_PER_S, S_PER_BATCH), False, 3,
        "data.micro_batch_size", "trainer.accumulate_grad_batches", flag_style="{flag}={value}",
        warmup_reason="the first steps include compilation and the sanity-check validation",
        parser=LightningParser,
    ),
    Preset(
        "deepspeed", "DeepSpeed", "microsoft/DeepSpeed deepspeed/utils/timer.py", "CurrSamplesPerSec",
        (SAMPLES_PER_S,), False, 2, "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        flag_style='"{flag}": {value}',
        warmup_reason="DeepSpeed's own timer starts at step 2",
        parser=DeepSpeedParser,
    ),
    Preset(
        "fairseq", "fairseq", "facebookresearch/fairseq fairseq/logging/progress_bar.py", "wps (train_inner)",
        (TOKENS_PER_S,), False, 1, "batch-size", "update-freq",
        warmup_reason="the first interval includes start-up",
        parser=FairseqParser,
    ),
    Preset(
        "timm", "timm (pytorch-image-models)", "huggingface/pytorch-image-models train.py", "Time: ...s, N/s",
        (SAMPLES_PER_S,), False, 1, "batch-size", "grad-accum-steps",
        warmup_reason="the first logged update includes start-up and cuDNN autotuning",
        parser=TimmParser,
    ),
    Preset(
        "nanochat", "nanochat", "karpathy/nanochat scripts/base_train.py", "tok/sec", (TOKENS_PER_S,), False, 10,
        "device-batch-size", None, "total-batch-size", global_batch_in_tokens=True,
        warmup_reason="nanochat itself leaves the first 10 steps out of its training time (compilation)",
        parser=NanochatParser,
    ),
)

PRESETS: dict[str, Preset] = {p.name: p for p in _PRESETS}

PRESET_PARSERS: dict[str, Callable[[], LineParser]] = {p.name: p.parser for p in _PRESETS if p.parser is not None}


def get_preset(name: str) -> Preset:
    """The preset called `name`; ValueError (one line, listing the valid names) otherwise."""
    if name not in PRESETS:
        raise ValueError(f"parser preset {name!r} is not known; valid presets: {', '.join(PRESETS)}")
    return PRESETS[name]


# One token of a command's argv that sets a batch knob: `--batch_size={per_device_batch}`, `trainer.x={accum}`.
_BATCH_FLAG = re.compile(r"^(?:-{1,2}[\w.-]+|[\w.+~/-]+)=[^\s{}]*\{(?:per_device_batch|accum|accum_x_devices|split|joint_batch|global_batch_size)\}[^\s]*$")


# A value token that is one batch placeholder, as in argparse's space-separated `--batch_size {per_device_batch}`.
_BATCH_VALUE = re.compile(r"^[^\s{}]*\{(?:per_device_batch|accum|accum_x_devices|split|joint_batch|global_batch_size)\}[^\s{}]*$")
_OPTION = re.compile(r"^-{1,2}[A-Za-z_][\w.-]*$")
_PLACEHOLDER = re.compile(r"(?<!\{)\{(per_device_batch|accum|accum_x_devices|split|joint_batch|global_batch_size)\}")

# What a command with no batch flag to paste is told, in one line (issue 50: a flag name here would be one its script
# may not take, and the pair in sweep's own names read as flags): that there is none, and the pair.
NO_FLAGS_TEMPLATE = (
    "none to paste: workload.argv and workload.env set no batch flag sweep can name; the pair is "
    "per_device_batch={per_device_batch} accum={accum} split={split}"
)
SWEEP_NAMES_TEMPLATE = NO_FLAGS_TEMPLATE  # the name earlier callers import

# A key that names where a run goes or what it is called, not a batch: `--run-name=a{accum}` puts the pair in a name.
_NOT_BATCH_WORDS = frozenset(
    "name names dir path file files tag tags id out output outputs log logs logdir run runs prefix suffix title label "
    "project experiment exp wandb ckpt checkpoint save seed".split()
)


def batch_flags(argv: Sequence[str]) -> list[str]:
    """The argv's batch tokens, in order: `--flag={x}` and `key={x}` tokens, a `--flag {x}` pair as one
    `--flag {x}`, a positional `{x}`; inside a shell line (`bash -c "python t.py --bs={per_device_batch}"`),
    the same among its words.

    A token that sets only the global batch is left out where another sets the accumulation: the global
    batch is the sweep's own, the same for every pair, and the user's command states it already (Myrtle's
    `--global_batch_size`); without an accumulation token it stays, as the flag the framework derives the
    accumulation from (Megatron's `--global-batch-size`).
    """
    found = _batch_tokens(argv, shell_words=True)
    sets_accum = any("{accum}" in token or "{accum_x_devices}" in token for token in found)
    return [t for t in found if not (sets_accum and set(_PLACEHOLDER.findall(t)) == {"global_batch_size"})]


def _names_a_batch(key: str) -> bool:
    """Whether a flag's key may set a batch knob: not one that names a run, a path or a tag (its words, split at
    - _ . and +, hold none of _NOT_BATCH_WORDS)."""
    return not any(word in _NOT_BATCH_WORDS for word in re.split(r"[-_.+~/]+", key.lower()) if word)


def _batch_tokens(argv: Sequence[str], shell_words: bool) -> list[str]:
    found = []
    for i, part in enumerate(argv):
        if ("$" in part or "`" in part) and not any(c.isspace() for c in part):
            continue  # a shell expansion computes the value (`--ga=$(({accum}*1))`): no flag to paste
        if _BATCH_FLAG.match(part):
            if _names_a_batch(part.split("=", 1)[0]):
                found.append(part)
        elif _BATCH_VALUE.match(part):
            before = argv[i - 1] if i > 0 else ""
            if _OPTION.match(before):
                if _names_a_batch(before):
                    found.append(f"{before} {part}")
            elif shell_words:  # the command's own positional batch argument: `train.py {per_device_batch}`
                found.append(part)
            # A positional word inside a shell line is an argument of whatever precedes it (`$((`, echo, ...): not a flag.
        elif shell_words and _PLACEHOLDER.search(part) and any(c.isspace() for c in part):
            try:  # a shell line: its words, one level deep (a quoted JSON config inside it is one word, not read)
                words = shlex.split(part)
            except ValueError:
                continue  # unbalanced quotes: not a shell line sweep can read
            found += _batch_tokens(words, shell_words=False)
    return found


def env_flags(env: Mapping[str, Any] | None) -> list[str]:
    """`NAME={x}` for each workload.env variable whose value is one batch placeholder: a prefix the user can paste
    before their command, where the batch goes through the environment."""
    return [f"{name}={value}" for name, value in (env or {}).items()
            if isinstance(value, str) and re.fullmatch(r"\{(?:per_device_batch|accum|accum_x_devices|split|joint_batch)\}", value)
            and re.fullmatch(r"[A-Za-z_]\w*", str(name))]


def flags_template(parser_type: str, argv: Sequence[Any] = (), env: Mapping[str, Any] | None = None) -> str:
    """How a command's recommendation is written, with {placeholders}: one rule for every command.

    The argv's own batch tokens (batch_flags), since those are the flags the user's script takes, whatever
    parser reads its log (the default parser, myrtle, included: Myrtle's names appear only where the argv
    has them); else a framework preset's flags (DeepSpeed's JSON config keys, when a shell line writes its
    config); else the pair in sweep's own names (SWEEP_NAMES_TEMPLATE). "" (Myrtle's own flags, ranking.cli_flags)
    is for the built-in workload alone, which has no argv and never calls this.
    """
    found = batch_flags([a for a in argv if isinstance(a, str)])
    if found:
        return " ".join(found)
    from_env = env_flags(env)
    if from_env:
        return " ".join(from_env)
    preset = PRESETS.get(parser_type)
    if preset is not None and parser_type != "myrtle" and preset.flags_template():
        return preset.flags_template()
    return NO_FLAGS_TEMPLATE
