"""Read sweep results into pandas: `load()` one or many sweeps (analysis/compare.py lines them up).

`load(source)` returns one row per candidate (the rows of `trials.csv`) with
this schema, in this column order, whatever the source:

| column                          | dtype    | meaning                                                           |
|---------------------------------|----------|-------------------------------------------------------------------|
| sweep_id                        | string   | one id per sweep (from trials.csv, else sweep.json, else dir name) |
| machine                         | string   | machine profile name                                              |
| workload                        | string   | workload name                                                     |
| global_batch_size               | Int64    | samples per optimizer step over all devices                       |
| num_devices                     | Int64    | data-parallel devices per trial                                   |
| rank                            | Int64    | 1 = fastest by ranked_throughput_samples_per_s (the figure the    |
|                                 |          | recommendation rests on); <NA> unless status is ok                |
| accum                           | Int64    | grad_accumulation_batches                                         |
| split                           | Int64    | batch_split_factor                                                |
| per_device_batch                | Int64    | global_batch_size / (accum * num_devices); <NA> if not an integer |
| joint_batch                     | Int64    | per_device_batch / split; <NA> if not an integer                  |
| status                          | category | ok, oom, failed, timeout, cancelled, rejected, running, pending,  |
|                                 |          | skipped, predicted_oom, invalid                                   |
| oom_phase                       | category | encoder, joint, optimizer; <NA> unless status is oom              |
| throughput_samples_per_s        | float64  | median samples/s over the measured steps                          |
| throughput_low_samples_per_s    | float64  | lower end of the 95% interval of that median                      |
| throughput_high_samples_per_s   | float64  | upper end of that interval                                        |
| speedup                         | float64  | ranked throughput / that of the split=1 baseline (smallest ok     |
|                                 |          | accum), both the figures the rank rests on                         |
| peak_mem_gib                    | float64  | peak device memory, GiB                                           |
| wall_s                          | float64  | the trial's wall time incl. start-up, seconds                     |
| steps_measured                  | Int64    | timed optimizer steps                                             |
| reason                          | string   | why the pair is invalid or the trial did not finish ok            |
| log                             | string   | path of the trial's log                                           |
| job_id                          | string   | scheduler job id                                                  |
| throughput_unit                 | string   | what the throughput columns count: samples/s or tokens/s          |
| tight                           | boolean  | ok, but headroom below trial.memory_margin; <NA> unless it ran    |
| stopped_early                   | string   | why racing stopped the trial early; <NA> if it ran its course     |
| headroom                        | float64  | fraction of capacity left at the peak: 1 - peak / capacity        |
| peak_reserved_gib               | float64  | built-in: CUDA's reserved or the CPU's address-space peak, GiB    |
| capacity_gib                    | float64  | the device memory the peak is measured against, GiB               |
| measured_by                     | string   | what gave the figure: probe: optimizer steps, probe: backward     |
|                                 |          | passes (no torch.optim step), or log                              |
| retimed_throughput_samples_per_s | float64 | the drift check's re-timing of the pair; NaN unless re-timed      |
| ranked_throughput_samples_per_s | float64  | the figure rank and speedup rest on: the geometric mean of the    |
|                                 |          | pair's two timings where re-timed, else its own throughput; NaN   |
|                                 |          | unless ok                                                         |
| ranked_throughput_low/high_...  | float64  | that figure's 95% interval                                        |

The throughput columns keep their historical `_samples_per_s` names; their unit is
`throughput_unit` (tokens/s for a trainer that counts tokens). A trials.csv written before
the last seven columns existed still loads: they are <NA>/NaN there.

Missing values are <NA> (integers, strings, categories) or NaN (floats).
`status` and `oom_phase` always carry every category in the order above, so
`value_counts()` and concatenation across sweeps behave the same everywhere.
The frame round-trips through `to_parquet`/`read_parquet` unchanged, and
through `to_csv(index=False)` + `load()`.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Union

import numpy as np
import pandas as pd

from sweep.core.ranking import TABLE_COLUMNS
from sweep.core.schema import ALL_STATUSES, OOM_PHASES, SCHEMA_VERSION
from sweep.errors import LoadError

TRIALS_CSV = "trials.csv"
SWEEP_JSON = "sweep.json"
RECOMMENDATION_YAML = "recommendation.yaml"

STATUS_DTYPE = pd.CategoricalDtype(list(ALL_STATUSES))
OOM_PHASE_DTYPE = pd.CategoricalDtype(list(OOM_PHASES))

_INT = "Int64"
_FLOAT = "float64"
_STR = "string"
_BOOL = "boolean"
# Column -> dtype of load()'s frame; the order is TABLE_COLUMNS (tests hold both to a golden file).
SCHEMA: dict[str, Any] = {
    "sweep_id": _STR,
    "machine": _STR,
    "workload": _STR,
    "global_batch_size": _INT,
    "num_devices": _INT,
    "rank": _INT,
    "accum": _INT,
    "split": _INT,
    "per_device_batch": _INT,
    "joint_batch": _INT,
    "status": STATUS_DTYPE,
    "oom_phase": OOM_PHASE_DTYPE,
    "throughput_samples_per_s": _FLOAT,
    "throughput_low_samples_per_s": _FLOAT,
    "throughput_high_samples_per_s": _FLOAT,
    "speedup": _FLOAT,
    "peak_mem_gib": _FLOAT,
    "wall_s": _FLOAT,
    "steps_measured": _INT,
    "reason": _STR,
    "log": _STR,
    "job_id": _STR,
    "throughput_unit": _STR,
    "tight": _BOOL,
    "stopped_early": _STR,
    "headroom": _FLOAT,
    "peak_reserved_gib": _FLOAT,
    "capacity_gib": _FLOAT,
    "measured_by": _STR,
    "stalls": _STR,
    "retimed_throughput_samples_per_s": _FLOAT,
    "ranked_throughput_samples_per_s": _FLOAT,
    "ranked_throughput_low_samples_per_s": _FLOAT,
    "ranked_throughput_high_samples_per_s": _FLOAT,
}
# Columns a trials.csv from an older sweep may lack; load() fills them with missing values.
_ADDED_COLUMNS = ("throughput_unit", "tight", "stopped_early", "headroom", "peak_reserved_gib", "capacity_gib", "measured_by", "stalls",
                  "retimed_throughput_samples_per_s", "ranked_throughput_samples_per_s", "ranked_throughput_low_samples_per_s",
                  "ranked_throughput_high_samples_per_s")

Source = Union[str, "os.PathLike[str]"]


def empty_frame() -> pd.DataFrame:
    """A zero-row frame with load()'s schema."""
    return pd.DataFrame({col: pd.Series(dtype=dtype) for col, dtype in SCHEMA.items()})


