"""Which directory a sweep writes to: the one the user named, or a fresh dated one.

The default dir is named by the second (outputs/<date_time>); two sweeps started in the
same second must not share it (the second would resume the first's trials), so a default
dir is claimed with mkdir, which only one process can win, and the loser takes the next
free sibling (-2, -3, ...). A dir the user names (hydra.sweep.dir=, resume=) is used as given
(a symlink such as outputs/latest: the dir it points to), unless it is no place for a sweep.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sweep.errors import SweepError
from sweep.orchestration.search_record import SEARCH_FILE, SEARCH_LOG

if TYPE_CHECKING:
    from filelock import BaseFileLock
    from omegaconf import DictConfig

LOCK_FILE = ".sweep.lock"
# What only a sweep dir holds; a dir with none of them (and anything else in it) is someone else's.
# What says a dir is a sweep's: a detached search's log comes first, before the search itself writes (detach.py).
SWEEP_MARKERS = ("sweep.json", "trials", LOCK_FILE, SEARCH_FILE, SEARCH_LOG)


def sweep_dir_of(cfg: DictConfig) -> Path:
    """The sweep dir the config names, checked when the user named it (see check_given_dir)."""
    text = str(cfg.hydra.sweep.dir)
    if not text.strip():
        raise SweepError("hydra.sweep.dir is empty: give a directory, e.g. hydra.sweep.dir=outputs/my_sweep (or leave it out for a new dated one)")
    path = Path(text).expanduser().absolute()
    if path.is_symlink():
        # outputs/latest: the sweep it points to. Writing through the link would make the
        # link's own update (latest -> this dir's name) a loop.
        path = path.resolve()
    if dir_given(cfg):
        check_given_dir(path, text)
    return path


def check_given_dir(path: Path, given: str) -> None:
    """Refuse a named dir a sweep must not write into: the filesystem root, a file, or a
    dir of other things (its own trials.csv or recommendation.yaml would be overwritten)."""
    if path.parent == path:
        raise SweepError(f"hydra.sweep.dir={given} is the filesystem root: give a directory of its own, e.g. hydra.sweep.dir=outputs/my_sweep")
    if path.exists() and not path.is_dir():
        raise SweepError(f"hydra.sweep.dir={given} is a file, not a directory: give a new or empty directory, e.g. hydra.sweep.dir=outputs/my_sweep")
    if path.is_dir():
        try:
            entries = [e.name for e in path.iterdir()]
        except OSError as e:
            raise SweepError(f"hydra.sweep.dir={given} cannot be read ({e.strerror}): give a directory you can write") from None
        if entries and not any(name in entries for name in SWEEP_MARKERS):
            raise SweepError(
                f"hydra.sweep.dir={given} holds other files ({', '.join(sorted(entries)[:3])}{', ...' if len(entries) > 3 else ''}) "
                "and no sweep (no sweep.json or trials/): give a new or empty directory, or an earlier sweep's dir"
            )


def dir_given(cfg: DictConfig) -> bool:
    """Whether the user named the sweep dir (hydra.sweep.dir=, or resume= which names it)."""
    try:
        given = list(cfg.hydra.overrides.hydra)
    except Exception:  # noqa: BLE001 - no Hydra node: a caller that built its own config named it
        return True
    return any(str(o).lstrip("+~").startswith("hydra.sweep.dir=") for o in given)


def _numbered(sweep_dir: Path) -> Iterator[Path]:
    for n in range(1, 1000):
        yield sweep_dir if n == 1 else sweep_dir.with_name(f"{sweep_dir.name}-{n}")
    raise SweepError(f"{sweep_dir} and 999 numbered siblings exist: give hydra.sweep.dir=")


def first_free(sweep_dir: Path) -> Path:
    """sweep_dir, or the first of sweep_dir-2, -3, ... that does not exist yet (nothing is created)."""
    return next(d for d in _numbered(sweep_dir) if not d.exists())


def claim_fresh_dir(sweep_dir: Path) -> Path:
    """sweep_dir if this process could create it, else the first sibling it could: mkdir is the atomic claim."""
    sweep_dir.parent.mkdir(parents=True, exist_ok=True)
    for candidate in _numbered(sweep_dir):
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


@contextmanager
def removed_if_refused(sweep_dir: Path) -> Iterator[list[Path]]:
    """On a SweepError (or a Ctrl-C) inside, remove the dirs made for this sweep while they hold nothing but
    its lock file: sweep_dir and its parents that did not exist on entry, and any dir the
    caller adds to the yielded list (a claimed -2 sibling). A refused sweep leaves nothing
    behind, not even an empty dated dir."""
    made = [p for p in (sweep_dir, *sweep_dir.parents) if not p.exists()]
    try:
        yield made
    except (SweepError, KeyboardInterrupt):
        for path in sorted(set(made), key=lambda p: len(p.parts), reverse=True):
            _remove_if_unused(path)
        raise


def _remove_if_unused(path: Path) -> None:
    try:
        lock = path / LOCK_FILE
        if lock.is_file() and [e.name for e in path.iterdir()] == [lock.name]:
            lock.unlink()
        path.rmdir()  # only if empty
    except OSError:
        pass


_held: dict[Path, BaseFileLock] = {}  # this process's sweep dir locks, by dir: taken again (re-entered) by what it runs


@contextmanager
def sweep_lock(sweep_dir: Path) -> Iterator[None]:
    """Hold the sweep dir's lock while the body runs; another sweep into the dir is refused with one line.

    The whole sweep holds it, from before its first write (screening's included: orchestration/entry.py) to
    its end, and its orchestrators take it again. Re-entrant within this process: a second flock on a file
    this process already locks, through another open file, would refuse this very sweep.
    """
    from filelock import FileLock, Timeout

    key = Path(sweep_dir).absolute()
    lock = _held.get(key)
    if lock is None:
        try:
            key.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(key / LOCK_FILE))
            lock.acquire(timeout=0)
        except Timeout:
            raise SweepError(f"another sweep is running in {key} (lock {LOCK_FILE} held): wait for it, or choose another hydra.sweep.dir") from None
        except OSError as e:
            raise SweepError(f"cannot write the sweep dir {key}: {e.strerror}; choose a writable hydra.sweep.dir") from None
        _held[key] = lock
        try:
            yield
        finally:
            del _held[key]
            lock.release()
    else:
        yield


def set_sweep_dir(cfg: DictConfig, sweep_dir: Path) -> None:
    from omegaconf import open_dict, read_write

    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.sweep.dir = str(sweep_dir)


def remove_stale_temp_files(sweep_dir: Path, own_files: Iterable[str], trial_files: Iterable[str]) -> None:
    """Temp files of a sweep's own atomic writes that a killed orchestrator left behind.

    Only files the orchestrator alone writes (its lock is held, so none is being written):
    own_files in the sweep dir and trial_files in each trial dir. A running trial's own temp
    files (result.json, progress.json) are not named, so they are left alone.
    """
    stale = [p for name in own_files for p in sweep_dir.glob(f".{name}.*.tmp")]
    stale += [p for name in trial_files for p in sweep_dir.glob(f"trials/*/.{name}.*.tmp")]
    for path in stale:
        try:
            path.unlink()
        except OSError:
            pass
