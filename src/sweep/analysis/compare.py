"""Several sweeps side by side: `compare()` lines them up pair by pair, `run_to_run()` measures
each machine's run-to-run noise from the pairs they repeated. Both take what `load()` takes.

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
| within_noise                    | boolean  | True where this sweep's 95% interval overlaps the reference's; <NA> for the reference itself, a missing interval, or a pair whose per-device batch differs from the reference's |
| ranked_throughput_samples_per_s | float64  | the figure rank rests on, as in load()                            |

Sweeps at different global batch sizes or device counts run one (accum, split) at different
per-device batches: compare() warns (IncomparableSweepsWarning, naming them) and leaves
within_noise <NA> on every pair whose per-device batch is not the reference's, since its
throughput is another workload's; ratio_vs_first is kept, as the raw ratio it is.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from sweep.analysis.api import SCHEMA, Source, load
from sweep.errors import IncomparableSweepsWarning, LoadError

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
    "ranked_throughput_samples_per_s",  # appended: the figure `rank` rests on (load()'s column), for the best pair
]

# Constant within a sweep: filled in on compare() rows for pairs the sweep did not list.
_SWEEP_LEVEL = ["sweep_id", "machine", "workload", "global_batch_size", "num_devices"]


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
    _warn_if_incomparable(sweeps)
    for wide in aligned:
        wide["ratio_vs_first"] = wide["throughput_samples_per_s"] / ref["throughput_samples_per_s"]
        if wide is ref:
            wide["within_noise"] = pd.NA
            continue
        # A pair at another per-device batch is another measurement altogether: no noise verdict on it.
        same_batch = (wide["per_device_batch"] == ref["per_device_batch"]).fillna(False).astype(bool)
        wide["within_noise"] = _overlap(wide, ref).where(same_batch, pd.NA)

    out = pd.concat(aligned).reset_index()
    out = out.sort_values(["accum", "split", "sweep_order"], kind="stable", ignore_index=True)
    dtypes = {**SCHEMA, "sweep_order": "Int64", "ratio_vs_first": "float64", "within_noise": "boolean"}
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
    dtypes = {**SCHEMA, "run_to_run_noise": "float64", "spread": "float64", "pairs": "Int64", "repeats": "Int64", "dof": "Int64",
              "setting": "string"}
    return pd.DataFrame(rows, columns=RUN_TO_RUN_COLUMNS).astype({c: dtypes[c] for c in RUN_TO_RUN_COLUMNS})


def _warn_if_incomparable(sweeps: Sequence[pd.DataFrame]) -> None:
    """Warn once when the sweeps' global batch sizes or device counts differ (one pair, other per-device batches)."""
    setups = [(str(d["sweep_id"].iloc[0]), int(d["global_batch_size"].iloc[0]), int(d["num_devices"].iloc[0])) for d in sweeps]
    if len({(gb, n) for _, gb, n in setups}) > 1:
        listed = ", ".join(f"{sid}: global batch {gb} on {n} device(s)" for sid, gb, n in setups)
        warnings.warn(
            f"compare: the sweeps differ in global batch size or device count ({listed}), so one (accum, split) is a "
            "different per-device batch in each: within_noise is <NA> for those pairs; compare sweeps of one setting",
            IncomparableSweepsWarning, stacklevel=3,
        )


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
