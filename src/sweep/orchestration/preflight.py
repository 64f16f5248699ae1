"""Before a sweep launches: the dry run's text, and whether this host can run the plan at all."""

from __future__ import annotations

import sys

from sweep import workloads
from sweep.core.ranking import build_table
from sweep.errors import SweepError
from sweep.launch.clusters import cluster_for
from sweep.orchestration.display import format_table
from sweep.orchestration.plan import SweepPlan


def dry_run_text(plan: SweepPlan) -> str:
    rows = build_table(plan.meta, plan.candidates, {})
    valid = sum(c.valid for c in plan.candidates)
    head = (
        f"dry run: {plan.meta.machine} ({plan.meta.num_devices} x {plan.machine.device}, {memory_words(plan)}), "
        f"global_batch_size={plan.meta.global_batch_size}, "
        f"search={plan.search}: {valid} valid candidate(s), {len(plan.candidates) - valid} invalid; nothing launched"
    )
    if plan.screen:  # search.screen: what runs first (orchestration/screening.py)
        n = plan.meta.num_devices
        head += (f"\nscreening first (search.screen): the candidates as one-rank trials at global_batch_size="
                 f"{plan.meta.global_batch_size // n}, {n} at a time; then full {n}-device trials confirm the leaders")
    description = workloads.get(plan.meta.workload).describe(plan.workload)
    if description:  # the built-in model's size, say: why a split may be needed
        head += "\n" + description
    first = next((c for c in plan.candidates if c.valid), None)
    launch = workloads.get(plan.meta.workload).describe_launch(plan.spec(first, plan.sweep_dir / "trials" / first.key)) if first else ""
    if launch:  # a command: the line each node's launcher runs, so a wrong rank count shows before any trial does
        head += "\n" + launch
    return head + "\n\n" + format_table(rows, show_invalid=True)


def memory_words(plan: SweepPlan) -> str:
    """The memory each device has as the sweep counts it: a budget only where one was set (or the demo's own)."""
    if plan.machine.memory_gib is not None:
        return f"{plan.machine.memory_gib} GiB each"
    return "the card's memory" if plan.machine.device == "cuda" else "no memory budget: the host's memory"


def check_runnable_here(plan: SweepPlan) -> None:
    """A local launch of a GPU profile on a host without those GPUs fails before anything starts."""
    if not cluster_for(plan.launcher).on_this_host or plan.machine.device != "cuda":
        return
    have, need = local_cuda_devices(), plan.meta.num_devices
    if have < need:
        raise SweepError(
            f"machine={plan.meta.machine} needs {need} CUDA device(s) but this host has {have}: "
            f"run it on Slurm (hydra/launcher=submitit_slurm), or add dry_run=true to see its candidates"
        )
    card_gib = local_cuda_memory_gib()
    if card_gib is not None and plan.machine.memory_gib is not None and plan.machine.memory_gib > card_gib:
        # Not an error: the profile may describe a bigger card of the same family; trials use what is there.
        print(
            f"sweep: warning: machine.memory_gib={plan.machine.memory_gib:g} is above this card's {card_gib:.1f} GiB: "
            f"trials use the card's {card_gib:.1f} GiB (set machine.memory_gib<={card_gib:.1f} to emulate a smaller card)",
            file=sys.stderr,
            flush=True,
        )


def local_cuda_devices() -> int:
    """CUDA devices this host has, as torch counts them (CUDA_VISIBLE_DEVICES applied)."""
    import torch

    return torch.cuda.device_count()


def local_cuda_memory_gib() -> float | None:
    """The smallest local CUDA card's total memory in GiB; None without CUDA."""
    import torch

    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return min(torch.cuda.get_device_properties(i).total_memory for i in range(count)) / 1024**3 if count else None
    except (RuntimeError, AssertionError, AttributeError):  # a driver that cannot say: no warning, the trials find out
        return None
