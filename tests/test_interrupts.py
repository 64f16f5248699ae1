"""Stopping a sweep: Ctrl-C, a second Ctrl-C, SIGTERM and a closed stdout, with real processes.

Each case starts `python -m sweep` with the fake command as its workload (accum=1 finishes at
once, the others take 12 s), in a session of its own as a terminal would run it, waits until
the first trial has finished and the next one runs, then stops it the way a user would. A
terminal's Ctrl-C goes to the whole foreground process group, so the signal goes to the group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FAKE = Path(__file__).with_name("fake_train.py")
ARGV = (
    'workload.argv=["' + sys.executable + '","' + str(FAKE) + '","--accum={accum}","--split={split}",'
    '"--global_batch_size={global_batch_size}","--behaviours=2:slow,4:slow"]'
)


def start(tmp_path: Path, stdout: int | None = subprocess.PIPE) -> tuple[subprocess.Popen, Path]:
    sweep_dir = tmp_path / "sweep dir é"  # a space and a non-ASCII letter: the hint must still work
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    env.pop("SWEEP_DEBUG", None)
    args = [
        sys.executable, "-m", "sweep", f"hydra.sweep.dir='{sweep_dir}'", "workload=command", ARGV,
        "global_batch_size=16", "search=grid", "accum=1,2,4", "split=1", "trial.time_limit_s=60",
    ]
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=env, stdout=stdout, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, start_new_session=True,
    )
    return proc, sweep_dir


def wait_for_second_trial(proc: subprocess.Popen, sweep_dir: Path, timeout_s: float = 60) -> None:
    """Until accum=1 has its result and another trial's job was submitted."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = (sweep_dir / "trials" / "accum1_split1" / "result.json").exists()
        running = any((sweep_dir / "trials" / k / "job.json").exists() for k in ("accum2_split1", "accum4_split1"))
        if done and running:
            time.sleep(0.5)  # the job's controller and trial are up
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    out, err = proc.communicate()
    pytest.fail(f"the sweep did not reach its second trial: rc={proc.returncode}\n{out}\n{err}")


def state(sweep_dir: Path) -> str:
    return json.loads((sweep_dir / "sweep.json").read_text())["state"]


def kept(sweep_dir: Path) -> dict:
    return json.loads((sweep_dir / "trials" / "accum1_split1" / "result.json").read_text())


def hint(sweep_dir: Path) -> str:
    import shlex

    return f"resume with: python -m sweep {shlex.quote(f'resume={sweep_dir}')}"


def no_trial_left(sweep_dir: Path, timeout_s: float = 15) -> bool:
    """No process of this sweep's trials is still running (the fake command has the dir in its cwd)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = []
        for p in psutil.process_iter(["cmdline", "cwd"]):
            try:
                if str(sweep_dir) in " ".join(p.info["cmdline"] or []) + (p.info["cwd"] or ""):
                    alive.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        if not alive:
            return True
        time.sleep(0.2)
    return False


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
