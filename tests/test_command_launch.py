"""How a command trial is launched and ended (issues 29 and 30), with real processes: the runner
called as a trial job calls it, the commands real Python scripts."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from sweep.core.config import MachineConfig, TrialConfig
from sweep.core.schema import Status
from sweep.core.spec import TrialSpec
from sweep.launch import backend
from sweep.launch.tree import PROCESSES_FILE, end_recorded
from sweep.workloads.command.config import CommandWorkloadConfig
from sweep.workloads.command.runner import run_command_trial
from sweep.workloads.command.template import script_arguments


def epoch_line(epoch: int, samples_per_s: float, gbs: int = 8) -> str:
    return (
        f"DLL 2024-01-02 10:11:{epoch:02d}.123456 - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : "
        f"{samples_per_s:8.2f} | train_avg_took : {gbs / samples_per_s:6.4f}"
    )


STEP_RE = {"type": "regex", "pattern": r"step (?P<step>\d+) (?P<step_time>[\d.]+) ms/step (?P<throughput>[\d.]+) samples/s", "step_time_unit": "ms"}


def spec_for(tmp_path: Path, script: str, *, extra_argv=(), machine=None, cwd=None, trial=None, env=None, parser=None) -> TrialSpec:
    path = tmp_path / "train.py"
    path.write_text(script)
    workload = CommandWorkloadConfig(
        argv=[sys.executable, str(path), "--accum={accum}", *extra_argv], cwd=cwd, env=env or {}, parser=parser or {"type": "myrtle"}
    )
    return TrialSpec(1, 1, 8, 8, 8, 1, machine or MachineConfig(device="cpu"), workload, trial or TrialConfig(), str(tmp_path / "trial"))


def gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


FIGURES = "\n".join(f"print({epoch_line(e, 1600.0)!r}, flush=True)" for e in range(1, 6))

ESCAPING_CHILD = f"""
import os, subprocess, sys, time
# A child that leaves the command's session (setsid) and one that is orphaned by a double fork.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
if os.fork() == 0:
    if os.fork() == 0:
        open(os.path.join(os.environ["SWEEP_TRIAL_DIR"], "grandchild.pid"), "w").write(str(os.getpid()))
        time.sleep(300)
    os._exit(0)
open(os.path.join(os.environ["SWEEP_TRIAL_DIR"], "child.pid"), "w").write(str(child.pid))
time.sleep(0.5)
{FIGURES}
"""


def test_children_that_escape_the_session_or_are_orphaned_end_with_the_trial(tmp_path):
    spec = spec_for(tmp_path, ESCAPING_CHILD)
    result = run_command_trial(spec)
    assert result.status == Status.OK, result.error
    trial = Path(spec.trial_dir)
    for name in ("child.pid", "grandchild.pid"):
        pid = int((trial / name).read_text())
        assert gone(pid, 1.0), f"{name} {pid} outlived its trial"
    recorded = json.loads((trial / PROCESSES_FILE).read_text())
    assert int((trial / "child.pid").read_text()) in {pid for pid, _ in recorded}


def test_what_a_killed_trial_job_left_is_ended_from_its_record(tmp_path):
    # The job process itself is SIGKILLed: it cannot end its command; the record it kept can.
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        record = [(orphan.pid, psutil.Process(orphan.pid).create_time()), (stranger.pid, 12345.0)]  # the stranger: a reused pid
        (tmp_path / PROCESSES_FILE).write_text(json.dumps(record))
        assert end_recorded(tmp_path, grace_s=2.0) == [orphan.pid]
        assert orphan.wait(timeout=5) is not None
        assert stranger.poll() is None  # another process with a recorded pid is never signalled
    finally:
        for p in (orphan, stranger):
            p.kill()
            p.wait()


def test_each_attempt_has_its_own_log_and_a_rerun_reads_only_its_own_figures(tmp_path):
    slow = "\n".join(f"print({epoch_line(e, 1600.0)!r}, flush=True)" for e in range(1, 5))
    first = run_command_trial(spec_for(tmp_path, slow))
    assert first.status == Status.OK and first.throughput == pytest.approx(1600.0, rel=1e-3)
    fast = "\n".join(f"print({epoch_line(e, 4800.0)!r}, flush=True)" for e in range(1, 5))
    second = run_command_trial(spec_for(tmp_path, fast))
    assert second.status == Status.OK and second.throughput == pytest.approx(4800.0, rel=1e-3)
    assert Path(first.log).name == "command-1.log" and Path(second.log).name == "command-2.log"
    assert "1600.00" not in Path(second.log).read_text()


BIG_LOG = """
import sys
def line(e, rate):
    return f"step {e} {8000 / rate:.3f} ms/step {rate:.1f} samples/s"
for e in (1, 2, 3):
    print(line(e, 160.0), flush=True)
sys.stdout.write(("x" * 1023 + "\\n") * 8 * 1024)  # 8 MiB of noise between the warm-up and the figures that count
sys.stdout.flush()
for e in range(4, 16):
    print(line(e, 1600.0), flush=True)