def sweep_files(source: Source | Iterable[Source]) -> list[Path]:
    """The trials.csv files a source names: a sweep dir, a symlink to one, a glob, a trials.csv, or a list.

    Paths are deduplicated by their resolved target, so "outputs/*" does not count
    outputs/latest twice. Globs skip matches that are not sweeps; explicit paths do not.
    """
    if source is None:
        raise LoadError("load(None): no sweep given: pass a sweep dir such as 'outputs/latest', a glob such as 'outputs/*', or a list of them")
    if isinstance(source, (str, os.PathLike)):
        sources: list[Source] = [source]
    elif isinstance(source, Iterable):
        sources = list(source)
    else:
        raise LoadError(f"load({source!r}): not a sweep: pass a sweep dir (str or Path), a glob, or a list of them")
    if not sources:
        raise LoadError("no sweep given: pass a sweep dir, a glob such as 'outputs/*', or a list of them")
    found: list[Path] = []
    seen: set[Path] = set()
    for src in sources:
        for csv in _expand(src):
            real = csv.resolve()
            if real not in seen:
                seen.add(real)
                found.append(csv)
    return found


def _expand(source: Source) -> list[Path]:
    text = os.path.expanduser(os.fspath(source))
    path = Path(text)
    if not path.exists() and glob.has_magic(text):
        matches = [Path(m) for m in sorted(glob.glob(text))]
        csvs = [_trials_csv(m) for m in matches if _is_sweep(m)]
        if not csvs:
            raise LoadError(f"{text}: matches no sweep dir (a directory with {TRIALS_CSV})")
        return csvs
    if not path.exists():
        raise LoadError(f"{text}: no such file or directory; expected a sweep dir with {TRIALS_CSV}")
    if not _is_sweep(path):
        hint = ""
        if path.is_dir() and any(_is_sweep(p) for p in path.iterdir()):
            hint = f"; to load every sweep under it use '{os.path.join(text, '*')}'"
        raise LoadError(f"{text}: not a sweep dir or {TRIALS_CSV} (expected {path / TRIALS_CSV}){hint}")
    return [_trials_csv(path)]


