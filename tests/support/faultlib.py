"""Fault injection for `python -m sweep`: SIGKILL-and-resume campaigns, failing trials, a lock
held by another sweep, a full or read-only disk. Shared by tests/test_faults.py and
bench/bench_reliability.py, which prints the figures docs/reliability.md quotes.

Every sweep here runs the fast fake command tests/fake_train.py (a trial takes about a
second, no torch) through the real launcher, as a user's sweep would.
"""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support.sweep_run import FRESH, ForkedRun
from sweep.core.ranking import TABLE_COLUMNS
from sweep.core.schema import ALL_STATUSES, RESULT_FILE, ResultError
from sweep.records import read_trial_record

HERE = Path(__file__).resolve().parents[1]  # tests/: the scripts the fault tests run
FAKE = HERE / "fake_train.py"
RUNNER = HERE / "fault_runner.py"

# The kill campaigns' sweep: 12 trials, 2 at a time, with every finished status but timeout.
KILL_ACCUMS, KILL_SPLITS = (1, 2, 4, 8, 16, 32), (1, 2)
KILL_BEHAVIOURS = "4:crash,16:oom,32:silent"
KILL_DURATION_S = "2.0"


class Unavailable(Exception):
    """This host cannot inject that fault (e.g. no permission to mount a filesystem)."""


def command_args(behaviours: str = "", accum=(1, 2), split=(1,), *extra: str) -> list[str]:
    argv = ",".join(
        f'"{a}"'
        for a in (sys.executable, FAKE, "--accum={accum}", "--split={split}", "--global_batch_size={global_batch_size}", f"--behaviours={behaviours}")
    )
    return [
        "workload=command",
        f"workload.argv=[{argv}]",
        "global_batch_size=64",
        "search=grid",
        "live=false",
        # The end-of-sweep drift check re-runs the two leading pairs: the fault ledgers count every start of a
        # pair as a trial, and these sweeps are about faults, not noise (bench_reliability's noisy case is).
        "search.drift_check=false",
        "accum=" + ",".join(map(str, accum)),
        "split=" + ",".join(map(str, split)),
        *extra,
    ]


