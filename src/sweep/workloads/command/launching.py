"""How one node's launcher of a command trial starts: its placeholders' launch values, environment and log.

One launcher per node per trial: the command's own launcher (torchrun, deepspeed, accelerate) starts
{nproc_per_node} ranks on its node, {num_devices} in all over {nodes} nodes, from {node_rank},
{master_addr} and {master_port}.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sweep.core.spec import TrialSpec

LOG_PREFIX = "command"
# Thread-pool sizes machine.cpu_threads sets for a command, unless workload.env sets them itself.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def launch_values(spec: TrialSpec) -> dict[str, Any]:
    """{nproc_per_node}, {nodes}, {node_rank}, {master_addr}, {master_port} for this node's launcher.

    One job per trial with one task per node: the job environment says which node this is and
    where node 0 runs. A local trial gets a port the OS says is free now, so trials side by side
    never meet on torchrun's default 29500; the nodes of a multi-node job cannot ask each other,
    so theirs is derived from the job id.
    """
    import zlib

    nodes = int(spec.machine.nodes or 1)
    node_rank, addr, job_id = 0, "127.0.0.1", ""
    try:
        import submitit

        job = submitit.JobEnvironment()
        node_rank, job_id = int(job.node), str(job.job_id)
        if nodes > 1:
            addr = str(job.hostnames[0])
    except (RuntimeError, ImportError, IndexError, ValueError):
        pass
    port = 20000 + zlib.crc32(job_id.encode()) % 20000 if nodes > 1 else free_port()
    return {"nproc_per_node": nproc_per_node(spec.num_devices, nodes), "nodes": nodes, "node_rank": node_rank, "master_addr": addr,
            "master_port": port}


def nproc_per_node(num_devices: int, nodes: int) -> int:
    """The ranks each node's launcher starts (the edge, orchestration/settings.py, refuses num_devices that nodes do not divide)."""
    return max(1, int(num_devices) // max(1, int(nodes)))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command_env(spec: TrialSpec, own: Mapping[str, str]) -> dict[str, str]:
    """The command's environment: this job's, machine.cpu_threads as the thread-pool sizes, its trial dir, then workload.env."""
    env = dict(os.environ)
    threads = spec.machine.cpu_threads
    if threads:
        env.update({name: str(int(threads)) for name in THREAD_VARIABLES})
    env["SWEEP_TRIAL_DIR"] = str(Path(spec.trial_dir).resolve())  # where a command may leave files of its own
    env.update(own)
    return env


def attempt_log(trial_dir: Path, node_rank: int = 0, tag: str = "") -> Path:
    """A log file of this attempt's own (command-1.log, command-2.log, ...): a rerun never reads an earlier run's figures.

    Created here, exclusively, so that two attempts can never share one; other nodes' launchers
    (multi-node) log beside it under their attempt's tag (nodes.attempt_tag: the job id, and its
    restart count once requeued) and node rank.
    """
    if node_rank:
        return trial_dir / f"{LOG_PREFIX}-job{tag or job_id() or os.getpid()}-node{node_rank}.log"
    n = 1 + max((int(p.stem.split("-")[1]) for p in trial_dir.glob(f"{LOG_PREFIX}-*.log") if p.stem.split("-")[1].isdigit()), default=0)
    while True:
        path = trial_dir / f"{LOG_PREFIX}-{n}.log"
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return path
        except FileExistsError:
            n += 1


def job_id() -> str:
    """This trial's submitit job id; empty outside a submitit job."""
    import submitit

    try:
        return str(submitit.JobEnvironment().job_id)
    except RuntimeError:
        return ""


def launch_lines(spec: TrialSpec) -> str:
    """The dry run's view of a trial's launch: the line each node's launcher will run, for one pair.

    What only the job knows is named, not guessed: node 0's host (from Slurm's node list) and the
    trial's port (free when it starts; on several nodes derived from the job id)."""
    import shlex

    from sweep.workloads.command.template import fill, pair_values

    nodes = int(spec.machine.nodes or 1)
    per_node = nproc_per_node(spec.num_devices, nodes)
    values: dict[str, Any] = {**pair_values(spec.numbers()), "nproc_per_node": per_node, "nodes": nodes,
                              "master_addr": "127.0.0.1" if nodes == 1 else "NODE0_HOST", "master_port": "TRIAL_PORT"}
    wl = spec.workload
    known = "NODE0_HOST: node 0's host name, TRIAL_PORT: the trial's own port" if nodes > 1 else "TRIAL_PORT: a port free when the trial starts"
    lines = [f"launch, accum={spec.accum} split={spec.split}: {nodes} node(s) x {per_node} rank(s) = {spec.num_devices}, "
             f"one launcher a node, in {wl.cwd or os.getcwd()} ({known})"]
    for node in range(nodes):
        node_values = {**values, "node_rank": node}
        env = [f"{k}={shlex.quote(fill(str(v), node_values))}" for k, v in (wl.env or {}).items()]
        lines.append(f"  node {node}: " + " ".join([*env, *(shlex.quote(fill(a, node_values)) for a in wl.argv)]))
    return "\n".join(lines)
