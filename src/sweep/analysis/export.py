"""The recommendation in the forms users paste (pure).

Every function takes the Recommendation that core/recommendation.recommendation() returns
(recommendation.yaml is its to_record(); Recommendation.from_record reads it back)
and returns text: no I/O, no imports beyond the standard library and the core.
"""

from __future__ import annotations

import shlex
import string

from sweep.core.recommendation import Recommendation, cli_flags

FORMS = ("flags", "yaml", "nemo", "slurm")

# Placeholders: any key of recommendation.yaml with a number or text value, plus {flags}; see slurm_command.
DEFAULT_TRAIN_COMMAND = "python train.py --global_batch_size={global_batch_size} {flags}"


def _check(rec: Recommendation | None) -> Recommendation:
    if rec is None:
        raise ValueError("no recommendation yet: no trial has run ok")
    return rec


def flags(rec: Recommendation | None) -> str:
    """The training command's own flags as the sweep wrote them (e.g. nanoGPT's `--batch_size=16
    --gradient_accumulation_steps=2`); for the Myrtle.ai script `--grad_accumulation_batches=N --batch_split_factor=M`."""
    rec = _check(rec)
    return rec.flags or cli_flags(rec.accum, rec.split)


def yaml_snippet(rec: Recommendation | None) -> str:
    """Config keys to paste into a YAML training config (ints only, so no YAML library needed)."""
    rec = _check(rec)
    text = f"global_batch_size: {rec.global_batch_size}\ngrad_accumulation_batches: {rec.accum}\n"
    if not rec.splits_apply:  # a 1-D sweep (micro-batch x accumulation): the framework has no split, so none is written
        return f"{text}per_device_batch_size: {rec.per_device_batch}\n"
    return f"{text}batch_split_factor: {rec.split}\n"


def nemo_overrides(rec: Recommendation | None) -> str:
    """NeMo/Lightning-style overrides. NeMo has no batch-split knob, so split is not expressible here."""
    rec = _check(rec)
    return (
        f"data.micro_batch_size={rec.per_device_batch} "
        f"data.global_batch_size={rec.global_batch_size} "
        f"trainer.accumulate_grad_batches={rec.accum}"
    )


def train_command(rec: Recommendation | None, template: str = DEFAULT_TRAIN_COMMAND) -> str:
    """The training command with the recommendation filled into `template`'s {placeholders}."""
    rec = _check(rec)
    values = {k: v for k, v in rec.to_record().items() if isinstance(v, (int, float, str))}
    values["flags"] = flags(rec)
    names = [name for _, name, _, _ in string.Formatter().parse(template) if name]
    unknown = sorted(set(names) - set(values))
    if unknown:
        raise ValueError(
            f"train command template {template!r} uses unknown placeholder(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(values))}"
        )
    return template.format(**values)


def slurm_command(
    rec: Recommendation | None, *, nodes: int = 1, template: str = DEFAULT_TRAIN_COMMAND
) -> str:
    """An `sbatch --wrap` line with one task per device, the devices spread evenly over `nodes`.

    The wrapped command runs once per job as written; for more than one node put
    the launcher the training script expects (e.g. `srun`) into the template.
    """
    rec = _check(rec)
    devices = rec.num_devices
    if nodes < 1 or devices % nodes:
        raise ValueError(f"nodes={nodes} does not divide num_devices={devices}: use a divisor of {devices}")
    per_node = devices // nodes
    cmd = train_command(rec, template)
    # Double quotes read best and match what users type; fall back to shell quoting when they would break.
    wrapped = f'"{cmd}"' if not any(ch in cmd for ch in '"$`\\') else shlex.quote(cmd)
    return (
        f"sbatch --nodes={nodes} --gpus-per-node={per_node} --ntasks-per-node={per_node} "
        f"--wrap {wrapped}"
    )


def render(form: str, rec: Recommendation | None, *, nodes: int = 1, template: str = DEFAULT_TRAIN_COMMAND) -> str:
    """One export form by name (see FORMS), without a trailing newline."""
    if form == "flags":
        return flags(rec)
    if form == "yaml":
        return yaml_snippet(rec).rstrip("\n")
    if form == "nemo":
        return nemo_overrides(rec)
    if form == "slurm":
        return slurm_command(rec, nodes=nodes, template=template)
    raise ValueError(f"unknown export form {form!r}: expected one of {', '.join(FORMS)}")


def all_forms(rec: Recommendation | None, *, nodes: int = 1, template: str = DEFAULT_TRAIN_COMMAND) -> dict[str, str]:
    return {form: render(form, rec, nodes=nodes, template=template) for form in FORMS}
