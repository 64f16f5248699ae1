"""Where a sweep's trials run: this host or a Slurm cluster, each a class that answers its own questions.

Callers ask what they need (does the sweep stop a trial at its time limit, do trials share this host's CPUs)
rather than compare a backend's name: a backend added later (a detached search, a different scheduler) says
its own answers in one place. submitit stays the job API underneath (launch/backend.py): these classes only
say how this sweep uses it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, ClassVar

from sweep.launch import backend as jobs


class Cluster:
    """A launcher's cluster, as the sweep uses it."""

    name: ClassVar[str]  # job.json's and sweep.json's `cluster`/`launcher` value
    # Trials run on this host: the sweep stops each at trial.time_limit_s itself (on Slurm, queueing is not
    # trial time and the job's own --time applies), they share this host's CPUs (a busy host scores noisier),
    # the sweep hands out its CUDA device groups, and warm workers (launch/warm_pool.py) can serve them.
    on_this_host: ClassVar[bool]
    spans_nodes: ClassVar[bool]  # a trial may take machine.nodes > 1 (one launcher per node on each)

    def cancel(self, job: Any) -> None:
        """Stop a job: on this host its whole process tree, on a scheduler through it (launch/backend.cancel_job)."""
        jobs.cancel_job(job, self.name)

    def remember(self, trial_dir: Path, job: Any) -> None:
        """Write job.json, so a restarted sweep finds the job again (launch/backend.reattach)."""
        jobs.remember_job(trial_dir, job, self.name)

    def queue_state(self, job_id: str) -> tuple[str, str]:
        """(state, why) of a job that has not timed a step yet, for python -m sweep.status: on this host it is starting."""
        return "starting", ""


class LocalCluster(Cluster):
    name = "local"
    on_this_host = True
    spans_nodes = False


class SlurmCluster(Cluster):
    name = "slurm"
    on_this_host = False
    spans_nodes = True

    def queue_state(self, job_id: str) -> tuple[str, str]:
        """squeue's view: queued with Slurm's pending reason (Priority, Resources, ...), running, or ended."""
        if not shutil.which("squeue"):
            return "unknown (no squeue here)", ""
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], capture_output=True, text=True, check=False).stdout.strip()
        if not out:
            return "ended", ""
        state, _, reason = out.partition("|")
        return ("queued" if state == "PENDING" else state.lower()), ("" if reason in ("None", "") else reason)


CLUSTERS: dict[str, type[Cluster]] = {c.name: c for c in (LocalCluster, SlurmCluster)}


def cluster_named(name: str) -> Cluster:
    """The cluster a job.json names (its `cluster`); this host's where the name is unknown."""
    return CLUSTERS.get(name, LocalCluster)()


def cluster_for(launcher: dict[str, Any]) -> Cluster:
    """The cluster of hydra/launcher=submitit_local|submitit_slurm (an unsupported target: one clear error)."""
    return CLUSTERS[jobs.cluster_of(launcher)]()
