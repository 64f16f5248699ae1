"""The recommendation in the forms users paste (pure).

Every function takes the dict that ranking.recommendation() returns (the
content of recommendation.yaml) and returns text: no I/O, no imports beyond
the standard library.
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Mapping
from typing import Any

from sweep.core.ranking import cli_flags

FORMS = ("flags", "yaml", "nemo", "slurm")

# Placeholders: any key of the recommendation plus {flags}; see slurm_command.
DEFAULT_TRAIN_COMMAND = "python train.py --global_batch_size={global_batch_size} {flags}"

_REQUIRED = ("accum", "split", "per_device_batch", "global_batch_size", "num_devices")


def _check(rec: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if rec is None:
        raise ValueError("no recommendation yet: no trial has run ok")
    missing = [k for k in _REQUIRED if rec.get(k) is None]
    if missing:
        raise ValueError(f"recommendation lacks {', '.join(missing)}: not a recommendation.yaml written by sweep")
    return rec


def _one_d(rec: Mapping[str, Any]) -> bool:
    """A 1-D sweep (micro-batch x accumulation): the framework has no split, so none is written."""
    return rec.get("splits_apply") is False


def flags(rec: Mapping[str, Any] | None) -> str:
    """The training command's own flags as the sweep wrote them (e.g. nanoGPT's `--batch_size=16
    --gradient_accumulation_steps=2`); for the Myrtle.ai script `--grad_accumulation_batches=N --batch_split_factor=M`."""
    rec = _check(rec)
    if rec.get("flags"):
        return str(rec["flags"])
    return cli_flags(int(rec["accum"]), int(rec["split"]))


def yaml_snippet(rec: Mapping[str, Any] | None) -> str:
    """Config keys to paste into a YAML training config (ints only, so no YAML library needed)."""
    rec = _check(rec)
    text = f"global_batch_size: {int(rec['global_batch_size'])}\ngrad_accumulation_batches: {int(rec['accum'])}\n"
    if _one_d(rec):
        return f"{text}per_device_batch_size: {int(rec['per_device_batch'])}\n"
    return f"{text}batch_split_factor: {int(rec['split'])}\n"


def nemo_overrides(rec: Mapping[str, Any] | None) -> str:
    """NeMo/Lightning-style overrides. NeMo has no batch-split knob, so split is not expressible here."""
    rec = _check(rec)
    return (
        f"data.micro_batch_size={int(rec['per_device_batch'])} "
        f"data.global_batch_size={int(rec['global_batch_size'])} "
        f"trainer.accumulate_grad_batches={int(rec['accum'])}"
    )


def train_command(rec: Mapping[str, Any] | None, template: str = DEFAULT_TRAIN_COMMAND) -> str:
    """The training command with the recommendation filled into `template`'s {placeholders}."""
    rec = _check(rec)
    values = {k: v for k, v in rec.items() if isinstance(v, (int, float, str))}
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
    rec: Mapping[str, Any] | None, *, nodes: int = 1, template: str = DEFAULT_TRAIN_COMMAND
) -> str:
    """An `sbatch --wrap` line with one task per device, the devices spread evenly over `nodes`.

    The wrapped command runs once per job as written; for more than one node put
    the launcher the training script expects (e.g. `srun`) into the template.
    """
    rec = _check(rec)
    devices = int(rec["num_devices"])
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


def render(form: str, rec: Mapping[str, Any] | None, *, nodes: int = 1, template: str = DEFAULT_TRAIN_COMMAND) -> str:
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


def all_forms(rec: Mapping[str, Any] | None, *, nodes: int = 1, template: str = DEFAULT_TRAIN_COMMAND) -> dict[str, str]:
    return {form: render(form, rec, nodes=nodes, template=template) for form in FORMS}
