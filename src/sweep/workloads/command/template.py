"""The command's argv template: its placeholders, how they are filled, and what is checked before launch.

Placeholders take only the candidate's validated integers and the launch's own values (a host
name, a port), never a config string, so no value can inject a command; the argv runs as a list,
never through a shell.
"""

from __future__ import annotations

import os
import shutil
import string
from collections.abc import Mapping, Sequence
from pathlib import Path

from sweep.core.space import PairNumbers
from sweep.errors import TemplateError

# The candidate's numbers (TrialSpec.numbers) and the launch's (one launcher per node: the
# command's own launcher, torchrun/deepspeed/accelerate, starts the ranks from these).
# {num_devices} is every node's ranks together (a world size: accelerate's --num_processes, caiman-asr's
# --num_gpus); {nproc_per_node} is the ranks this node's launcher starts (torchrun's
# --nproc_per_node, deepspeed's --num_gpus, Lightning's trainer.devices): the two differ on several nodes.
# {accum_x_devices} is the micro-batches of one optimizer step over every rank (accum x num_devices), for a script
# whose accumulation flag counts them all and divides by its world size itself (nanoGPT's --gradient_accumulation_steps).
NUMBER_PLACEHOLDERS = ("accum", "split", "per_device_batch", "joint_batch", "global_batch_size", "num_devices", "nproc_per_node",
                       "accum_x_devices")
LAUNCH_PLACEHOLDERS = ("nodes", "node_rank", "master_addr", "master_port")
PLACEHOLDERS = NUMBER_PLACEHOLDERS + LAUNCH_PLACEHOLDERS
# Those that differ between pairs: a command using none of them measures the same thing every trial.
BATCH_PLACEHOLDERS = ("accum", "split", "per_device_batch", "joint_batch", "accum_x_devices")
# Those that tell the pairs of one accum apart: without them the space is accum alone.
SPLIT_PLACEHOLDERS = ("split", "joint_batch")
# Launchers and interpreters whose first non-option argument is the script they run.
_SCRIPT_RUNNERS = ("python", "python3", "torchrun", "deepspeed", "accelerate", "pypy3")


def template_fields(text: str) -> list[str]:
    """The placeholder names in one template string; format specs and attribute access are refused."""
    names = []
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as e:
        raise TemplateError(f"{text!r} is not a valid template ({e}); write placeholders as {{accum}}, literal braces as {{{{ }}}}") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PLACEHOLDERS or spec or conversion:
            raise TemplateError(
                f"{text!r} uses placeholder {{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}: "
                f"valid placeholders are {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
            )
        names.append(name)
    return names


def fields_used(argv: Sequence[str], env: Mapping[str, str]) -> set[str]:
    return {name for part in [*argv, *env.values()] for name in template_fields(str(part))}


def check_template(argv: Sequence[str], env: Mapping[str, str]) -> None:
    if not argv:
        raise TemplateError("workload.argv is empty: give the training command as a list, e.g. [python, train.py, --grad_accumulation_batches={accum}]")
    for part in [*argv, *env.values()]:
        if not isinstance(part, str):
            raise TemplateError(f"workload.argv/env value {part!r} is not a string: quote it in YAML")
        template_fields(part)
    if not fields_used(argv, env) & set(BATCH_PLACEHOLDERS):
        raise TemplateError(
            "workload.argv and workload.env use none of {accum}, {split}, {per_device_batch}, {joint_batch}, {accum_x_devices}: every pair would "
            "run the same command; pass the batch to the script, e.g. --batch_size={per_device_batch} --grad_accum={accum}"
        )


def unjoined_nodes(argv: Sequence[str], env: Mapping[str, str], nodes: int) -> str:
    """One line where a trial spans several nodes but the command names nothing that joins them; "" otherwise."""
    if nodes <= 1 or fields_used(argv, env) & {"nodes", "node_rank", "master_addr"}:
        return ""
    return (
        f"machine.nodes={nodes}, but workload.argv and workload.env name none of {{nodes}}, {{node_rank}}, {{master_addr}}: "
        f"each node starts the command on its own, a world of its own unless the script joins the nodes itself from "
        f"Slurm's variables; launch it with torchrun --nnodes={{nodes}} --node_rank={{node_rank}} --master_addr={{master_addr}} "
        f"--master_port={{master_port}} (docs/slurm.md, Trials over several nodes)"
    )


def uses_split(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether the command can tell two pairs of one accum apart (else the sweep is over accum alone)."""
    return bool(fields_used(argv, env) & set(SPLIT_PLACEHOLDERS))


def pair_values(numbers: PairNumbers) -> dict[str, int]:
    """A trial's numbers (TrialSpec.numbers) with what the template derives from them: {accum_x_devices}."""
    return {
        "accum": numbers["accum"], "split": numbers["split"], "per_device_batch": numbers["per_device_batch"], "joint_batch": numbers["joint_batch"],
        "global_batch_size": numbers["global_batch_size"], "num_devices": numbers["num_devices"],
        "accum_x_devices": numbers["accum"] * numbers["num_devices"],
    }


def fill(text: str, values: Mapping[str, int | str]) -> str:
    """One template string with the trial's values; numbers as integers, the host and port as given."""
    template_fields(text)
    return text.format(**{k: (int(v) if k in NUMBER_PLACEHOLDERS else v) for k, v in values.items()})


def script_arguments(argv: Sequence[str]) -> list[str]:
    """The argv elements that name a script the command needs: any plain element ending in .py, and the
    argument right after python/torchrun/deepspeed (after `accelerate launch`) when it is not an option."""
    runner = os.path.basename(argv[0]) if argv else ""
    first = 2 if runner.startswith("accelerate") and argv[1:2] == ["launch"] else 1
    is_runner = any(runner == r or runner.startswith(r + ".") or runner.startswith(r + "3") for r in _SCRIPT_RUNNERS)
    found = []
    for i, part in enumerate(argv[1:], start=1):
        if "{" in part or "=" in part or part.startswith("-"):
            continue  # an option, or a value filled per trial
        if part.endswith(".py") or (is_runner and i == first):
            found.append(part)
    return found


def missing_paths(argv: Sequence[str], cwd: str) -> str:
    """One line naming the first thing the command needs that is not here (cwd, interpreter, script); "" if none."""
    if not os.path.isdir(cwd):
        return f"workload.cwd={cwd!r} is not a directory: the command runs there; give an existing directory"
    exe = argv[0]
    if "{" not in exe:
        found = os.access(Path(cwd, exe), os.X_OK) if os.sep in exe else shutil.which(exe) is not None
        if not found:
            return f"workload.argv[0]={exe!r} is not an executable on PATH: give the full path or install it"
    for script in script_arguments(argv):
        if not (Path(cwd) / script).is_file():
            return f"workload.argv names {script!r}, which is not a file in {cwd}: run sweep from the script's directory or set workload.cwd"
    return ""
