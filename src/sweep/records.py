"""Trial records on disk: written atomically by their one writer, read back with every check.

The schema is pure (core/schema.py: TrialResult, its statuses and figure checks; core/measure.py: what a
progress record holds); this module is where those records meet the file system. Each trial's record is
`<sweep_dir>/trials/<key>/result.json`, written by the trial alone; a job that ended without one gets
`ended.json` instead, written by the orchestrator alone; readers take result.json first, else ended.json.
Both are written atomically (temp file, fsync, rename), so a reader sees nothing or the whole record, even
if the writer is killed mid-write. A running trial's progress.json (its timed steps so far, for racing)
and stop.json (the orchestrator asking it to stop) live beside them.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path

from sweep.core.measure import PROGRESS_FILE, STOP_FILE
from sweep.core.schema import ENDED_FILE, RESULT_FILE, TrialResult, check_figures
from sweep.errors import NotRegularFileError, ResultError


def atomic_write_text(path: Path, text: str) -> None:
    """Write text so that readers see the old file or the new one, never a torn mix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file private (0600); on a shared filesystem the group must read results
        # as it reads submitit's logs, so honour the user's umask like open() would.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def write_result(result: TrialResult, trial_dir: Path) -> Path:
    """Write the trial's record; check_figures() first, so `result` may change status in place."""
    path = Path(trial_dir) / RESULT_FILE
    atomic_write_text(path, json.dumps(check_figures(result).to_dict(), indent=2, allow_nan=False) + "\n")
    return path


def read_regular_text(path: Path) -> str:
    """A regular file's text. Anything else named like it (a FIFO would block the reader
    forever, a device would never end) raises NotRegularFileError, an OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO with no writer would block open() itself
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    finally:
        os.close(fd)
    return data.decode("utf-8")


def read_result(path: Path) -> TrialResult:
    path = Path(path)
    try:
        data = json.loads(read_regular_text(path))
    except json.JSONDecodeError as e:
        raise ResultError(f"{path}: not valid JSON ({e.msg}: line {e.lineno} column {e.colno}); the trial was cut off") from None
    except UnicodeDecodeError as e:
        raise ResultError(f"{path}: not valid JSON (not UTF-8 text at byte {e.start}); the trial was cut off") from None
    except NotRegularFileError:
        raise ResultError(f"{path}: not a regular file (a FIFO, device or socket); the file is not a trial's record") from None
    if not isinstance(data, dict):
        raise ResultError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return TrialResult.from_dict(data, source=str(path))


def read_trial_record(tdir: Path) -> TrialResult | None:
    """One trial's record: its own result.json, else the orchestrator's ended.json; None if neither exists.

    The orchestrator removes ended.json whenever it submits the trial again, so an ended.json
    about another job than result.json's is the newer news (result.json is then a cancelled
    run's). A result.json that cannot be read also falls back to ended.json, where the
    orchestrator says how that job ended; with no ended.json its ResultError is raised.
    """
    own, ended = Path(tdir) / RESULT_FILE, Path(tdir) / ENDED_FILE
    fallback = read_result(ended) if ended.exists() else None
    if not own.exists():
        return fallback
    try:
        res = read_result(own)
    except ResultError:
        if fallback is None:
            raise
        return fallback
    if fallback is not None and res.job_id and fallback.job_id and fallback.job_id != res.job_id:
        return fallback
    return res


def write_ended(result: TrialResult, tdir: Path) -> Path:
    """The orchestrator's record of a job that ended without writing its own."""
    path = Path(tdir) / ENDED_FILE
    atomic_write_text(path, json.dumps(check_figures(result).to_dict(), indent=2, allow_nan=False) + "\n")
    return path


def collect_results(sweep_dir: Path, errors: dict[str, str] | None = None, fingerprint: str | None = None) -> dict[str, TrialResult]:
    """Every finished, readable trial record in a sweep dir, by candidate key.

    A record is only taken from its own place: one whose pair is not its dir's
    (trials/accum2_split1/ holding accum=4's result) is no record of that trial. With a
    fingerprint given, a record measured under other settings (or carrying none) is not
    taken either. errors, if given, receives {trial dir name: why} for each record left out.
    """
    out: dict[str, TrialResult] = {}
    for tdir in sorted(p for p in (Path(sweep_dir) / "trials").glob("*") if p.is_dir()):
        try:
            res = read_trial_record(tdir)
            if res is not None:
                check_record_place(res, tdir, fingerprint)
        except (ResultError, OSError) as e:
            # A torn, foreign or misplaced file counts as "not finished": the trial is rerun.
            if errors is not None:
                errors[tdir.name] = str(e) if isinstance(e, ResultError) else f"{tdir / RESULT_FILE}: {e}"
            continue
        if res is not None:
            out[res.key] = res
    return out


def check_record_place(res: TrialResult, tdir: Path, fingerprint: str | None = None) -> None:
    """A ResultError naming the file if this record belongs to another trial or other settings."""
    path = Path(tdir) / (RESULT_FILE if (Path(tdir) / RESULT_FILE).exists() else ENDED_FILE)
    if res.key != Path(tdir).name:
        raise ResultError(f"{path}: records accum={res.accum} split={res.split}, not this dir's pair ({Path(tdir).name})")
    if fingerprint is not None and res.fingerprint != fingerprint:
        got = f"fingerprint {res.fingerprint}" if res.fingerprint else "no fingerprint"
        raise ResultError(f"{path}: measured under other settings ({got}, this sweep's is {fingerprint})")


def point_latest(sweep_dir: Path) -> bool:
    """<parent>/latest -> this sweep, swapped atomically so readers never see it missing.

    Only a symlink (or nothing) named latest is replaced: a user's own file or dir of that
    name is left alone, and False returned. False too when the link cannot be made.
    """
    link = sweep_dir.parent / "latest"
    tmp = sweep_dir.parent / f".latest.{os.getpid()}"
    if link.exists() and not link.is_symlink():
        return False
    try:
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(sweep_dir.name)
        os.replace(tmp, link)
    except OSError:
        return False  # a convenience link is not worth failing a sweep over
    return True


def stop_requested(trial_dir: str | Path) -> str | None:
    """The reason in the trial's stop.json, or None while the orchestrator has not asked it to stop."""
    path = Path(trial_dir) / STOP_FILE
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return "stopped by the orchestrator"  # written atomically, so unreadable means a foreign file: still a request
    reason = record.get("reason") if isinstance(record, dict) else None
    return str(reason) if reason else "stopped by the orchestrator"


def write_progress(trial_dir: str | Path, text: str) -> None:
    """Replace PROGRESS_FILE atomically, without fsync: it is rewritten every step, a crash may lose it,
    and a per-step fsync costs milliseconds on a shared file system."""
    path = Path(trial_dir) / PROGRESS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{PROGRESS_FILE}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def progress_step_times(trial_dir: str | Path) -> list[float]:
    """Timed step times a running trial reported so far; empty when it reported none (or no file yet)."""
    try:
        record = json.loads((Path(trial_dir) / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return []
    times = record.get("step_times_s") if isinstance(record, dict) else None
    if not isinstance(times, list):
        return []
    return [float(t) for t in times if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0]