def sweep_env(ledger: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SWEEP_DEBUG", "HYDRA_FULL_ERROR", "SWEEP_FAULT_SLOW_FSYNC")}
    env["PYTHONUNBUFFERED"] = "1"
    if ledger is not None:
        env["FAULT_LEDGER"] = str(ledger)
    env.update(extra)
    return env


def foreground_sigint() -> None:
    """Give the sweeps a bench starts the SIGINT a terminal's foreground job has, however the bench was started (as
    tests/conftest.py does for pytest): started as a script's background job (`nohup python bench/... &`), it
    inherits SIGINT ignored, which passes through exec, and every sweep it Ctrl-Cs would then keep ignoring it, as
    sweep must. A Python handler here is SIG_DFL in an exec'd child."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def start(sweep_dir: Path, args: list[str], env: dict[str, str], cwd: Path, fresh: bool = False) -> subprocess.Popen | ForkedRun:
    """The sweep in the background; its stdout/stderr go to files (read them with output()).

    Not pipes: the trial jobs inherit them, so after a SIGKILL a pipe would stay open until
    the orphaned trials end, and waiting for its end would wait for them.
    Forked from tests/sweep_server.py (a SIGKILL ends it as it ends a fresh one, and no handler
    runs either way); fresh: a new interpreter, for the signals a sweep handles itself (SIGINT)."""
    out_dir = cwd / "orchestrator_output"
    out_dir.mkdir(parents=True, exist_ok=True)
    n = len(list(out_dir.glob("*.out")))
    out, err = out_dir / f"{n:03d}.out", out_dir / f"{n:03d}.err"
    if not (fresh or FRESH):
        run = ForkedRun([f"hydra.sweep.dir={sweep_dir}", *args], cwd, env, str(out), str(err), script=str(RUNNER))
        run.output_files = (out, err)  # type: ignore[attr-defined]
        return run
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(
            [sys.executable, str(RUNNER), f"hydra.sweep.dir={sweep_dir}", *args],
            cwd=cwd, env=env, stdout=o, stderr=e, stdin=subprocess.DEVNULL, text=True,
        )
    proc.output_files = (out, err)  # type: ignore[attr-defined]
    return proc


def output(proc: subprocess.Popen) -> tuple[str, str]:
    """What a finished (or killed) sweep printed so far: its own lines, not its orphans' later ones."""
    out, err = proc.output_files  # type: ignore[attr-defined]
    return out.read_text(errors="replace"), err.read_text(errors="replace")


def run(sweep_dir: Path, args: list[str], env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    proc = start(sweep_dir, args, env, cwd)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"sweep still running after {timeout}s:\n" + "\n".join(output(proc))) from None
    out, err = output(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def table(sweep_dir: Path) -> dict[tuple[int, int], dict[str, str]]:
    """trials.csv by (accum, split); asserts the file is whole (full header, every row)."""
    with open(sweep_dir / "trials.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        assert reader.fieldnames == TABLE_COLUMNS, f"trials.csv header: {reader.fieldnames}"
    for r in rows:
        assert r["status"] in ALL_STATUSES, r
        assert None not in r and all(v is not None for v in r.values()), f"short row in trials.csv: {r}"
    return {(int(r["accum"]), int(r["split"])): r for r in rows}


def statuses(sweep_dir: Path) -> dict[tuple[int, int], tuple[str, str]]:
    return {k: (r["status"], r["oom_phase"]) for k, r in table(sweep_dir).items()}


def finished(sweep_dir: Path) -> dict[str, tuple]:
    """Every trial's record as readers take it (result.json, else the sweep's ended.json), each of
    which must parse: {trial: what identifies that measurement}."""
    out = {}
    for tdir in sorted(p for p in sweep_dir.glob("trials/*") if p.is_dir()):
        try:
            res = read_trial_record(tdir)
        except ResultError as e:
            raise AssertionError(f"torn result file after a kill: {e}") from None
        if res is not None:
            out[tdir.name] = (res.status, res.started_at, res.finished_at, res.throughput, tuple(res.step_times_s))
    return out


def check_whole(sweep_dir: Path, rows: int) -> dict[str, tuple]:
    """After a kill: what is there parses, whole. Returns the finished results."""
    if (sweep_dir / "trials.csv").exists():
        assert len(table(sweep_dir)) == rows
    if (sweep_dir / "sweep.json").exists():
        assert json.loads((sweep_dir / "sweep.json").read_text())["state"] in ("running", "done", "interrupted")
    if (sweep_dir / "recommendation.yaml").exists():
        assert "flags" in yaml.safe_load((sweep_dir / "recommendation.yaml").read_text())
    return finished(sweep_dir)


def ledger_counts(ledger: Path) -> Counter:
    if not ledger.exists():
        return Counter()
    return Counter(tuple(map(int, line.split()[:2])) for line in ledger.read_text().splitlines() if line.strip())


def stop_leftover_jobs(sweep_dir: Path) -> int:
    """SIGKILL what this sweep's local jobs left running (a controller killed before its
    pickle landed waits a minute for it); returns how many jobs were still alive."""
    from sweep.launch import backend as backends

    alive = 0
    for job_dir in sweep_dir.glob(".submitit/*"):
        if not job_dir.name.isdigit() or not backends._local_job_alive(int(job_dir.name)):
            continue
        alive += 1
        tasks, groups = backends.local_tree(int(job_dir.name))
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        for pid in [int(job_dir.name), *tasks]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return alive


# -- SIGKILL and resume ----------------------------------------------------------------------------

# Kill moments: "early" (a random instant in the first second: start-up, the first submissions),
# "uniform" (a random instant of a sweep's lifetime), or "write:NAME" (while the orchestrator is
# writing NAME: its temp file exists, the rename has not happened; the disk is made slow for it).
KILL_MOMENTS = (
    "early", "early", "write:sweep.json", "write:job.json", "uniform", "write:trials.csv", "write:result.json",
    "uniform", "write:trials.csv", "early", "write:job.json", "uniform", "write:trials.csv", "uniform",
    "write:result.json", "uniform",
)
SLOW_WRITE_S = 0.25
UNIFORM_WINDOW_S = 2.0


@dataclass
class Campaign:
    kills: int = 0  # SIGKILLs that hit a live orchestrator, each followed by a check and a resume
    moments: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # finished results that disappeared or changed
    reruns: list[str] = field(default_factory=list)  # trials whose command started more than once
    checks: int = 0
    final: dict = field(default_factory=dict)  # (accum, split) -> (status, oom_phase)
    wall_s: float = 0.0


def kill_sweep_args(*extra: str) -> list[str]:
    return command_args(KILL_BEHAVIOURS, KILL_ACCUMS, KILL_SPLITS, "max_in_flight=2", "trial.time_limit_s=60", *extra)


def reference_sweep(root: Path) -> tuple[dict, float]:
    """The same sweep, uninterrupted: its statuses and wall time."""
    sweep_dir, ledger = root / "reference", root / "reference.ledger"
    t0 = time.monotonic()
    proc = run(sweep_dir, kill_sweep_args(), sweep_env(ledger, FAULT_DURATION_S=KILL_DURATION_S), root)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(n == 1 for n in ledger_counts(ledger).values())
    return statuses(sweep_dir), wall


def _wait_for_temp(proc: subprocess.Popen, sweep_dir: Path, name: str, deadline: float) -> bool:
    pattern = f".{name}.*.tmp"
    where = [sweep_dir] if name in ("trials.csv", "sweep.json", "recommendation.yaml") else None
    seen_before = set(map(str, _temps(sweep_dir, pattern, where)))  # stale ones from earlier kills
    while time.monotonic() < deadline and proc.poll() is None:
        if any(str(p) not in seen_before for p in _temps(sweep_dir, pattern, where)):
            return True
        time.sleep(0.003)
    return False


def _temps(sweep_dir: Path, pattern: str, where: list[Path] | None) -> list[Path]:
    if where is not None:
        return [p for d in where for p in d.glob(pattern)]
    return list(sweep_dir.glob(f"trials/*/{pattern}"))


def kill_campaign(root: Path, seed: int, reference: dict, reference_wall_s: float, moments=KILL_MOMENTS, log=print) -> Campaign:
    """SIGKILL one sweep at each moment in turn, checking the sweep dir after every kill and
    resuming it each time; then let it finish. Compares everything with the reference."""
    rng = random.Random(seed)
    sweep_dir, ledger = root / f"killed_{seed}", root / f"killed_{seed}.ledger"
    args = kill_sweep_args()
    rows = len(reference)
    camp = Campaign()
    t_start = time.monotonic()
    seen: dict[str, tuple] = {}

    def check(after: str) -> None:
        nonlocal seen
        now = check_whole(sweep_dir, rows)
        camp.checks += 1
        for key, fingerprint in seen.items():
            if key not in now:
                camp.lost.append(f"{key} (after {after})")
            elif now[key] != fingerprint:
                camp.lost.append(f"{key} changed (after {after}): {fingerprint} -> {now[key]}")
        seen = {**seen, **now}
        for pair, n in ledger_counts(ledger).items():
            if n > 1 and str(pair) not in camp.reruns:
                camp.reruns.append(str(pair))

    for moment in moments:
        extra = {}
        if moment.startswith("write:"):
            extra["SWEEP_FAULT_SLOW_FSYNC"] = f"{moment.split(':', 1)[1]}:{SLOW_WRITE_S}"
        proc = start(sweep_dir, args, sweep_env(ledger, FAULT_DURATION_S=KILL_DURATION_S, **extra), root)
        t0 = time.monotonic()
        if moment == "early":
            time.sleep(rng.uniform(0.05, 1.0))
            hit = proc.poll() is None
        elif moment == "uniform":
            # Anywhere in the next few seconds: as each resumed run goes on from where the last
            # was killed, these instants fall all over the sweep's lifetime.
            time.sleep(rng.uniform(0.1, UNIFORM_WINDOW_S))
            hit = proc.poll() is None
        else:
            hit = _wait_for_temp(proc, sweep_dir, moment.split(":", 1)[1], t0 + reference_wall_s + 10)
        if not hit:  # the sweep finished first: nothing left to interrupt
            proc.wait(timeout=120)
            assert proc.returncode == 0, "\n".join(output(proc))
            log(f"  seed {seed}: sweep finished before the {moment} kill")
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        camp.kills += 1
        camp.moments.append(f"{moment}@{time.monotonic() - t0:.2f}s")
        check(moment)

    proc = run(sweep_dir, args, sweep_env(ledger, FAULT_DURATION_S=KILL_DURATION_S), root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    check("the final run")
    camp.final = statuses(sweep_dir)
    counts = ledger_counts(ledger)
    camp.reruns += [f"{p} never ran" for p in reference if p not in counts]
    assert json.loads((sweep_dir / "sweep.json").read_text())["state"] == "done"
    stop_leftover_jobs(sweep_dir)
    camp.wall_s = time.monotonic() - t_start
    return camp


# -- failing trials ------------------------------------------------------------------------------

# Long enough for five trials started at once to reach their fault on a 2-core box under a load of 10 (6 s was not:
# the `garbage` trial was still starting when its limit came), short enough that the `hang` costs little.
FAULT_TIME_LIMIT_S = 15
# accum -> (behaviour, expected status, expected oom phase, text the reason must contain)
FAULTS = {
    1: ("ok", "ok", "", ""),
    2: ("hang", "timeout", "", f"time_limit_s={FAULT_TIME_LIMIT_S}"),
    4: ("crash", "failed", "", "ValueError: bad shard"),
    8: ("segv", "failed", "", "SIGSEGV"),
    16: ("sigkill", "failed", "", "SIGKILL"),  # failed, "... with no sign of running out of memory": a kill is an OOM only on evidence (issue 30)
    32: ("silent", "failed", "", "printed no throughput"),
    64: ("truncated", "failed", "", "not valid JSON"),
    128: ("garbage", "failed", "", "not UTF-8"),
    256: ("oom", "oom", "joint", "CUDA out of memory"),
}
FAULT_TIMINGS = {
    # (max_in_flight, seconds each trial waits before it does its thing)
    "all_at_once": ("5", "0"),
    "staggered": ("2", "0.6"),
}


def fault_sweep(root: Path, timing: str) -> tuple[subprocess.CompletedProcess, Path]:
    in_flight, delay = FAULT_TIMINGS[timing]
    sweep_dir = root / f"faults_{timing}"
    behaviours = ",".join(f"{a}:{b}" for a, (b, *_) in FAULTS.items())
    args = command_args(behaviours, tuple(FAULTS), (1,), "global_batch_size=256", f"max_in_flight={in_flight}", f"trial.time_limit_s={FAULT_TIME_LIMIT_S}")
    proc = run(sweep_dir, args, sweep_env(FAULT_DELAY_S=delay, FAULT_DURATION_S="0.3"), root)
    return proc, sweep_dir


def hang_stopped(sweep_dir: Path, accum: int = 2) -> bool:
    """The hung command's process is gone (stopped, not left running after the sweep)."""
    pid_file = sweep_dir / "trials" / f"accum{accum}_split1" / "hang.pid"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)  # do not leave it behind even when the check fails
    return False


# -- another sweep holds the lock ----------------------------------------------------------------


def tree_state(path: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*")) if p.is_file()}


def second_orchestrator(root: Path) -> dict:
    """Sweep A runs (slow trials); B, pointed at the same dir, must refuse and write nothing.
    A is paused while B runs, so any change in the dir would be B's. Then A is interrupted and
    B, run again, resumes the sweep to the end."""
    sweep_dir, ledger = root / "shared", root / "shared.ledger"
    args = command_args("", (1, 2, 4), (1,), "max_in_flight=2")
    a = start(sweep_dir, args, sweep_env(ledger, FAULT_DURATION_S="30"), root, fresh=True)  # it is stopped and sent SIGINT
    try:
        deadline = time.monotonic() + 60
        while len(ledger_counts(ledger)) < 2:  # both first trials' commands are running
            assert a.poll() is None and time.monotonic() < deadline, "sweep A did not start its trials"
            time.sleep(0.05)
        os.kill(a.pid, signal.SIGSTOP)
        try:
            before = tree_state(sweep_dir)
            b = run(sweep_dir, args, sweep_env(ledger, FAULT_DURATION_S="0.2"), root, timeout=60)
            b_resume = run(sweep_dir, [f"resume={sweep_dir}"], sweep_env(ledger, FAULT_DURATION_S="0.2"), root, timeout=60)
            after = tree_state(sweep_dir)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        a.send_signal(signal.SIGINT)  # Ctrl-C: A cancels its trials and says how to resume
        try:
            a.wait(timeout=60)
        except subprocess.TimeoutExpired:
            out, err = output(a)
            raise AssertionError(f"sweep A still running 60 s after Ctrl-C:\n{out[-3000:]}\n{err[-3000:]}") from None
        a_out, a_err = output(a)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    resumed = run(sweep_dir, args, sweep_env(ledger, FAULT_DURATION_S="0.2"), root)
    stop_leftover_jobs(sweep_dir)
    return dict(b=b, b_resume=b_resume, unchanged=before == after, a=(a.returncode, a_out, a_err), resumed=resumed, sweep_dir=sweep_dir)


# -- a full disk, a read-only sweep dir ----------------------------------------------------------


@contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` at path (root only): Unavailable where it cannot be mounted."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        raise Unavailable("mounting a small filesystem needs root on Linux")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode:
        raise Unavailable(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> Path:
    filler = path / "filler"
    # Unbuffered: a buffered file keeps the part of a write the full disk refused, and its close() raises again.
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    # Whatever little is left (less than a block): gone too.
    for i in range(64):
        try:
            with open(path / f"filler{i}", "wb") as g:
                g.write(b"\0" * 4096)
                g.flush()
                os.fsync(g.fileno())
        except OSError:
            break
    return filler


def full_disk(root: Path) -> dict:
    """The disk fills while a trial runs: one clear line, nothing torn; after space is freed,
    a resume finishes the sweep without rerunning what had finished."""
    with small_filesystem(root / "disk", "8m") as disk:
        sweep_dir, ledger = disk / "full disk", root / "disk.ledger"  # a space: the resume hint must quote it
        args = command_args("", (1, 2, 4), (1,), "max_in_flight=1")
        proc = start(sweep_dir, args, sweep_env(ledger, FAULT_DURATION_S="1.5"), root)
        deadline = time.monotonic() + 60
        while not (sweep_dir / "trials" / "accum1_split1" / RESULT_FILE).exists() or len(ledger_counts(ledger)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the first trial did not finish"
            time.sleep(0.05)
        for p in disk.glob("filler*"):
            p.unlink()
        fill(disk)
        proc.wait(timeout=60)
        failed = subprocess.CompletedProcess(proc.args, proc.returncode, *output(proc))
        whole = check_whole(sweep_dir, 3)
        for p in disk.glob("filler*"):
            p.unlink()
        resumed = run(sweep_dir, args, sweep_env(ledger, FAULT_DURATION_S="0.2"), root)
        after = finished(sweep_dir)
        final = statuses(sweep_dir)
        stop_leftover_jobs(sweep_dir)
        return dict(failed=failed, whole=whole, resumed=resumed, after=after, final=final,
                    counts=ledger_counts(ledger), sweep_dir=sweep_dir)


@contextmanager
def read_only(path: Path) -> Iterator[str]:
    """Make `path` (the root of a small_filesystem) read-only; yields how."""
    if os.geteuid() == 0:
        done = subprocess.run(["mount", "-o", "remount,ro", str(path)], capture_output=True, text=True)
        if done.returncode:
            raise Unavailable(f"cannot remount read-only ({done.stderr.strip()})")
        try:
            yield "read-only mount"
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(path)], capture_output=True)
    else:
        modes = {p: p.stat().st_mode for p in [path, *path.rglob("*")] if p.is_dir()}
        for p in modes:
            p.chmod(0o555)
        try:
            yield "chmod a-w"
        finally:
            for p, mode in modes.items():
                p.chmod(mode)


def read_only_dir(root: Path) -> dict:
    """A finished sweep whose dir turned read-only: resuming it, or starting a new sweep there,
    fails in one line naming the dir, and every file is as it was."""
    args = command_args("", (1, 2), (1,), "max_in_flight=2")
    ledger = root / "ro.ledger"

    def body(base: Path) -> dict:
        sweep_dir = base / "s"
        first = run(sweep_dir, args, sweep_env(ledger, FAULT_DURATION_S="0.2"), root)
        assert first.returncode == 0, first.stdout + first.stderr
        stop_leftover_jobs(sweep_dir)
        before = {p: p.read_bytes() for p in sweep_dir.rglob("*") if p.is_file()}
        with read_only(base) as how:
            resume = run(sweep_dir, args, sweep_env(ledger), root, timeout=60)
            fresh = run(base / "new", args, sweep_env(ledger), root, timeout=60)
        after = {p: p.read_bytes() for p in sweep_dir.rglob("*") if p.is_file()}
        return dict(how=how, resume=resume, fresh=fresh, unchanged=before == after, sweep_dir=sweep_dir,
                    new_dir=base / "new", counts=ledger_counts(ledger))

    if os.geteuid() == 0:
        with small_filesystem(root / "ro", "8m") as base:
            return body(base)
    (root / "ro").mkdir()
    return body(root / "ro")


# -- a torn record found on resume ---------------------------------------------------------------


def _cut_in_half(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) // 2])


def _edit_record(path: Path, **change: Any) -> None:
    data = json.loads(path.read_text())
    data.update(change)
    path.write_text(json.dumps(data))


# How a finished trial's result.json can be wrong at rest, and what the resumed sweep must say.
DAMAGE = {
    "torn": (_cut_in_half, "not valid JSON"),
    "wrong_type": (lambda p: _edit_record(p, throughput="fast"), "throughput='fast' is not a number"),
    "other_pair": (lambda p: _edit_record(p, accum=1, per_device_batch=16, joint_batch=16), "records accum=1 split=1, not this dir's pair"),
    "other_settings": (lambda p: _edit_record(p, fingerprint="0123456789abcdef"), "measured under other settings"),
}


def torn_record_on_resume(root: Path, damage: str = "torn") -> dict:
    """A finished trial's result.json is damaged at rest (cut in half, a field of the wrong type,
    another pair's or another configuration's record): the resumed sweep names the file, runs
    that trial again (never adopts the record), and reuses the others."""
    sweep_dir, ledger = root / "torn", root / "torn.ledger"
    args = command_args("", (1, 2), (1,), "max_in_flight=2")
    first = run(sweep_dir, args, sweep_env(ledger, FAULT_DURATION_S="0.2"), root)
    assert first.returncode == 0, first.stdout + first.stderr
    path = sweep_dir / "trials" / "accum2_split1" / RESULT_FILE
    damage_fn, said = DAMAGE[damage]
    damage_fn(path)
    resumed = run(sweep_dir, args, sweep_env(ledger, FAULT_DURATION_S="0.2"), root)
    stop_leftover_jobs(sweep_dir)
    return dict(resumed=resumed, path=path, said=said, final=statuses(sweep_dir), counts=ledger_counts(ledger))
