"""Submit and walk away, on this host: detach=true, python -m sweep.status and python -m sweep.cancel, tried as a user
would, with real sweeps of the built-in demo. The search's terminal goes away (its session gets SIGHUP) and the search
goes on; the search is killed and cancel still leaves nothing running; bad input is one line, exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.waiting import wait_for

pytestmark = pytest.mark.e2e


def sweep(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sweep", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def tool(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", f"sweep.{name}", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def snapshot(sweep_dir: Path) -> dict:
    out = tool("status", str(sweep_dir), "--json", cwd=sweep_dir.parent)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def live_processes_under(sweep_dir: Path) -> list[psutil.Process]:
    """Processes whose command line names the sweep dir (the search, its jobs' controllers, warm workers)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(sweep_dir) in part for part in p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


def detach(tmp_path: Path) -> tuple[Path, subprocess.CompletedProcess[str], dict]:
    """`python -m sweep detach=true` started as a terminal's session would be; once it returns, that session is hung
    up (SIGHUP to its process group, as a closed terminal or lost ssh connection does)."""
    sweep_dir = tmp_path / "walk away"
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "sweep", "detach=true", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert time.monotonic() - started < 60  # the terminal is free again in seconds, not after the sweep
    try:
        os.killpg(proc.pid, signal.SIGHUP)  # the terminal's session goes away
    except ProcessLookupError:
        pass  # nothing of that session is left to hang up
    search = json.loads((sweep_dir / "search.json").read_text())
    assert psutil.pid_exists(search["pid"])  # the search goes on
    return sweep_dir, subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), search


@pytest.mark.slow
def test_a_detached_sweep_survives_its_terminal_and_is_cancelled_from_another_shell(tmp_path):
    sweep_dir, out, search = detach(tmp_path)
    assert "python -m sweep.status" in out.stdout and "python -m sweep.cancel" in out.stdout and str(sweep_dir) in out.stdout
    assert search["detached"] and search["log"] == str(sweep_dir / "search.log")
    # A session of its own: the hang-up a closed terminal sends its session's processes does not reach it.
    assert os.getsid(search["pid"]) == search["pid"] != os.getsid(0)
    def started() -> dict | None:
        s = snapshot(sweep_dir)
        return s if s["running"] or any(r["status"] == "ok" for r in s["table"]) else None

    snap = wait_for(started, seen="a trial running or landed", poll_s=0.3)
    assert snap["state"] == "running" and snap["search"]["alive"] is True and snap["search"]["detached"]
    once = tool("status", str(sweep_dir), "--once", cwd=tmp_path)
    assert once.returncode == 0 and "alive (detached" in once.stdout and "samples/s" in once.stdout
    cancelled = tool("cancel", str(sweep_dir), cwd=tmp_path)
    assert cancelled.returncode == 0 and "search stopped" in cancelled.stdout, cancelled.stdout + cancelled.stderr
    after = snapshot(sweep_dir)
    assert after["state"] == "interrupted" and after["search"]["alive"] is False and not after["running"]
    assert wait_for(lambda: not live_processes_under(sweep_dir), 30, "every process of the sweep ended")
    again = tool("cancel", str(sweep_dir), cwd=tmp_path)
    assert again.returncode == 0 and "already ended (interrupted): nothing to cancel" in again.stdout


@pytest.mark.slow
def test_a_killed_search_leaves_jobs_that_cancel_ends_and_records(tmp_path):
    sweep_dir, _, search = detach(tmp_path)
    running = wait_for(lambda: snapshot(sweep_dir)["running"], seen="a trial job running", poll_s=0.3)
    os.kill(search["pid"], signal.SIGKILL)  # the search dies without cancelling anything
    wait_for(lambda: snapshot(sweep_dir)["search"]["alive"] is False, 30, "the search seen dead")
    shown = tool("status", str(sweep_dir), "--once", cwd=tmp_path).stdout
    assert "not running" in shown and f"resume={sweep_dir}" in shown  # says it is dead and how to go on
    cancelled = tool("cancel", str(sweep_dir), cwd=tmp_path)
    assert cancelled.returncode == 0 and "the search was not running; cancelled" in cancelled.stdout, cancelled.stdout + cancelled.stderr
    pair = running[0]["pair"]
    ended = json.loads((sweep_dir / "trials" / pair / "ended.json").read_text())
    assert ended["status"] == "cancelled" and "python -m sweep.cancel" in ended["error"]
    assert wait_for(lambda: not live_processes_under(sweep_dir), 30, "every process of the sweep ended")


@pytest.mark.parametrize("tool_name", ["status", "cancel"])
def test_status_or_cancel_of_a_dir_that_is_no_sweep_is_one_line_exit_2(tmp_path, tool_name):
    out = tool(tool_name, str(tmp_path), cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "is not a sweep dir (no sweep.json inside)" in out.stderr


def test_detach_on_slurm_is_refused_in_one_line(tmp_path):
    out = sweep("detach=true", "hydra/launcher=submitit_slurm", f"hydra.sweep.dir={tmp_path / 's'}", cwd=tmp_path)
    assert out.returncode == 2 and "detach=true is not supported with hydra/launcher=submitit_slurm yet" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "s").exists()
