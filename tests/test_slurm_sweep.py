"""`python -m sweep` on Slurm: the sbatch scripts it generates, and sweeps on a real cluster.

The golden tests need no cluster. The others (marked slurm) run `python -m sweep` as a
subprocess against the single-node cluster of the `slurm_cluster` fixture (2 CPUs):
trials are real sbatch jobs, and cancel, requeue, suspend and time-limit signals are sent
with Slurm's own scancel/scontrol. Tests that act on a running trial make it slow with a
bigger encoder (SLOW) and act once its log shows it measuring.

CI time: about 100 s on 2 cores for the slurm-marked tests here, 2 s for the golden ones.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from support.sbatch_golden import CASES, compose_plan, golden_path, normalise, sbatch_text, update_requested, write_all
from support.slurm_cluster import wait_until
from support.sweep_run import TINY, background_sweep, run_sweep

# The job-side functions below are unpickled in a fresh interpreter that cannot import
# this module (tests/ is not on its sys.path): ship them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

CONF_MACHINES = Path(__file__).resolve().parents[1] / "conf" / "machine"
TABLE_HEADER = Path(__file__).resolve().parent / "golden" / "trials_header.csv"
WAIT_S = 90
# A trial slow enough to act on while it measures: a longer, wider encoder (about 0.1 s a
# step on one core, 0.3 s on a busy one) for 30 steps. Compute, not step count, makes it slow: each
# logged step also costs Slurm's I/O forwarding, which varies more between hosts than the compute does.
SLOW = ["workload.frames=1024", "workload.enc_hidden=256", "trial.measure_steps=30", "trial.max_measure_steps=30", "machine.memory_gib=2"]


# -- golden sbatch scripts (no cluster needed) -----------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_sbatch_script_matches_golden(name: str) -> None:
    if update_requested():
        write_all()
    text = sbatch_text(CASES[name])
    assert text == golden_path(name).read_text(), (
        f"the sbatch script for {name} changed; if that is intended, regenerate the goldens: "
        "SWEEP_UPDATE_GOLDEN=1 python -m pytest tests/test_slurm_sweep.py -k golden"
    )


def test_every_machine_profile_has_a_golden_script() -> None:
    profiles = {p.stem for p in CONF_MACHINES.glob("*.yaml")}
    assert profiles <= set(CASES), f"add {sorted(profiles - set(CASES))} to CASES in tests/support/sbatch_golden.py"


def test_sbatch_script_runs_one_task_per_device_or_one_launcher_per_node() -> None:
    for name, overrides in CASES.items():
        plan = compose_plan(overrides)
        text = sbatch_text(overrides)
        nodes, per_node = plan.machine.nodes, plan.meta.num_devices // plan.machine.nodes
        # The built-in workload: a task per device. A command: its own launcher (torchrun) per node starts the ranks.
        tasks = 1 if plan.meta.workload == "command" else per_node
        assert f"#SBATCH --nodes={nodes}\n" in text, name
        assert f"#SBATCH --ntasks-per-node={tasks}\n" in text, name
        if plan.machine.device == "cuda":
            assert f"#SBATCH --gpus-per-node={per_node}\n" in text, name


def test_task_layout_that_does_not_match_the_devices_is_refused() -> None:
    from sweep.errors import SweepError
    from sweep.launch.backend import check_task_layout

    # make_plan runs this check (so `python -m sweep` stops before submitting); called here too
    # so that the test holds whichever of the two raises.
    with pytest.raises(SweepError, match=r"tasks_per_node=2 x hydra.launcher.nodes=2 = 4 tasks, but machine.num_devices=2.*tasks_per_node=1"):
        plan = compose_plan(["+machine=cpu2", "machine.nodes=2", "hydra.launcher.tasks_per_node=2", "hydra/launcher=submitit_slurm"])
        check_task_layout(plan.launcher, plan.machine.num_devices)


# -- helpers for the cluster tests --------------------------------------------------------------


def _slurm_args(cluster: Any, *extra: str) -> list[str]:
    """TINY on the test cluster: one CPU per task, every listed pair run (grid); `extra` wins."""
    given = {e.split("=", 1)[0] for e in extra}
    base = [a for a in TINY if a.split("=", 1)[0] not in given]
    defaults = ["hydra/launcher=submitit_slurm", f"hydra.launcher.partition={cluster.partition}", "hydra.launcher.cpus_per_task=1", "search=grid"]
    return [*base, *[d for d in defaults if d.split("=", 1)[0] not in given], *extra]


def _wait_until(what: str, check: Callable[[], Any], timeout: float = WAIT_S, interval: float = 0.25) -> Any:
    return wait_until(what, check, timeout, interval)


def _sacct(job_id: str, fields: str = "State") -> list[str]:
    out = subprocess.run(
        ["sacct", "-j", job_id, "-X", "-n", "-P", "-o", fields], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
    return out.splitlines()[-1].split("|") if out else []


def _step_tasks(step_id: str) -> str:
    out = subprocess.run(
        ["sacct", "-j", step_id.split(".")[0], "-n", "-P", "-o", "JobID,NTasks"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return next((line.split("|")[1] for line in out.splitlines() if line.split("|")[0] == step_id), "")


def _ended(job_id: str, *fields: str) -> list[str] | None:
    """[State, *fields] from sacct once the job has ended; None while it may still run."""
    values = _sacct(job_id, ",".join(("State", *fields)))
    if not values or values[0] in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED"):
        return None
    return values


def _job_dirs(sweep_dir: Path) -> list[str]:
    """The job ids under .submitit (one folder per job; requeues reuse theirs)."""
    return sorted(p.name for p in (sweep_dir / ".submitit").iterdir() if p.is_dir())


def _rows(sweep_dir: Path) -> dict[tuple[int, int], dict[str, str]]:
    return {(int(r["accum"]), int(r["split"])): r for r in csv.DictReader((sweep_dir / "trials.csv").open())}


def _job(sweep_dir: Path, key: str) -> dict[str, Any] | None:
    path = sweep_dir / "trials" / key / "job.json"
    return json.loads(path.read_text()) if path.exists() else None


def _measuring(sweep_dir: Path, key: str) -> dict[str, Any] | None:
    """The trial's job record once its job is past start-up and timing steps."""
    job = _job(sweep_dir, key)
    if job and Path(job["log"]).exists() and "step 2/" in Path(job["log"]).read_text():
        return job
    return None


