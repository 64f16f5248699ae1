"""The probe in real processes: a plain PyTorch script run by python and by torchrun, under probe_env.

The scenario scripts are forked from a server that has imported torch (run_probed); the tests of how the
probe starts (a fresh interpreter's import hook, torchrun's ranks, the inert cases, a shadowed or broken
start-up) start a fresh interpreter."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.sweep_run import forked_python

from sweep.core.probe_report import parse_records
from sweep.probe import BOOT_DIR, oom_phase_of, probe_env, read_probe

TRAIN = Path(__file__).with_name("probe_train.py")


def run_probed(tmp_path: Path, *argv: str, env_extra: dict[str, str] | None = None, launcher: list[str] | None = None, check=True,
               fresh: bool = False):
    """`python ARGV` (or `LAUNCHER ARGV`) with the probe's environment; (process, record dir).

    A script under plain python is forked from a server that has imported torch (tests/support/sweep_run.py): it then
    starts as an interpreter would with this environment (PYTHONPATH, the probe's sitecustomize), which finds
    torch imported and arms at once. fresh (and a launcher, and `-c`): a new interpreter, whose sitecustomize
    arms the probe when the script imports torch, the path every command trial takes."""
    records = tmp_path / "probe"
    env = {**os.environ, **probe_env(records, base_env=os.environ), "OMP_NUM_THREADS": "1", **(env_extra or {})}
    if fresh or launcher or argv[0] == "-c":
        proc = run_group([*(launcher or [sys.executable]), *argv], env=env, cwd=tmp_path)
    else:
        proc = forked_python(argv[0], list(argv[1:]), tmp_path, env, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, records


def run_group(cmd: list[str], timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run in its own process group, all of which is killed on timeout (torchrun's ranks too)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def own_times(tmp_path: Path, rank: int) -> list[float]:
    return json.loads((tmp_path / f"own.rank{rank}.json").read_text())


def assert_matches(probe_times: list[float], own: list[float]) -> None:
    """The probe's step boundaries are the script's, compared as boundaries: running totals from the end
    of step 0 (the two start step 0 at different places: the script's loop, the probe's first forward).

    The probe reads its clock as the last optimizer step returns, a few microseconds before the script
    reads its own. Where the process loses the CPU (this loaded 2-core CI host) or collects garbage in
    between, that one boundary is late on the script's side, and the two steps beside it are off in
    opposite directions. Compared step by step, two such stalls in a row failed; compared as boundaries,
    each stall is one boundary. So: two thirds of the boundaries agree within 1% of a median step (a step
    between two of them then agrees within 2%), none is off by a quarter of a step (the longest stall seen
    under two busy loops was 7% of one; a boundary that far off is not where the script's is), and the
    totals agree within 2%."""
    assert len(probe_times) == len(own)
    probe_ends = np.cumsum(probe_times[1:])
    own_ends = np.cumsum(own[1:])
    offsets = own_ends - probe_ends
    offsets -= np.median(offsets)  # the end of step 0 may itself be a late boundary
    step = float(np.median(own[1:]))
    on_time = np.abs(offsets) <= 0.01 * step
    assert on_time.sum() >= 2 / 3 * len(offsets), (offsets.round(4).tolist(), probe_times, own)
    assert np.all(np.abs(offsets) < 0.25 * step), (offsets.round(4).tolist(), probe_times, own)
    assert abs(probe_ends[-1] - own_ends[-1]) <= 0.02 * own_ends[-1], (probe_times, own)


def test_probe_env_puts_the_boot_dir_first_and_keeps_the_rest(tmp_path):
    env = probe_env(tmp_path / "rec", base_env={"PYTHONPATH": f"/a{os.pathsep}/b"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BOOT_DIR), "/a", "/b"]
    assert env["SWEEP_PROBE_DIR"] == str((tmp_path / "rec").resolve())
    assert probe_env("r", base_env={})["PYTHONPATH"] == str(BOOT_DIR)
    assert (BOOT_DIR / "sitecustomize.py").is_file() and (BOOT_DIR / "_sweep_probe.py").is_file()


def test_inert_in_a_process_that_never_imports_torch(tmp_path):
    code = "import sys, json; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', '_sweep_probe'))))"
    proc, records = run_probed(tmp_path, "-c", code)
    assert json.loads(proc.stdout) == []
    assert not records.exists() or not any(records.iterdir())
    assert proc.stderr == ""


def test_nothing_at_all_with_the_variable_unset(tmp_path):
    code = (
        "import sys, torch, json\n"
        "from torch.optim.optimizer import _global_optimizer_pre_hooks\n"
        "m = torch.nn.Linear(2, 2); o = torch.optim.SGD(m.parameters(), lr=0.1); m(torch.ones(1, 2)).sum().backward(); o.step()\n"
        "print(json.dumps(['_sweep_probe' in sys.modules, len(_global_optimizer_pre_hooks)]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BOOT_DIR), os.environ.get("PYTHONPATH", "")])}
    env.pop("SWEEP_PROBE_DIR", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [False, 0]
    assert list(tmp_path.iterdir()) == []


def test_plain_script_under_python(tmp_path):
    proc, records = run_probed(tmp_path, str(TRAIN), "--steps", "16", "--width", "1024", "--batch", "1024", "--own-times", "own", fresh=True)
    report = read_probe(records)
    assert report.armed and report.ranks == [0] and report.device == "cpu" and report.problems == []
    assert [s.index for s in report.steps] == list(range(16))
    assert all(s.optimizers == 1 and s.skipped == 0 for s in report.steps)
    assert_matches(report.step_times_s, own_times(tmp_path, 0))
    # CPU memory every step: the resident peak, and the address-space peak beside it.
    assert all(s.peak_bytes and s.peak_reserved_bytes >= s.resident_peak_bytes > 0 for s in report.steps)
    assert report.peak_bytes == max(s.peak_bytes for s in report.steps)
    assert report.steps[report.peak_step].peak_bytes == report.peak_bytes
    assert proc.stdout == "" and proc.stderr == ""  # nothing of the probe's in the user's log


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_torchrun_two_ranks_slowest_rank(tmp_path):
    _, records = run_probed(
        tmp_path, str(TRAIN), "--steps", "12", "--width", "1024", "--batch", "1024", "--own-times", "own",
        launcher=["torchrun", "--standalone", "--nproc_per_node=2"],
    )
    report = read_probe(records)
    assert report.ranks == [0, 1]
    assert [s.ranks for s in report.steps] == [2] * 12
    # Each rank's steps are that rank's own (compared rank by rank: a stall between the two clocks moves
    # one boundary of one rank, which a per-step maximum over ranks does not give back in the next step)...
    by_rank = {}
    for path in records.glob("*.jsonl"):
        steps = [r for r in parse_records(path.read_text(), path.name)[0] if r["kind"] == "step"]
        if steps:
            by_rank[steps[0]["rank"]] = [r["seconds"] for r in sorted(steps, key=lambda r: r["step"])]
    assert sorted(by_rank) == [0, 1]
    for rank, seconds in by_rank.items():
        assert_matches(seconds, own_times(tmp_path, rank))
    # ...and each step's figure is the slower rank's.
    assert report.step_times_s == [max(a, b) for a, b in zip(by_rank[0], by_rank[1])]
    files = sorted(p.name.split("-")[0] for p in records.glob("*.jsonl"))
    assert files.count("rank1") == 1  # torchrun's own process imports torch too; it never steps


def test_two_optimizers_in_one_iteration_are_one_step(tmp_path):
    _, records = run_probed(tmp_path, str(TRAIN), "--steps", "16", "--optimizers", "2", "--width", "1024", "--batch", "1024", "--own-times", "own")
    report = read_probe(records)
    assert len(report.steps) == 16
    assert [s.optimizers for s in report.steps] == [2] * 16
    assert_matches(report.step_times_s, own_times(tmp_path, 0))


def test_a_step_the_grad_scaler_skips_still_counts(tmp_path):
    _, records = run_probed(tmp_path, str(TRAIN), "--steps", "16", "--skip-step", "3", "--width", "1024", "--batch", "1024", "--own-times", "own")
    report = read_probe(records)
    assert len(report.steps) == 16
    assert [s.skipped for s in report.steps] == [0, 0, 0, 1] + [0] * 12
    assert_matches(report.step_times_s, own_times(tmp_path, 0))


@pytest.mark.parametrize(
    ("mode", "step", "module", "where", "via", "phase"),
    [
        # The first step is tracked live: the module whose output backward had reached.
        ("forward", 0, "encoder.block", "forward", "hooks", "encoder"),
        ("backward", 0, "joint", "backward", "hooks", "joint"),
        # The second step: step 0 closes only when its optimizer steps again, so an OOM before that is
        # still in step 1 (with the modules still tracked live).
        ("forward", 1, "encoder.block", "forward", "hooks", "encoder"),
        ("backward", 1, "joint", "backward", "hooks", "joint"),
        # Later steps carry no module hooks: the failing call's frames, and in backward the autograd node
        # that raised (a Python Function here), named by the module owning the nearest parameter.
        ("forward", 2, "encoder.block", "forward", "frames", "encoder"),
        ("backward", 2, "joint.out", "backward", "autograd node", "joint"),
    ],
)
def test_an_oom_names_the_module_it_happened_in(tmp_path, mode, step, module, where, via, phase):
    proc, records = run_probed(tmp_path, str(TRAIN), "--steps", "6", "--oom", mode, "--oom-step", str(step), check=False)
    assert proc.returncode == 1 and "can't allocate memory" in proc.stderr
    report = read_probe(records)
    assert len(report.steps) == step  # the steps before it
    oom = report.oom
    assert (oom.module, oom.where, oom.step, oom.rank, oom.inside) == (module, where, step, 0, True)
    assert "can't allocate memory" in oom.message
    assert oom_phase_of(oom.module, None) == phase and oom.via == via


def test_an_oom_the_trainer_recovers_from_is_still_recorded(tmp_path):
    _, records = run_probed(tmp_path, str(TRAIN), "--steps", "6", "--oom", "recover")
    report = read_probe(records)
    assert len(report.steps) == 6
    assert report.oom is not None and (report.oom.module, report.oom.step) == ("encoder.block", 2)


def test_a_killed_process_leaves_what_it_measured(tmp_path):
    code = (
        "import os, signal, torch\n"
        "m = torch.nn.Linear(8, 8); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(5):\n"
        "    m(torch.ones(4, 8)).sum().backward(); o.step()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc, records = run_probed(tmp_path, "-c", code, check=False)
    assert proc.returncode == -9
    report = read_probe(records)
    # The last step closes only when the next would start (one optimizer: its set is learnt at step 1).
    assert [s.index for s in report.steps] == [0, 1, 2, 3, 4]


def test_the_shadowed_sitecustomize_still_runs(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nopen(os.environ['MARK'], 'w').write(__file__)\n")
    for probe_on in (True, False):
        mark = tmp_path / f"mark{probe_on}"
        env = {**os.environ, "MARK": str(mark), "PYTHONPATH": os.pathsep.join([str(BOOT_DIR), str(other)])}
        env.pop("SWEEP_PROBE_DIR", None)
        if probe_on:
            env["SWEEP_PROBE_DIR"] = str(tmp_path / "rec")
        proc = subprocess.run([sys.executable, "-c", "import sitecustomize; print(sitecustomize.__file__)"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert mark.read_text() == str(other / "sitecustomize.py")
        assert proc.stdout.strip() == str(BOOT_DIR / "sitecustomize.py")


def test_a_broken_probe_does_not_break_training(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # the record dir cannot be made: the probe has nowhere to write
    env = {**os.environ, **probe_env(blocker / "probe", base_env=os.environ)}
    # 18 s beside two busy loops; the full suite's load of 10 on 2 cores once took it past 120 s.
    proc = subprocess.run([sys.executable, str(TRAIN), "--steps", "3"], env=env, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