def _is_sweep(path: Path) -> bool:
    return (path / TRIALS_CSV).is_file() if path.is_dir() else path.is_file() and path.suffix == ".csv"


def _trials_csv(path: Path) -> Path:
    return path / TRIALS_CSV if path.is_dir() else path


def read_meta(sweep_dir: Source) -> dict[str, Any] | None:
    """sweep.json of a sweep dir, checked for its schema version; None when the dir has none."""
    path = Path(sweep_dir) / SWEEP_JSON
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LoadError(f"{path}: not readable as JSON ({e}); the sweep may have been cut off, rerun it") from None
    if not isinstance(meta, dict):
        raise LoadError(f"{path}: expected a JSON object, found {type(meta).__name__}")
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise LoadError(
            f"{path}: schema_version={version!r} is from another version of sweep "
            f"(this one reads {SCHEMA_VERSION}); rerun the sweep, or read it with the sweep version that wrote it"
        )
    return meta


def load(source: Source | Iterable[Source]) -> pd.DataFrame:
    """Every candidate row of one or more sweeps, in the schema documented above.

    source: a sweep dir, outputs/latest, a glob of sweep dirs ("outputs/*"), a
    trials.csv path, or a list of those. Still-running sweeps load too: their
    unfinished candidates have status running or pending.
    """
    frames = [_read_trials(csv) for csv in sweep_files(source)]
    frames = [f for f in frames if len(f)]
    if not frames:
        return empty_frame()
    return pd.concat(frames, ignore_index=True)


def _read_trials(csv: Path) -> pd.DataFrame:
    meta = read_meta(csv.parent)
    try:
        raw = pd.read_csv(csv, dtype="string", keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        raise LoadError(f"{csv}: empty file, not a trials table; rerun the sweep") from None
    except (OSError, pd.errors.ParserError) as e:
        raise LoadError(f"{csv}: cannot read ({str(e).splitlines()[0]})") from None
    for col in _ADDED_COLUMNS:
        if col not in raw.columns:
            raw[col] = pd.Series(pd.NA, index=raw.index, dtype="string")
    missing = [c for c in TABLE_COLUMNS if c not in raw.columns]
    if missing:
        raise LoadError(
            f"{csv}: missing column(s) {', '.join(missing)}: written by an older sweep; "
            f"rerun or resume the sweep with this version to rewrite it"
        )
    df = pd.DataFrame({col: _convert(raw[col], dtype, csv, col) for col, dtype in SCHEMA.items()})
    fallback_id = str(meta["sweep_id"]) if meta and meta.get("sweep_id") else csv.parent.name
    df["sweep_id"] = df["sweep_id"].fillna(fallback_id)
    return df


def _convert(col: pd.Series, dtype: Any, csv: Path, name: str) -> pd.Series:
    if dtype == _STR:
        return col.astype(_STR)
    if dtype == _BOOL:
        truth = col.str.lower().map({"true": True, "false": False, "1": True, "0": False})
        bad_mask = col.notna() & truth.isna()
        if bad_mask.any():
            raise LoadError(f"{csv}: column {name} has value {col[bad_mask].iloc[0]!r} (expected True or False)")
        return truth.astype(_BOOL)
    if isinstance(dtype, pd.CategoricalDtype):
        bad = sorted(set(col.dropna()) - set(dtype.categories))
        if bad:
            raise LoadError(
                f"{csv}: column {name} has unknown value(s) {', '.join(map(repr, bad))} "
                f"(expected one of {', '.join(dtype.categories)}); written by a newer sweep?"
            )
        return col.astype(dtype)
    # Through object: to_numeric on a string array yields Float64, whose cast to Int64 would truncate.
    num = pd.to_numeric(col.astype(object), errors="coerce").astype(_FLOAT)
    bad_mask = col.notna() & num.isna()
    if dtype == _INT:
        bad_mask |= num.notna() & (num != np.round(num))
    if bad_mask.any():
        raise LoadError(f"{csv}: column {name} has non-numeric value {col[bad_mask].iloc[0]!r} (expected {dtype})")
    return num.astype(dtype)