class LiveSweep:
    """`python -m sweep` running in the background, for tests that act while trials run."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.out_path = cwd / f"sweep-{time.monotonic_ns()}.out"
        env = {k: v for k, v in os.environ.items() if k not in ("SWEEP_DEBUG", "HYDRA_FULL_ERROR")}
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = background_sweep(args, cwd, env, self.out_path)

    def wait(self, timeout: float = WAIT_S) -> str:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return self.out_path.read_text()

    def sigkill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


def _release_requeued(job_id: str) -> None:
    """Start a requeued job now: Slurm holds one for its credential lifetime (120 s) first.

    A site would just wait; the test moves the begin time, as an operator could.
    """
    _wait_until(f"job {job_id} requeued (PENDING)", lambda: _sacct(job_id) == ["PENDING"])
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True, timeout=30)


# -- sweeps on the cluster -----------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slurm
def test_sweep_on_slurm_runs_trials_in_parallel_and_ranks_them(slurm_cluster: Any, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "s"
    fixed = _slurm_args(slurm_cluster, f"hydra.sweep.dir={sweep_dir}", "max_in_flight=2")
    # No end-of-sweep re-timing: its two jobs would only repeat two of these (each job imports torch afresh).
    proc = run_sweep([*fixed, "accum=1,2", "split=1,2", "search.drift_check=false"], cwd=tmp_path, timeout=300)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # The same table as the local launcher's: the pinned header, one row per pair, ranked.
    header = next(csv.reader((sweep_dir / "trials.csv").open()))
    assert header == TABLE_HEADER.read_text().splitlines()[0].split(",")
    rows = _rows(sweep_dir)
    assert set(rows) == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert {r["status"] for r in rows.values()} == {"ok"}
    assert sorted(int(r["rank"]) for r in rows.values()) == [1, 2, 3, 4]
    assert "recommended accum=" in proc.stdout

    spans = []
    for (accum, split), r in rows.items():
        # Each trial is its own Slurm job; the log column is that job's log, in the sweep dir.
        job_id = r["job_id"]
        assert r["log"] == str(sweep_dir / ".submitit" / job_id / f"{job_id}_0_log.out")
        assert f"sweep trial accum={accum} split={split}" in Path(r["log"]).read_text()
        # The result pickle lands before sacct records the job's end.
        state, start, end = _wait_until(f"job {job_id} ended in sacct", lambda job_id=job_id: _ended(job_id, "Start", "End"))
        assert state == "COMPLETED"
        spans.append((start, end))
        # What the cluster received is what the golden generator writes for these overrides.
        sent = (sweep_dir / ".submitit" / job_id / f"{job_id}_submission.sh").read_text()
        assert normalise(sent, str(sweep_dir)) == sbatch_text([a for a in fixed if not a.startswith("hydra.sweep.dir=")], str(sweep_dir))
    assert len({r["job_id"] for r in rows.values()}) == 4
    # max_in_flight=2 on a 2-CPU node: two trials ran side by side.
    spans.sort()
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), spans


@pytest.mark.e2e
@pytest.mark.slurm
def test_two_device_trial_is_one_job_with_a_rank_per_task(slurm_cluster: Any, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "s"
    proc = run_sweep(
        _slurm_args(slurm_cluster, "+machine=cpu2", f"hydra.sweep.dir={sweep_dir}", "accum=1", "split=1"), cwd=tmp_path, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = _rows(sweep_dir)[(1, 1)]
    assert row["status"] == "ok" and row["num_devices"] == "2" and row["per_device_batch"] == "4"
    job_id = row["job_id"]
    # One job, one step of two tasks, each task a torch.distributed rank (gloo) with its own log.
    assert _wait_until(f"step {job_id}.0 in sacct", lambda: _step_tasks(f"{job_id}.0")) == "2"
    for rank in (0, 1):
        log = (sweep_dir / ".submitit" / job_id / f"{job_id}_{rank}_log.out").read_text()
        assert f"global_rank={rank}(2)" in log
        assert f"[rank {rank}] result ok:" in log


@pytest.mark.e2e
@pytest.mark.slurm
def test_scancel_and_time_limit_signal_end_their_trials_and_the_sweep_goes_on(slurm_cluster: Any, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "s"
    live = LiveSweep(
        _slurm_args(
            slurm_cluster, f"hydra.sweep.dir={sweep_dir}", "max_in_flight=2", *SLOW, "accum=1,2,4", "split=1"
        ),
        cwd=tmp_path,
    )
    cancelled = _wait_until("accum=1 measuring", lambda: _measuring(sweep_dir, "accum1_split1"))
    signalled = _wait_until("accum=2 measuring", lambda: _measuring(sweep_dir, "accum2_split1"))
    subprocess.run(["scancel", cancelled["job_id"]], check=True, timeout=30)
    # What Slurm sends hydra.launcher.signal_delay_s before the time limit. With
    # max_num_timeout=0 (the default) submitit does not requeue: the trial is a timeout.
    subprocess.run(["scancel", "--signal=USR2", signalled["job_id"]], check=True, timeout=30)
    out = live.wait(timeout=240)
    assert live.proc.returncode == 0, out

    rows = _rows(sweep_dir)
    assert rows[(1, 1)]["status"] == "cancelled", rows[(1, 1)]
    assert rows[(2, 1)]["status"] == "timeout", rows[(2, 1)]
    assert "Slurm time limit" in rows[(2, 1)]["reason"]
    assert rows[(4, 1)]["status"] == "ok"  # started in the freed slot, after the others
    assert rows[(4, 1)]["rank"] == "1"
    assert _wait_until("sacct", lambda: _ended(cancelled["job_id"]))[0].startswith("CANCELLED")
    assert "accum=1 split=1: cancelled" in out and "accum=4 split=1: ok" in out


@pytest.mark.e2e
@pytest.mark.slurm
def test_preempted_or_requeued_trials_run_again_in_the_same_job(slurm_cluster: Any, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "s"
    live = LiveSweep(
        _slurm_args(
            slurm_cluster,
            f"hydra.sweep.dir={sweep_dir}",
            "max_in_flight=2",
            *SLOW,
            "hydra.launcher.max_num_timeout=1",
            "accum=1,2",
            "split=1",
            "search.drift_check=false",  # the test counts the sweep's jobs: no end-of-sweep re-timing jobs
        ),
        cwd=tmp_path,
    )
    node_failed = _wait_until("accum=1 measuring", lambda: _measuring(sweep_dir, "accum1_split1"))
    preempted = _wait_until("accum=2 measuring", lambda: _measuring(sweep_dir, "accum2_split1"))
    # Slurm requeues a job itself after a node failure or a REQUEUE-mode preemption ...
    subprocess.run(["scontrol", "requeue", node_failed["job_id"]], check=True, timeout=30)
    # ... and signals it when preempting with preempt_send_user_signal: submitit then calls
    # the trial's checkpoint() and requeues the DelayedSubmission it returns.
    subprocess.run(["scancel", "--signal=USR2", preempted["job_id"]], check=True, timeout=30)
    for job in (node_failed, preempted):
        _release_requeued(job["job_id"])
    out = live.wait(timeout=240)
    assert live.proc.returncode == 0, out

    rows = _rows(sweep_dir)
    for key, job in ((1, 1), node_failed), ((2, 1), preempted):
        assert rows[key]["status"] == "ok", rows[key]
        assert rows[key]["job_id"] == job["job_id"]  # requeued, not resubmitted
        log = Path(job["log"]).read_text()
        assert log.count(f"sweep trial accum={key[0]} split=1") == 2, log[-3000:]
    assert "requeueing accum=2 split=1" in Path(preempted["log"]).read_text()
    assert _job_dirs(sweep_dir) == sorted([node_failed["job_id"], preempted["job_id"]])


@pytest.mark.e2e
@pytest.mark.slurm
def test_killed_sweep_reattaches_to_its_job_on_rerun(slurm_cluster: Any, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "s"
    args = _slurm_args(slurm_cluster, f"hydra.sweep.dir={sweep_dir}", *SLOW, "accum=1", "split=1")
    live = LiveSweep(args, cwd=tmp_path)
    job = _wait_until("the trial measuring", lambda: _measuring(sweep_dir, "accum1_split1"))
    # Suspended (as gang scheduling would), the job outlives the restart below whatever the
    # host's speed, and its SUSPENDED state must not read as "ended".
    subprocess.run(["scontrol", "suspend", job["job_id"]], check=True, timeout=30)
    live.sigkill()  # no handler runs: the job is left behind, as after a crash or a lost login node
    _wait_until("sacct to show the job SUSPENDED", lambda: _sacct(job["job_id"]) == ["SUSPENDED"])

    again = LiveSweep(args, cwd=tmp_path)
    _wait_until("the rerun to re-attach", lambda: "re-attached to running job" in again.out_path.read_text())
    subprocess.run(["scontrol", "resume", job["job_id"]], check=True, timeout=30)
    out = again.wait(timeout=240)
    assert again.proc.returncode == 0, out
    assert f"re-attached to running job {job['job_id']} for accum=1 split=1" in out
    assert "started accum=" not in out
    row = _rows(sweep_dir)[(1, 1)]
    assert row["status"] == "ok" and row["job_id"] == job["job_id"]
    assert _job_dirs(sweep_dir) == [job["job_id"]]


@pytest.mark.e2e
@pytest.mark.slurm
def test_oom_trials_are_classified_by_phase(slurm_cluster: Any, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "s"
    # A 30 MiB device budget: the encoder of a 64-sample micro-batch (frames=512) does not fit,
    # nor the joint of an 8-sample one (vocab=256, label_len=24), whose encoder does.
    big = ["global_batch_size=64", "workload.frames=512", "workload.enc_hidden=128", "workload.vocab=256",
           "workload.joint_hidden=256", "workload.label_len=24", "machine.memory_gib=0.03"]
    proc = run_sweep(
        _slurm_args(slurm_cluster, f"hydra.sweep.dir={sweep_dir}", "max_in_flight=2", *big, "accum=1,8", "split=1"),
        cwd=tmp_path,
        timeout=300,
    )
    rows = _rows(sweep_dir)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # nothing fits: no recommendation
    assert (rows[(1, 1)]["status"], rows[(1, 1)]["oom_phase"]) == ("oom", "encoder")
    assert (rows[(8, 1)]["status"], rows[(8, 1)]["oom_phase"]) == ("oom", "joint")
    for r in rows.values():
        assert "can't allocate memory" in Path(r["log"]).read_text()


def joint_and_loss() -> bytes:
    """Runs in the job: a real allocation failure, in a frame named like the RNN-T joint."""
    return bytearray(1 << 44)  # 16 TiB: refused at once by the kernel's overcommit check


def _oom_without_a_record(spec: Any) -> None:
    joint_and_loss()


@pytest.mark.slurm
def test_job_that_leaves_no_record_is_classified_from_its_slurm_log(slurm_cluster: Any, tmp_path: Path) -> None:
    from sweep.core.schema import ENDED_FILE, RESULT_FILE
    from sweep.launch import backend as backends
    from sweep.launch.ended import ended_job_result
    from sweep.records import read_result

    sweep_dir = tmp_path / "s"
    plan = compose_plan(_slurm_args(slurm_cluster, "accum=1", "split=1"), str(sweep_dir))
    cand = next(c for c in plan.candidates if c.valid)
    tdir = sweep_dir / "trials" / cand.key
    tdir.mkdir(parents=True)
    spec = plan.spec(cand, tdir)
    job = backends.make_executor(plan.launcher, plan.time_limit_s).submit(_oom_without_a_record, spec)
    _wait_until(f"job {job.job_id} to end", job.done)

    res = ended_job_result(job, spec, tdir, timed_out=False, cancelled=False, wall_s=1.0)
    assert (res.status, res.oom_phase) == ("oom", "joint")
    assert "MemoryError" in res.error and res.log in res.error
    assert res.log == str(job.paths.stdout) == str(sweep_dir / ".submitit" / job.job_id / f"{job.job_id}_0_log.out")
    assert _wait_until(f"job {job.job_id} ended in sacct", lambda: _ended(job.job_id)) == ["FAILED"]
    # Recorded by the orchestrator in its own file (result.json is the trial's), so a resumed sweep keeps it.
    assert read_result(tdir / ENDED_FILE).status == "oom" and not (tdir / RESULT_FILE).exists()


@pytest.mark.e2e
@pytest.mark.slurm
def test_a_torchrun_command_trial_is_one_task_whose_launcher_starts_the_ranks(slurm_cluster: Any, tmp_path: Path) -> None:
    """Issue 29: a command trial on a 2-device profile is one Slurm task (one launcher per node); torchrun
    starts the 2 ranks, on the port the trial was given; the command runs where sweep was started."""
    from support.scripts import DDP_TRAINER

    (tmp_path / "train.py").write_text(DDP_TRAINER)
    sweep_dir = tmp_path / "s"
    argv = ('["torchrun","--nproc_per_node={num_devices}","--nnodes={nodes}","--node_rank={node_rank}","--master_addr={master_addr}",'
            '"--master_port={master_port}","train.py","--accum={accum}","--gbs={global_batch_size}"]')
    args = _slurm_args(slurm_cluster, "+machine=cpu2", "workload=command", f"workload.argv={argv}", "global_batch_size=16",
                       "accum=1", f"hydra.sweep.dir={sweep_dir}", "trial.warmup_steps=2", "trial.measure_steps=4")
    args = [a for a in args if not a.startswith(("workload.feat_dim", "workload.frames", "workload.label_len", "workload.vocab",
                                                  "workload.enc_", "workload.pred_", "workload.joint_"))]
    proc = run_sweep(args, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = _rows(sweep_dir)[(1, 1)]
    assert row["status"] == "ok", row
    job_id = row["job_id"]
    assert "#SBATCH --ntasks-per-node=1\n" in (sweep_dir / ".submitit" / job_id / f"{job_id}_submission.sh").read_text()
    assert _wait_until(f"step {job_id}.0 in sacct", lambda: _step_tasks(f"{job_id}.0")) == "1"
    ranks = [json.loads(p.read_text()) for p in (sweep_dir / "trials" / "accum1_split1").glob("rank*.json")]
    assert len(ranks) == 2 and {r["world"] for r in ranks} == {2} and {r["cwd"] for r in ranks} == {str(tmp_path)}
    result = json.loads((sweep_dir / "trials" / "accum1_split1" / "result.json").read_text())
    assert result["measured_by"] == "probe" and result["ranks_seen"] == 2