"""


def test_a_large_log_is_read_to_its_end(tmp_path):
    result = run_command_trial(spec_for(tmp_path, BIG_LOG, parser=STEP_RE))
    assert result.status == Status.OK, result.error
    assert result.throughput == pytest.approx(1600.0, rel=1e-3)
    assert result.steps_measured >= 8


PLACEHOLDERS = f"""
import json, os, sys
open(os.path.join(os.environ["SWEEP_TRIAL_DIR"], "seen.json"), "w").write(json.dumps(
    {{"argv": sys.argv[1:], "cwd": os.getcwd(), "omp": os.environ.get("OMP_NUM_THREADS"), "mkl": os.environ.get("MKL_NUM_THREADS")}}))
{FIGURES}
"""


def test_launch_placeholders_threads_and_the_start_directory_reach_the_command(tmp_path):
    extra = ["--nodes={nodes}", "--node_rank={node_rank}", "--addr={master_addr}", "--port={master_port}"]
    spec = spec_for(tmp_path, PLACEHOLDERS, extra_argv=extra, machine=MachineConfig(device="cpu", cpu_threads=3), cwd=str(tmp_path))
    result = run_command_trial(spec)
    assert result.status == Status.OK, result.error
    seen = json.loads((Path(spec.trial_dir) / "seen.json").read_text())
    args = dict(a.lstrip("-").split("=", 1) for a in seen["argv"])
    assert args["nodes"] == "1" and args["node_rank"] == "0" and args["addr"] == "127.0.0.1"
    assert 1024 < int(args["port"]) < 65536 and int(args["port"]) != 29500
    assert seen["cwd"] == str(tmp_path)  # never the trial dir
    assert seen["omp"] == "3" and seen["mkl"] == "3"
    # workload.env wins over machine.cpu_threads
    own = spec_for(tmp_path, PLACEHOLDERS, machine=MachineConfig(device="cpu", cpu_threads=3), cwd=str(tmp_path), env={"OMP_NUM_THREADS": "7"})
    run_command_trial(own)
    assert json.loads((Path(own.trial_dir) / "seen.json").read_text())["omp"] == "7"


def test_a_sigkill_without_memory_evidence_is_a_failure_not_an_oom(tmp_path):
    script = f"import os, signal\n{FIGURES.splitlines()[0]}\nos.kill(os.getpid(), signal.SIGKILL)\n"
    result = run_command_trial(spec_for(tmp_path, script))
    assert result.status == Status.FAILED, result
    assert "killed" in result.error and "oom" not in result.status


def test_a_missing_script_is_a_one_line_failure_on_the_node(tmp_path):
    spec = spec_for(tmp_path, FIGURES)
    spec.workload.argv[1] = "gone.py"
    result = run_command_trial(spec)
    assert result.status == Status.FAILED and "names 'gone.py', which is not a file in" in result.error


@pytest.mark.parametrize(
    "argv, scripts",
    [
        (["python", "train.py", "--bs={per_device_batch}"], ["train.py"]),
        (["torchrun", "--nproc_per_node={num_devices}", "--standalone", "src/train.py"], ["src/train.py"]),
        (["accelerate", "launch", "train", "--num_processes={num_devices}"], ["train"]),
        (["python3.11", "-u", "train.py"], ["train.py"]),
        (["python", "-m", "trainer.main", "--bs={accum}"], []),
        (["bash", "run.sh", "--cfg=x.py"], []),
    ],
)
def test_the_scripts_a_command_needs_are_found_in_its_argv(argv, scripts):
    assert script_arguments(argv) == scripts


def test_a_reused_pid_is_not_reattached(tmp_path):
    folder = tmp_path / "submitit"
    folder.mkdir()
    # A live process that looks like a submitit controller of this folder: its pid is recorded,
    # but with another start time (the recorded controller ended; the pid was given again).
    look_alike = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "submitit.local._local", str(folder)])
    try:
        trial = tmp_path / "trial"
        trial.mkdir()
        record = {"job_id": str(look_alike.pid), "cluster": "local", "log": "", "num_tasks": 1, "submitted_at": "", "create_time": 1.0}
        (trial / backend.JOB_FILE).write_text(json.dumps(record))
        assert backend.reattach(trial, str(folder)) is None
        record["create_time"] = psutil.Process(look_alike.pid).create_time()
        (trial / backend.JOB_FILE).write_text(json.dumps(record))
        assert backend.reattach(trial, str(folder)) is not None  # the same process: still this trial's job
        assert backend.reattach(trial, str(tmp_path / "another-sweep")) is None  # another sweep's folder
    finally:
        look_alike.kill()
        look_alike.wait()


def _sleep_forever() -> None:
    time.sleep(300)


def test_a_stopped_job_is_ended_by_cancel_within_the_grace(tmp_path):
    from dataclasses import asdict

    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf

    conf = {**asdict(LocalQueueConf()), "submitit_folder": str(tmp_path / "%j"), "name": "sweep"}
    executor = backend.make_executor(conf, 60)
    job = executor.submit(_sleep_forever)
    controller = psutil.Process(int(job.job_id))
    deadline = time.monotonic() + 30
    while not controller.children() and time.monotonic() < deadline:
        time.sleep(0.1)
    task = controller.children()[0]
    os.kill(task.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    backend.cancel_job(job, "local")
    while not job.done() and time.monotonic() - t0 < 20:
        time.sleep(0.2)
    assert job.done(), "a stopped job outlived its cancel"
    assert time.monotonic() - t0 < 12
    assert gone(task.pid, 1.0)


TORCH_TRAINER = """
import json, os, sys, time
import torch
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
own = []
for step in range(40):
    t = time.perf_counter()
    loss = model(torch.randn(32, 64)).pow(2).mean()
    loss.backward()
    time.sleep(0.03)  # a step long enough to time steadily on a busy host
    opt.step()
    opt.zero_grad()
    own.append(time.perf_counter() - t)
    print(f"step {step} {own[-1] * 1000:.3f} ms/step {8 / own[-1]:.1f} samples/s", flush=True)
    print(f"bar {step} rate={2 * 8 / own[-1]:.1f} samples/s", flush=True)  # a progress bar that counts twice
