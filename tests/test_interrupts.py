"""Stopping a sweep: Ctrl-C, a second Ctrl-C, SIGTERM and a closed stdout, with real processes.

Each case starts `python -m sweep` with the fake command as its workload (accum=1 finishes at
once, the others take 12 s), in a session of its own as a terminal would run it, waits until
the first trial has finished and the next one runs, then stops it the way a user would. A
terminal's Ctrl-C goes to the whole foreground process group, so the signal goes to the group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.interrupts import ARGV, hint, kept, no_trial_left, start, state, wait_for_second_trial


@pytest.mark.e2e
@pytest.mark.parametrize(
    "signals, code, word",
    [
        ([signal.SIGINT], 130, "interrupted"),
        ([signal.SIGINT, signal.SIGINT], 130, "interrupted"),  # an impatient second Ctrl-C
        ([signal.SIGTERM], 143, "terminated"),
    ],
    ids=["ctrl_c", "ctrl_c_twice", "sigterm"],
)
def test_a_signal_stops_the_sweep_with_the_hint_and_no_traceback(tmp_path, signals, code, word):
    proc, sweep_dir = start(tmp_path)
    wait_for_second_trial(proc, sweep_dir)
    for sig in signals:
        os.killpg(proc.pid, sig)  # as a terminal does: the whole foreground process group
        time.sleep(0.05)
    out, err = proc.communicate(timeout=60)
    where = f"stdout={out!r}\nstderr={err!r}"
    assert proc.returncode == code, where
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, where
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"{word}: ") and hint(sweep_dir) in last, where
    assert state(sweep_dir) == "interrupted"
    assert kept(sweep_dir)["status"] == "ok"  # the finished trial is kept
    assert no_trial_left(sweep_dir), "a trial of the stopped sweep still runs"


@pytest.mark.e2e
def test_an_interrupted_sweep_resumes_from_its_dir_with_a_space_and_non_ascii_name(tmp_path):
    proc, sweep_dir = start(tmp_path)
    wait_for_second_trial(proc, sweep_dir)
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=60)
    before = kept(sweep_dir)
    # The resumed run's slow trial need not be slow: what is checked is the reuse, and that the sweep ends done.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "FAULT_DELAY_S": "0", "FAKE_SLOW_S": "0"}
    resumed = subprocess.run(
        [sys.executable, "-m", "sweep", f"resume={sweep_dir}", "accum=1,2", "split=1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "reusing 1 finished trial(s)" in resumed.stdout
    assert kept(sweep_dir) == before  # reused, not rerun
    assert state(sweep_dir) == "done"


@pytest.mark.e2e
def test_a_closed_stdout_stops_the_sweep_as_interrupted_with_the_hint_on_stderr(tmp_path):
    """`python -m sweep | head -2`: once head has gone, nobody reads the table; the sweep stops
    as interrupted rather than run on unseen or end without a word."""
    proc, sweep_dir = start(tmp_path)
    assert proc.stdout is not None
    proc.stdout.readline()
    wait_for_second_trial(proc, sweep_dir)
    proc.stdout.close()  # the reader went away
    err = proc.stderr.read() if proc.stderr else ""
    proc.wait(timeout=60)
    assert proc.returncode == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert f"stdout closed: in-flight trials cancelled; finished results are kept in {sweep_dir}" in err
    assert hint(sweep_dir) in err
    assert state(sweep_dir) == "interrupted"
    assert kept(sweep_dir)["status"] == "ok"


@pytest.mark.e2e
def test_piped_into_head_it_stops_quietly_even_as_a_trial_starts(tmp_path):
    """`python -m sweep | head -3` with fast trials: head leaves just as the next trial's job
    starts, whose controller has no task yet; stopping it prints no traceback."""
    import shlex

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    args = [sys.executable, "-m", "sweep", "hydra.sweep.dir=P", "workload=command", ARGV.replace(',"--behaviours=2:slow,4:slow"', ""),
            "global_batch_size=16", "search=grid", "accum=1,2,4", "split=1,2"]
    script = " ".join(shlex.quote(a) for a in args) + ' | head -3 > head.out; echo "${PIPESTATUS[0]}" > status'
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert (tmp_path / "status").read_text().strip() == "141", proc.stderr
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("stdout closed: ") and hint(tmp_path / "P") in proc.stderr, proc.stderr
    assert len((tmp_path / "head.out").read_text().splitlines()) == 3
    assert state(tmp_path / "P") == "interrupted"
