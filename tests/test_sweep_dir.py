"""Where a sweep writes (issue 30's data and paths, issue 33's refusals), with real `python -m sweep` runs.

Each refusal is one line, exit 2, and leaves the working directory as it was; a user's own files
are never overwritten or replaced.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.sweep_dirs import COMMAND, interrupt_while_starting, sweep


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def refused(proc: subprocess.CompletedProcess, *texts: str) -> None:
    where = f"stdout={proc.stdout!r}\nstderr={proc.stderr!r}"
    assert proc.returncode == 2, where
    assert "Traceback" not in proc.stdout + proc.stderr, where
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweep: error: "), where
    for text in texts:
        assert text in lines[0], f"{text!r} missing; {where}"


@pytest.mark.e2e
def test_the_filesystem_root_is_refused(tmp_path):
    refused(sweep(tmp_path, "hydra.sweep.dir=/", *COMMAND), "hydra.sweep.dir=/ is the filesystem root")
    assert tree(tmp_path) == []


@pytest.mark.e2e
def test_a_dir_of_other_files_is_refused_and_left_as_it_was(tmp_path):
    """Its own trials.csv and recommendation.yaml used to be overwritten silently."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "trials.csv").write_text("my,own,table\n")
    (mine / "recommendation.yaml").write_text("mine: true\n")
    before = {p.name: p.read_text() for p in mine.iterdir()}
    refused(sweep(tmp_path, "hydra.sweep.dir=mine", *COMMAND), "hydra.sweep.dir=mine holds other files",
            "recommendation.yaml, trials.csv", "no sweep.json or trials/")
    assert {p.name: p.read_text() for p in mine.iterdir()} == before
    assert tree(tmp_path) == ["mine", "mine/recommendation.yaml", "mine/trials.csv"]


@pytest.mark.e2e
def test_a_refused_gpu_profile_leaves_no_dated_dir(tmp_path):
    """issue 33: `+machine=a100x8` on a host without those GPUs left an empty outputs/<date> each time."""
    for _ in range(2):
        refused(sweep(tmp_path, "+machine=a100x8", *COMMAND), "machine=a100x8 needs 8 CUDA device(s)")
    assert tree(tmp_path) == []


@pytest.mark.e2e
def test_a_users_file_named_latest_is_kept_and_the_link_follows_sweeps(tmp_path):
    out = tmp_path / "outputs"
    out.mkdir()
    (out / "latest").write_text("my notes\n")
    proc = sweep(tmp_path, "hydra.sweep.dir=outputs/run1", *COMMAND)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "latest").read_text() == "my notes\n" and not (out / "latest").is_symlink()
    assert f"{out / 'latest'} is not sweep's link to the latest sweep: left as it is" in proc.stdout
    (out / "latest").unlink()
    proc = sweep(tmp_path, "hydra.sweep.dir=outputs/run2", *COMMAND)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert os.readlink(out / "latest") == "run2"


@pytest.mark.e2e
def test_the_latest_link_as_the_sweep_dir_is_the_sweep_it_points_to(tmp_path):
    """It became a self-loop, then a FileExistsError traceback."""
    proc = sweep(tmp_path, "hydra.sweep.dir=outputs/run1", *COMMAND)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = sweep(tmp_path, "hydra.sweep.dir=outputs/latest", *COMMAND)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reusing 1 finished trial(s)" in proc.stdout and str(tmp_path / "outputs" / "run1") in proc.stdout
    assert os.readlink(tmp_path / "outputs" / "latest") == "run1"
    assert sorted(p.name for p in (tmp_path / "outputs").iterdir()) == ["latest", "run1"]


@pytest.mark.e2e
def test_a_damaged_sweep_json_says_the_results_are_intact_and_how_to_reuse_them(tmp_path):
    proc = sweep(tmp_path, "hydra.sweep.dir=run 1", *COMMAND)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tmp_path / "run 1" / "sweep.json").write_text('{"argv": [')
    refused(sweep(tmp_path, "resume=run 1"), "resume=run 1: its sweep.json is damaged (not valid JSON)",
            "the 1 trial result(s) under run 1/trials are intact", "'hydra.sweep.dir=run 1'")
    # What it says works: the original command with that dir reuses the trial.
    proc = sweep(tmp_path, "hydra.sweep.dir=run 1", *COMMAND)
    assert proc.returncode == 0 and "reusing 1 finished trial(s)" in proc.stdout, proc.stdout + proc.stderr


@contextlib.contextmanager
def sigint_ignored_in_children() -> Iterator[None]:
    """Children started inside begin with SIGINT ignored, as a script's background job does (an ignored signal passes through exec)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.e2e
@pytest.mark.parametrize("delay_s", [0.0, 0.1, 0.2, 0.3, 0.6])
def test_ctrl_c_while_starting_up_prints_no_traceback(tmp_path, delay_s):
    """A Ctrl-C in sweep's first 0.3 s (imports, Hydra's composition) printed a KeyboardInterrupt traceback."""
    proc = interrupt_while_starting(tmp_path, delay_s)
    out, err = proc.stdout, proc.stderr
    assert "Traceback" not in out + err, err
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, out, err)
    assert proc.returncode == -signal.SIGINT or "interrupted" in out + err, (out, err)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("orig_argv", "is_cli"),
    [
        (["python", "-m", "sweep", "+machine=cpu2"], True),
        (["python", "-X", "importtime", "-m", "sweep"], True),
        (["python", "-m", "sweep.logs", "train.log"], False),
        (["python", "-m", "sweep.workloads.rnnt.train"], False),
    ],
)
def test_only_the_cli_itself_exits_at_once_on_ctrl_c_while_starting(monkeypatch, orig_argv, is_cli):
    """A user's `python -m sweep.workloads.rnnt.train` keeps Python's own KeyboardInterrupt."""
    from sweep import startup

    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    assert startup.runs_as_the_cli() is is_cli


@pytest.mark.e2e
def test_a_sweep_started_with_sigint_ignored_keeps_it_ignored_and_sigterm_still_stops_it(tmp_path):
    """`python -m sweep &` from a script: the terminal's Ctrl-C belongs to the foreground job, as for Python itself."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "FAULT_DELAY_S": "30"}
    with sigint_ignored_in_children():
        proc = subprocess.Popen(
            [sys.executable, "-m", "sweep", "hydra.sweep.dir=s", *COMMAND],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "sweep s-" in line:  # the orchestrator's first line: its stop handlers are in place
            break
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    assert proc.poll() is None, "".join(seen)
    proc.terminate()
    out = "".join(seen) + proc.communicate(timeout=60)[0]
    assert proc.returncode == 143, out
    assert "terminated:" in out and "Traceback" not in out, out


@pytest.mark.e2e
def test_a_sweep_json_that_is_a_fifo_does_not_hang_resume(tmp_path):
    d = tmp_path / "d"
    (d / "trials").mkdir(parents=True)
    os.mkfifo(d / "sweep.json")
    refused(sweep(tmp_path, "resume=d", timeout=60), "its sweep.json is unreadable (not a regular file)")