open(os.path.join(os.environ["SWEEP_TRIAL_DIR"], "own.json"), "w").write(json.dumps(own))
"""


@pytest.mark.slow
def test_the_probe_measures_a_torch_command_and_the_log_is_the_fallback(tmp_path):
    trial = TrialConfig(warmup_steps=2, measure_steps=30, max_measure_steps=40, target_precision=0.001)
    probed = spec_for(tmp_path, TORCH_TRAINER, parser=STEP_RE, trial=trial)
    result = run_command_trial(probed)
    assert result.status == Status.OK, result.error
    assert result.measured_by == "probe" and result.ranks_seen == 1
    # The script's own timer, independently, of the very steps the figure rests on: after the warm-up and any leading
    # steps core/steady.py left out (warmup_steps counts both), as a busy box can make the first timed steps slow.
    start = result.warmup_steps
    own = json.loads((Path(probed.trial_dir) / "own.json").read_text())[start : start + len(result.step_times_s)]
    probe_median = statistics.median(result.step_times_s)
    assert probe_median == pytest.approx(statistics.median(own), rel=0.05)
    # The figure is samples over the wall time of those steps (core/stats.py), every slow step counted.
    assert result.throughput == pytest.approx(8 * len(result.step_times_s) / sum(result.step_times_s), rel=1e-6)
    assert (Path(probed.trial_dir) / "probe-1").is_dir()
    # sweep.logs shows the probe's figures beside the log's. Here the script prints its own step times: they
    # agree, or on a loaded host may sit a few percent apart inside each other's interval, never flagged.
    import io

    from sweep.logs import main as logs_main

    out = io.StringIO()
    code = logs_main([result.log, "--parser", "regex", "--pattern", STEP_RE["pattern"], "--global-batch-size", "8"], out=out)
    assert code == 0, out.getvalue()
    text = out.getvalue()
    assert "probe (" in text and "1 rank(s)" in text and "log vs probe:" in text, text
    assert ": agree (" in text or ": too noisy to tell (" in text, text
    out = io.StringIO()
    bar = r"bar (?P<step>\d+) rate=(?P<throughput>[\d.]+) samples/s"
    assert logs_main([result.log, "--parser", "regex", "--pattern", bar, "--global-batch-size", "8"], out=out) == 0
    assert ": DISAGREE (" in out.getvalue(), out.getvalue()
    # The probe off: the same command measured from its log.
    (tmp_path / "off").mkdir()
    off = spec_for(tmp_path / "off", TORCH_TRAINER, parser=STEP_RE, trial=trial)
    off = replace(off, workload=replace(off.workload, probe=False))
    logged = run_command_trial(off)
    assert logged.status == Status.OK and logged.measured_by == "log"
    assert not (Path(off.trial_dir) / "probe-1").exists()


def test_a_command_without_torch_falls_back_to_its_log(tmp_path):
    script = "\n".join(f"print('step {e} 5.000 ms/step 1600.0 samples/s', flush=True)" for e in range(12))
    result = run_command_trial(spec_for(tmp_path, script, parser=STEP_RE))
    assert result.status == Status.OK and result.measured_by == "log"
    assert result.throughput == pytest.approx(1600.0)


def test_space_separated_batch_flags_are_the_recommendations_flags():
    from sweep.parsers.presets import flags_template

    argv = ["python", "train.py", "--batch_size", "{per_device_batch}", "--grad_accum={accum}", "--lr", "0.1", "-b", "x{joint_batch}"]
    assert flags_template("regex", argv) == "--batch_size {per_device_batch} --grad_accum={accum} -b x{joint_batch}"
