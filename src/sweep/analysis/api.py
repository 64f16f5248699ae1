"""Read sweep results into pandas: `load()` one or many sweeps, `compare()` them.

`load(source)` returns one row per candidate (the rows of `trials.csv`) with
this schema, in this column order, whatever the source:

| column                          | dtype    | meaning                                                           |
|---------------------------------|----------|-------------------------------------------------------------------|
| sweep_id                        | string   | one id per sweep (from trials.csv, else sweep.json, else dir name) |
| machine                         | string   | machine profile name                                              |
| workload                        | string   | workload name                                                     |
| global_batch_size               | Int64    | samples per optimizer step over all devices                       |
| num_devices                     | Int64    | data-parallel devices per trial                                   |
| rank                            | Int64    | 1 = fastest; <NA> unless status is ok                             |
| accum                           | Int64    | grad_accumulation_batches                                         |
| split                           | Int64    | batch_split_factor                                                |
| per_device_batch                | Int64    | global_batch_size / (accum * num_devices); <NA> if not an integer |
| joint_batch                     | Int64    | per_device_batch / split; <NA> if not an integer                  |
| status                          | category | ok, oom, failed, timeout, cancelled, running, pending, invalid    |
| oom_phase                       | category | encoder, joint, optimizer; <NA> unless status is oom              |
| throughput_samples_per_s        | float64  | median samples/s over the measured steps                          |
| throughput_low_samples_per_s    | float64  | lower end of the 95% interval of that median                      |
| throughput_high_samples_per_s   | float64  | upper end of that interval                                        |
| speedup                         | float64  | throughput / that of the split=1 baseline (smallest ok accum)     |
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

The throughput columns keep their historical `_samples_per_s` names; their unit is
`throughput_unit` (tokens/s for a trainer that counts tokens). A trials.csv written before
the last six columns existed still loads: they are <NA>/NaN there.

Missing values are <NA> (integers, strings, categories) or NaN (floats).
`status` and `oom_phase` always carry every category in the order above, so
`value_counts()` and concatenation across sweeps behave the same everywhere.
The frame round-trips through `to_parquet`/`read_parquet` unchanged, and
through `to_csv(index=False)` + `load()`.

`compare(sources)` returns one row per (accum, split, sweep) over the union of
the pairs in all sweeps (an outer join), sorted by accum, split, sweep_order:

| column                          | dtype    | meaning                                                           |
|---------------------------------|----------|-------------------------------------------------------------------|
| accum, split                    | Int64    | the pair                                                          |
| sweep_order                     | Int64    | position of the sweep in the input; 0 is the reference            |
| sweep_id, machine, workload     | string   | as in load()                                                      |
| global_batch_size, num_devices  | Int64    | as in load()                                                      |
| status, oom_phase               | category | as in load(); status <NA> where the sweep did not list the pair   |
| rank, per_device_batch          | Int64    | as in load()                                                      |
| throughput_*_samples_per_s      | float64  | median, low, high as in load(); NaN where the pair did not run ok |
| speedup                         | float64  | within its own sweep, as in load()                                |
| ratio_vs_first                  | float64  | throughput / the reference sweep's throughput for the same pair   |
| within_noise                    | boolean  | True where this sweep's 95% interval overlaps the reference's; <NA> for the reference itself or a missing interval |
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np
import pandas as pd

from sweep.core.ranking import TABLE_COLUMNS
from sweep.core.schema import ALL_STATUSES, OOM_PHASES, SCHEMA_VERSION
from sweep.errors import LoadError  # defined there; still importable from here

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
}
# Columns a trials.csv from an older sweep may lack; load() fills them with missing values.
_ADDED_COLUMNS = ("throughput_unit", "tight", "stopped_early", "headroom", "peak_reserved_gib", "capacity_gib")

COMPARE_COLUMNS = [
    "accum",
    "split",
    "sweep_order",
    "sweep_id",
    "machine",
    "workload",
    "global_batch_size",
    "num_devices",
    "status",
    "oom_phase",
    "rank",
    "per_device_batch",
    "throughput_samples_per_s",
    "throughput_low_samples_per_s",
    "throughput_high_samples_per_s",
    "speedup",
    "ratio_vs_first",
    "within_noise",
]

# Constant within a sweep: filled in on compare() rows for pairs the sweep did not list.
_SWEEP_LEVEL = ["sweep_id", "machine", "workload", "global_batch_size", "num_devices"]

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


def compare(sources: Sequence[Source | pd.DataFrame]) -> pd.DataFrame:
    """Line up several sweeps on (accum, split); the first sweep is the reference.

    Each source is anything load() takes, or a frame load() returned. A source
    holding several sweeps adds each of them, in order. Sweeps are
    deduplicated by sweep_id. Columns are documented in the module docstring.
    """
    if isinstance(sources, (str, os.PathLike, pd.DataFrame)):
        sources = [sources]
    sweeps: list[pd.DataFrame] = []
    seen: set[str] = set()
    for src in sources:
        df = src if isinstance(src, pd.DataFrame) else load(src)
        _check_columns(df)
        for sweep_id in df["sweep_id"].dropna().unique():
            if sweep_id not in seen:
                seen.add(sweep_id)
                sweeps.append(df[df["sweep_id"] == sweep_id])
    if len(sweeps) < 2:
        raise LoadError(f"compare needs at least two sweeps, got {len(sweeps)}: pass two or more sweep dirs")

    pairs = sorted({(int(a), int(s)) for d in sweeps for a, s in zip(d["accum"], d["split"])})
    index = pd.MultiIndex.from_tuples(pairs, names=["accum", "split"])
    aligned = []
    for order, d in enumerate(sweeps):
        wide = d.drop_duplicates(["accum", "split"]).set_index(["accum", "split"]).reindex(index)
        for col in _SWEEP_LEVEL:
            wide[col] = d[col].iloc[0]
        wide["sweep_order"] = order
        aligned.append(wide)

    ref = aligned[0]
    for wide in aligned:
        wide["ratio_vs_first"] = wide["throughput_samples_per_s"] / ref["throughput_samples_per_s"]
        wide["within_noise"] = _overlap(wide, ref) if wide is not ref else pd.NA

    out = pd.concat(aligned).reset_index()
    out = out.sort_values(["accum", "split", "sweep_order"], kind="stable", ignore_index=True)
    dtypes = {**SCHEMA, "sweep_order": _INT, "ratio_vs_first": _FLOAT, "within_noise": "boolean"}
    return out[COMPARE_COLUMNS].astype({c: dtypes[c] for c in COMPARE_COLUMNS})


RUN_TO_RUN_COLUMNS = ["machine", "workload", "global_batch_size", "num_devices", "run_to_run_noise", "spread",
                      "pairs", "repeats", "dof", "setting"]


def run_to_run(sources: Source | pd.DataFrame | Sequence[Source | pd.DataFrame]) -> pd.DataFrame:
    """Run-to-run noise of each machine (core/run_to_run.py), from sweeps that measured the same pairs.

    One row per machine, workload, global batch and device count with a pair that ran ok in two
    or more sweeps; `setting` is the override that tells later sweeps there, e.g.
    `machine.run_to_run_noise=0.05`, never below the floor the confidence score was calibrated
    with (confidence.TRIAL_FLOOR): an estimate of 0 from a few repeats does not make the score
    surer than its calibration. Raises LoadError when no pair ran ok twice.

    Trials racing stopped early are left out: racing stops a trial because its figure came out
    low, so those figures are selected, and they would widen the spread they are meant to measure.
    """
    from sweep.core.confidence import TRIAL_FLOOR
    from sweep.core.run_to_run import Repeat, estimate_run_to_run

    if isinstance(sources, (str, os.PathLike, pd.DataFrame)):
        sources = [sources]
    frames = [src if isinstance(src, pd.DataFrame) else load(src) for src in sources]
    for df in frames:
        _check_columns(df)
    df = pd.concat(frames).drop_duplicates(["sweep_id", "accum", "split"])
    ok = df[(df["status"] == "ok") & (df["throughput_samples_per_s"] > 0) & df["stopped_early"].isna()]
    rows = []
    for key, group in ok.groupby(_SWEEP_LEVEL[1:], sort=True, observed=True):
        repeats = {
            pair: [Repeat(float(r.throughput_samples_per_s), _number(r.throughput_low_samples_per_s),
                          _number(r.throughput_high_samples_per_s)) for r in trials.itertuples()]
            for pair, trials in group.groupby(["accum", "split"], observed=True)
        }
        est = estimate_run_to_run(repeats)
        if est is not None:
            setting = f"machine.run_to_run_noise={max(est.noise, TRIAL_FLOOR):.3f}"
            rows.append([*key, est.noise, est.spread, est.pairs, est.repeats, est.dof, setting])
    if not rows:
        n = df["sweep_id"].nunique()
        raise LoadError(
            "run_to_run needs a pair that ran ok in two or more sweeps of one machine (not stopped early by racing), "
            f"found none in {n} sweep(s): "
            "measure the same pairs in two sweep dirs, e.g. `python -m sweep search=grid search.racing=false accum=2,4 split=2,4 "
            "hydra.sweep.dir=outputs/repeat1`, then again with outputs/repeat2"
        )
    dtypes = {**SCHEMA, "run_to_run_noise": _FLOAT, "spread": _FLOAT, "pairs": _INT, "repeats": _INT, "dof": _INT,
              "setting": _STR}
    return pd.DataFrame(rows, columns=RUN_TO_RUN_COLUMNS).astype({c: dtypes[c] for c in RUN_TO_RUN_COLUMNS})


def _number(value: Any) -> float | None:
    return None if pd.isna(value) else float(value)


def _overlap(a: pd.DataFrame, b: pd.DataFrame) -> pd.Series:
    """Whether the 95% intervals overlap, pair by pair; <NA> where either interval is missing."""
    lo = np.maximum(a["throughput_low_samples_per_s"], b["throughput_low_samples_per_s"])
    hi = np.minimum(a["throughput_high_samples_per_s"], b["throughput_high_samples_per_s"])
    known = pd.concat(
        [a["throughput_low_samples_per_s"], a["throughput_high_samples_per_s"],
         b["throughput_low_samples_per_s"], b["throughput_high_samples_per_s"]],
        axis=1,
    ).notna().all(axis=1)
    return (lo <= hi).astype("boolean").where(known, pd.NA)


def _check_columns(df: pd.DataFrame) -> None:
    missing = [c for c in SCHEMA if c not in df.columns]
    if missing:
        raise LoadError(f"DataFrame is missing column(s) {', '.join(missing)}: pass a frame returned by sweep.load()")
