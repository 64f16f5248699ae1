"""Warm workers (launch/worker.py, launch/warm_pool.py), with real submitit jobs on this host: a trial
run after an OOM in a warm worker records the same status and peak (within 2%) as in a fresh process;
a worker runs trials in turn; after a fatal error it retires and the next trial gets a fresh one;
what a worker may not run keeps a process of its own."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf

from sweep.core.config import MachineConfig, TrialConfig
from sweep.core.schema import Status, TrialResult
from sweep.core.spec import TrialSpec
from sweep.launch import backend
from sweep.launch.ended import ended_job_result
from sweep.launch.warm_pool import WarmPool, WarmTrial
from sweep.records import read_trial_record
from sweep.workloads import get as get_workload
from sweep.workloads import run_job
from sweep.workloads.rnnt.config import RNNTWorkloadConfig

SMALL = RNNTWorkloadConfig(feat_dim=4, frames=8, subsample=2, label_len=3, vocab=6, enc_hidden=8, enc_layers=2, pred_hidden=8, joint_hidden=8)
JOINT_HOG = RNNTWorkloadConfig(**{**asdict(SMALL), "frames": 32, "label_len": 7, "vocab": 8192})
BUILT_IN_WARM = get_workload("rnnt").warm_runner  # what the orchestrator gives the pool of a built-in sweep


def spec(where: Path, workload: RNNTWorkloadConfig, accum: int, split: int, global_batch: int, memory_gib: float, device: str = "cpu") -> TrialSpec:
    per_device = global_batch // accum
    return TrialSpec(
        accum=accum, split=split, per_device_batch=per_device, joint_batch=per_device // split, global_batch_size=global_batch, num_devices=1,
        machine=MachineConfig(device=device, memory_gib=memory_gib, cpu_threads=1), workload=workload,
        trial=TrialConfig(warmup_steps=1, measure_steps=4, max_measure_steps=4, seed=0), trial_dir=str(where / f"accum{accum}_split{split}"),
    )


def local_launcher(root: Path) -> dict:
    return {**asdict(LocalQueueConf()), "submitit_folder": str(root / ".submitit" / "%j"), "name": "sweep"}


def finish(job, s: TrialSpec, timeout_s: float = 240) -> TrialResult:
    """Wait for a handed trial (or a fresh job) as the orchestrator does, then take its record."""
    Path(s.trial_dir).mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    while not job.done():
        assert time.monotonic() < deadline, f"accum={s.accum} split={s.split} did not end in {timeout_s} s"
        time.sleep(0.1)
    return ended_job_result(job, s, Path(s.trial_dir), timed_out=False, cancelled=False, wall_s=0.0)


def handed(pool: WarmPool, s: TrialSpec, gpus=None) -> WarmTrial:
    Path(s.trial_dir).mkdir(parents=True, exist_ok=True)
    return pool.submit(s, gpus)


def worker_state(trial: WarmTrial) -> dict:
    return json.loads((trial.worker.dir / "state.json").read_text())


@pytest.mark.slow
def test_a_trial_after_an_oom_in_a_warm_worker_records_what_a_fresh_process_records(tmp_path: Path) -> None:
    # The same pair twice in one worker: out of memory under a 4 MiB budget, then with room (peaks of tens
    # of MiB, far above the page-level scatter a tiny trial's peak shows); then in a fresh trial process.
    pool = WarmPool(local_launcher(tmp_path), tmp_path, "cpu", BUILT_IN_WARM)
    try:
        oom = handed(pool, spec(tmp_path / "warm_oom", JOINT_HOG, 1, 1, 4, 4 / 1024))
        first = finish(oom, spec(tmp_path / "warm_oom", JOINT_HOG, 1, 1, 4, 4 / 1024))
        ok_spec = spec(tmp_path / "warm", JOINT_HOG, 1, 1, 4, 2.0)
        after_trial = handed(pool, ok_spec)
        after = finish(after_trial, ok_spec)
    finally:
        pool.close()
    fresh_spec = replace(ok_spec, trial_dir=str(tmp_path / "fresh" / "accum1_split1"))
    alone = finish(backend.make_executor(local_launcher(tmp_path), 300).submit(run_job, fresh_spec), fresh_spec)
    assert first.status == Status.OOM
    assert after.status == alone.status == Status.OK, (after.error, alone.error)
    # The counted (address-space) peak of two identical fresh trials differs by up to 1 MiB (52.5 or 53.5 MiB over six
    # runs of this spec: one more 1 MiB mapping live at the peak or not), which is 2% here: a fresh process cannot match
    # another closer than that, so 1.5 MiB is allowed beside the 2%, for the peak and the reserved peak alike (the
    # peak: 51.4 against 50.2 MiB in one full run, passing on the next two).
    assert after.peak_mem_gib == pytest.approx(alone.peak_mem_gib, rel=0.02, abs=1.5 / 1024)
    assert after.peak_reserved_gib == pytest.approx(alone.peak_reserved_gib, rel=0.02, abs=1.5 / 1024)
    # One worker ran both, and stayed: each CPU trial runs in a child forked for it, so the worker's own
    # address-space peak never moved, and the OOM left nothing behind.
    assert oom.worker is after_trial.worker and oom.job_id == after_trial.job_id == after.job_id
    assert worker_state(after_trial)["trials"] == 2 and worker_state(after_trial).get("why") in (None, "asked to retire")  # not for a dirty state
    # The first trial owns the worker's start-up (interpreter, imports), as a fresh process's trial owns its own.
    assert first.wall_s > 1.0


@pytest.mark.slow
def test_after_a_fatal_error_the_worker_retires_and_the_next_trial_gets_a_fresh_one(tmp_path: Path) -> None:
    pool = WarmPool(local_launcher(tmp_path), tmp_path, "cpu", BUILT_IN_WARM)
    try:
        bad = spec(tmp_path / "bad", replace(SMALL, optimizer="lion"), 2, 2, 8, 2.0)  # the model builds, its optimizer does not
        crashed = handed(pool, bad)
        failed = finish(crashed, bad)
        good = spec(tmp_path / "good", SMALL, 2, 2, 8, 2.0)
        next_trial = handed(pool, good)
        ok = finish(next_trial, good)
    finally:
        pool.close()
    assert failed.status == Status.FAILED and "workload.optimizer='lion'" in failed.error  # the trial's own record
    assert worker_state(crashed)["state"] == "retiring" and "exited with status 1" in worker_state(crashed)["why"]
    assert ok.status == Status.OK
    assert next_trial.worker is not crashed.worker and next_trial.job_id != crashed.job_id


def test_a_killed_worker_records_its_trial_as_failed_and_is_replaced(tmp_path: Path) -> None:
    import os
    import signal

    pool = WarmPool(local_launcher(tmp_path), tmp_path, "cpu", BUILT_IN_WARM)
    try:
        slow = replace(spec(tmp_path / "killed", SMALL, 2, 2, 8, 2.0), trial=TrialConfig(warmup_steps=1, measure_steps=400, max_measure_steps=400))
        doomed = handed(pool, slow)
        deadline = time.monotonic() + 120
        while not (Path(slow.trial_dir) / "progress.json").exists():  # mid-trial
            assert time.monotonic() < deadline and not doomed.done()
            time.sleep(0.1)
        os.kill(worker_state(doomed)["pid"], signal.SIGKILL)
        killed = finish(doomed, slow)
        time.sleep(0.5)  # the trial's forked process dies with its worker: it never writes a record over ours
        good = spec(tmp_path / "good", SMALL, 2, 2, 8, 2.0)
        replaced = handed(pool, good)
        ok = finish(replaced, good)
    finally:
        pool.close()
    assert killed.status == Status.FAILED and killed.log.endswith(".out") and killed.log in killed.error  # the log to read
    assert read_trial_record(Path(slow.trial_dir)).status == Status.FAILED  # ended.json alone: no result.json came later
    assert not (Path(slow.trial_dir) / "result.json").exists()
    assert ok.status == Status.OK and replaced.job_id != doomed.job_id


EARLIER_OOM = """sweep worker 77: trial 1, accum=2 split=1
Traceback (most recent call last):
  File "/x/model.py", line 10, in encode
    out = self.encoder(x)
RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 1114112 bytes.
result oom in phase encoder: you tried to allocate 1114112 bytes in phase encoder
"""


def test_a_warm_trial_without_its_record_is_classified_from_its_own_lines_only(tmp_path: Path) -> None:
    """Issue 43: the worker's log holds its earlier trials' lines, an OOM's traceback among them. A trial that ended without
    its record is read from the byte where it was handed over, whether the sweep follows it (WarmTrial.warm) or re-attached
    to its worker after a restart (job.json's "warm"); the worker's state says how it ended. A job of its own is read whole."""
    from types import SimpleNamespace

    log = tmp_path / "77_0_log.out"
    offset = len(EARLIER_OOM.encode())
    own = "sweep worker 77: trial 2, accum=4 split=2\nstep 1/10 (warm-up): 0.100 s\n"
    log.write_text(EARLIER_OOM + own)
    worker = tmp_path / "worker"
    worker.mkdir()
    warm = {"worker_dir": str(worker), "seq": 2, "stdout_from": offset, "stderr_from": 0}
    s = spec(tmp_path, SMALL, 4, 2, 8, 2.0)
    tdir = Path(s.trial_dir)
    tdir.mkdir()
    paths = SimpleNamespace(stdout=log, stderr=tmp_path / "77_0_log.err")

    def ended(job: object, state: dict) -> TrialResult:
        (worker / "state.json").write_text(json.dumps({"seq": 2, "pid": 77, **state}))
        return ended_job_result(job, s, tdir, timed_out=False, cancelled=False, wall_s=1.0)

    followed = SimpleNamespace(job_id="1234", paths=paths, state="FINISHED", warm=warm)
    res = ended(followed, {"state": "running"})  # the worker was killed: its state still says running
    assert res.status == Status.FAILED and res.oom_phase is None, res
    assert res.error.startswith("its warm worker (pid 77) was killed while running it, with no sign of running out of memory"), res.error
    assert "(its last line: step 1/10 (warm-up): 0.100 s)" in res.error and res.error.endswith(f"see {log} from byte {offset}")
    res = ended(followed, {"state": "retiring", "why": "its trial process was killed by SIGKILL"})
    assert res.status == Status.FAILED and res.error.startswith("its warm worker (pid 77): its trial process was killed by SIGKILL, "), res.error
    # Re-attached after a restart: the job knows nothing of the worker, job.json does.
    (tdir / "job.json").write_text(json.dumps({"job_id": "1234", "cluster": "local", "log": str(log), "warm": warm}))
    orphan = SimpleNamespace(job_id="1234", paths=paths, state="FINISHED")
    res = ended(orphan, {"state": "running"})
    assert res.status == Status.FAILED and "was killed while running it" in res.error and f"from byte {offset}" in res.error, res.error
    # Its own OOM still counts, killed or not.
    log.write_text(EARLIER_OOM + own + EARLIER_OOM.replace("sweep worker 77: trial 1, accum=2 split=1\n", ""))
    assert ended(followed, {"state": "running"}).status == Status.OOM
    # A job of its own (Slurm, or local without warm workers): the whole log is the trial's, as before.
    log.write_text(EARLIER_OOM + own)
    (tdir / "job.json").write_text(json.dumps({"job_id": "1234", "cluster": "local", "log": str(log)}))
    res = ended(orphan, {"state": "running"})
    assert res.status == Status.OOM and res.error.endswith(f"see {log}"), res.error


def test_only_built_in_one_device_local_trials_go_to_a_worker(tmp_path: Path) -> None:
    # A command's memory is the user's program's: that workload has no warm runner, so its sweep starts no pool.
    assert BUILT_IN_WARM is not None and get_workload("command").warm_runner is None
    built_in = spec(tmp_path, SMALL, 2, 2, 8, 2.0)
    assert WarmPool.serves(built_in, True)
    assert not WarmPool.serves(replace(built_in, num_devices=2), True)  # one task per rank, each its own process
    assert not WarmPool.serves(built_in, False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_warm_worker_keeps_its_process_after_an_oom_and_records_the_fresh_peak(tmp_path: Path) -> None:
    big = RNNTWorkloadConfig(**{**asdict(SMALL), "frames": 400, "label_len": 100, "vocab": 4096})
    total = torch.cuda.get_device_properties(0).total_memory / 1024**3
    pool = WarmPool(local_launcher(tmp_path), tmp_path, "cuda", BUILT_IN_WARM)
    try:
        oom_spec = spec(tmp_path / "warm_oom", big, 1, 1, 64, min(1.0, total), device="cuda")
        oom_trial = handed(pool, oom_spec, (0,))
        first = finish(oom_trial, oom_spec)
        ok_spec = spec(tmp_path / "warm", SMALL, 2, 2, 8, min(1.0, total), device="cuda")
        trial = handed(pool, ok_spec, (0,))
        after = finish(trial, ok_spec)
    finally:
        pool.close()
    fresh_spec = replace(ok_spec, trial_dir=str(tmp_path / "fresh" / "accum2_split2"))
    executor = backend.make_executor(local_launcher(tmp_path), 300)
    executor.update_parameters(visible_gpus=(0,), gpus_per_node=1)  # as the orchestrator starts a fresh trial: else submitit hides every GPU
    alone = finish(executor.submit(run_job, fresh_spec), fresh_spec)
    assert first.status == Status.OOM, first
    # Freed and reset: clean, so the same process ran the next trial (else the first worker's state says why it retired).
    assert worker_state(trial)["trials"] == 2, (worker_state(oom_trial), first.oom_phase, first.error)
    assert after.status == alone.status == Status.OK, (after.error, alone.error)
    assert after.peak_mem_gib == pytest.approx(alone.peak_mem_gib, rel=0.02)


def test_a_free_device_group_whose_worker_is_idle_is_given_the_next_trial(tmp_path: Path) -> None:
    """With more device groups than trials in flight (8 GPUs, one trial at a time), the orchestrator
    reuses the idle worker's group rather than rotating to a group that has none (a fresh start-up)."""
    from types import SimpleNamespace

    from sweep.launch.warm_pool import Worker

    pool = WarmPool(local_launcher(tmp_path), tmp_path, "cuda", BUILT_IN_WARM)
    alive = SimpleNamespace(done=lambda: False, job_id="1", paths=None)
    idle, busy = Worker(alive, tmp_path / "idle", (2,)), Worker(alive, tmp_path / "busy", (1,))
    for worker, state in ((idle, "ready"), (busy, "running")):
        worker.dir.mkdir()
        worker.handed = 1
        (worker.dir / "state.json").write_text(json.dumps({"state": state, "seq": 1}))
    pool.workers = [busy, idle]
    groups = [(0,), (1,), (2,), (3,)]
    assert pool.warm_group(groups) == 2
    assert pool.warm_group([(0,), (3,)]) == 0  # no idle worker on any of them: the first, as before


def test_on_cuda_a_worker_stays_while_it_proves_a_clean_state_and_retires_on_a_leak_or_a_fatal_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA path of serve_worker in this process, with torch's allocator counters played by the test
    and the trial by a stand-in: a trial whose cache empty_cache gives back leaves the worker ready for the
    next; one that leaves memory allocated retires it; so does one that raises. No GPU needed."""
    import os
    import threading
    from types import SimpleNamespace

    import psutil

    from sweep.launch.warm_pool import Worker
    from sweep.launch.worker import serve_worker

    held = {"allocated": 0, "reserved": 0}
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: held["allocated"])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: held["reserved"])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: held.update(reserved=held["allocated"]))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    ran: list[int] = []

    def trial(s: TrialSpec, extra_startup_s: float = 0.0) -> None:
        ran.append(s.accum)
        held["reserved"] += 64 << 20  # what the trial's tensors left cached
        if s.accum == 4:
            held["allocated"] += 4096  # a tensor still referenced after the trial
        if s.accum == 8:
            raise RuntimeError("a bug in the trial")


    def serve(accums: list[int]) -> dict:
        where = tmp_path / f"worker{accums[-1]}"
        where.mkdir()
        worker = Worker(SimpleNamespace(done=lambda: False, job_id="1", paths=None), where, (0,))

        def orchestrator() -> None:  # hands the next trial once the worker says it is ready for it
            for accum in accums:
                while not worker.idle():
                    time.sleep(0.02)
                worker.hand(spec(tmp_path, SMALL, accum, 1, 8, 1.0, device="cuda"))

        threading.Thread(target=orchestrator, daemon=True).start()
        held.update(allocated=0, reserved=0)
        serve_worker(str(where), "cuda", os.getpid(), psutil.Process().create_time(), lambda: trial)  # returns when it retires
        return worker.state()

    leaked = serve([1, 2, 4])
    assert ran == [1, 2, 4] and leaked["trials"] == 3 and leaked["state"] == "retiring"
    assert leaked["why"].startswith("CUDA memory still held after freeing: 4096 B allocated"), leaked
    ran.clear()
    crashed = serve([1, 8])
    assert ran == [1, 8] and crashed["state"] == "retiring" and crashed["why"] == "fatal error: RuntimeError"
