"""PNG plots of one sweep: the (accum, split) throughput heatmap and the scaling check.

Figures are built with matplotlib's object API on the Agg canvas, never pyplot:
no global backend switch, no figure registry, so this is safe to call from a
notebook, a headless CI job or a thread.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

# How each non-ok cell is drawn: (label, face colour, hatch).
_OOM_STYLE = {
    "encoder": ("OOM enc", "#f4a3a3", "//"),
    "joint": ("OOM joint", "#fdc98f", "\\\\"),
    "optimizer": ("OOM opt", "#cdb8e6", "xx"),
    None: ("OOM", "#f4a3a3", "//"),
}
_OTHER_STYLE = {
    "invalid": ("invalid", "#d9d9d9", ""),
    "failed": ("failed", "#9e9e9e", ".."),
    "timeout": ("timeout", "#9e9e9e", ".."),
    "cancelled": ("cancelled", "#bdbdbd", ""),
    "running": ("running", "#deebf7", ""),
    "pending": ("pending", "#ffffff", ""),
    "skipped": ("skipped", "#f2f2f2", ""),
}


def _one_d(df: pd.DataFrame, one_d: bool | None) -> bool:
    """A 1-D sweep (a framework with no split): only split=1 was run, so no split axis is drawn."""
    if one_d is not None:
        return one_d
    return "split" not in df or bool((df["split"].fillna(1).astype(int) == 1).all())


def _unit(df: pd.DataFrame) -> str:
    """What the throughput counts (samples/s or tokens/s): the table's throughput_unit, samples/s before issue 12."""
    if "throughput_unit" in df:
        units = df["throughput_unit"].dropna().unique()
        if len(units) == 1:
            return str(units[0])
    return "samples/s"


def _title(df: pd.DataFrame) -> str:
    first = df.iloc[0]
    return (
        f"{first['machine']} · {first['workload']} · global batch {first['global_batch_size']} "
        f"on {first['num_devices']} device(s)\nsweep {first['sweep_id']}"
    )


def _cell_style(row: pd.Series) -> tuple[str, str, str]:
    if row["status"] == "oom":
        phase = None if pd.isna(row["oom_phase"]) else str(row["oom_phase"])
        return _OOM_STYLE.get(phase, _OOM_STYLE[None])
    return _OTHER_STYLE.get(str(row["status"]), (str(row["status"]), "#ffffff", ""))


def heatmap(df: pd.DataFrame, path: str | Path, one_d: bool | None = None) -> Path:
    """Throughput over accum (rows) x split (columns) for one sweep; non-ok cells labelled by why.

    A 1-D sweep (one_d; None: when only split=1 ran) draws one column with no split axis.
    """
    return _save(heatmap_figure(df, one_d), path)


def heatmap_figure(df: pd.DataFrame, one_d: bool | None = None) -> Figure:
    """The heatmap's figure, unsaved."""
    one_d = _one_d(df, one_d)
    unit = _unit(df)
    if df.empty:
        raise ValueError("heatmap of an empty sweep table")
    accums = sorted(int(a) for a in df["accum"].unique())
    splits = sorted(int(s) for s in df["split"].unique())
    grid = np.full((len(accums), len(splits)), np.nan)
    ok = df[df["status"] == "ok"]
    for _, row in ok.iterrows():
        grid[accums.index(int(row["accum"])), splits.index(int(row["split"]))] = row["throughput_samples_per_s"]

    fig = Figure(figsize=(2.0 + 1.25 * len(splits), 1.6 + 0.85 * len(accums)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["viridis"]
    finite = grid[np.isfinite(grid)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if vmin == vmax:
        vmin, vmax = vmin * 0.95, vmax * 1.05 + 1e-9
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    fig.colorbar(image, ax=ax, label=f"throughput ({unit})")

    legend: dict[str, Patch] = {}
    for _, row in df.iterrows():
        y, x = accums.index(int(row["accum"])), splits.index(int(row["split"]))
        if row["status"] == "ok":
            value = row["throughput_samples_per_s"]
            text = f"{value:,.0f}"
            if pd.notna(row["speedup"]):
                text += f"\n{row['speedup']:.2f}x"
            if pd.notna(row["rank"]) and row["rank"] == 1:  # an unranked ok row (a throughput of 0) has NA
                text = "#1  " + text
                ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="#d62728", linewidth=3))
            # Dark text on the bright (fast) end of viridis, light text on the dark end.
            shade = (value - vmin) / (vmax - vmin) if np.isfinite(value) else 0.0
            ax.text(x, y, text, ha="center", va="center", fontsize=9, color="black" if shade > 0.55 else "white")
            continue
        label, face, hatch = _cell_style(row)
        ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=face, hatch=hatch, edgecolor="#707070", linewidth=0.5))
        # A backing box keeps the label legible over the hatching.
        ax.text(x, y, label, ha="center", va="center", fontsize=9,
                color="#404040" if label in ("running", "pending", "skipped") else "black",
                bbox=dict(facecolor=face, edgecolor="none", alpha=0.85, pad=1.5))
        legend.setdefault(label, Patch(facecolor=face, hatch=hatch, edgecolor="#707070", label=label))

    per_device = df.groupby("accum")["per_device_batch"].max()
    ax.set_xticks(range(len(splits)), [""] * len(splits) if one_d else [str(s) for s in splits])
    ax.set_yticks(
        range(len(accums)),
        [f"{a}\n(per-dev {per_device[a]})" if pd.notna(per_device[a]) else str(a) for a in accums],
    )
    if one_d:
        ax.set_ylabel("gradient accumulation steps (accum)")
        ax.tick_params(axis="x", length=0)
    else:
        ax.set_xlabel("batch_split_factor (split)")
        ax.set_ylabel("grad_accumulation_batches (accum)")
    ax.set_xlim(-0.5, len(splits) - 0.5)
    ax.set_ylim(len(accums) - 0.5, -0.5)
    ax.set_title(_title(df), fontsize=10)
    if legend:
        ax.legend(handles=list(legend.values()), loc="upper center", bbox_to_anchor=(0.5, -0.14),
                  ncol=min(len(legend), 4), fontsize=8, frameon=False)
    return fig


def scaling(df: pd.DataFrame, path: str | Path, one_d: bool | None = None) -> Path:
    """Throughput versus per-device batch, one line per split (one line for a 1-D sweep), against ideal linear scaling.

    The tuning playbook's check: while a larger per-device batch still buys
    near-linear throughput the device is under-used; where the lines bend away
    from the reference, more per-device batch stops paying.
    """
    return _save(scaling_figure(df, one_d), path)


def scaling_figure(df: pd.DataFrame, one_d: bool | None = None) -> Figure:
    """The scaling plot's figure, unsaved."""
    if df.empty:
        raise ValueError("scaling plot of an empty sweep table")
    one_d = _one_d(df, one_d)
    unit = _unit(df)
    ok = df[(df["status"] == "ok") & df["throughput_samples_per_s"].notna() & df["per_device_batch"].notna()]
    fig = Figure(figsize=(7.5, 5.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(_title(df), fontsize=10)
    ax.set_xlabel("per-device batch (samples, log2 scale)")
    ax.set_ylabel(f"throughput ({unit})")
    if ok.empty:
        ax.text(0.5, 0.5, "no trial has run ok yet", ha="center", va="center", transform=ax.transAxes)
        return fig

    for split, group in ok.groupby("split"):
        group = group.sort_values("per_device_batch")
        x = group["per_device_batch"].astype(float).to_numpy()
        y = group["throughput_samples_per_s"].to_numpy()
        lo = (y - group["throughput_low_samples_per_s"].fillna(pd.Series(y, index=group.index))).clip(lower=0)
        hi = (group["throughput_high_samples_per_s"].fillna(pd.Series(y, index=group.index)) - y).clip(lower=0)
        ax.errorbar(x, y, yerr=[lo.to_numpy(), hi.to_numpy()], marker="o", capsize=3, label="measured" if one_d else f"split={split}")

    # Ideal: throughput proportional to per-device batch, anchored at the best point at the smallest batch.
    b0 = float(ok["per_device_batch"].min())
    t0 = float(ok.loc[ok["per_device_batch"] == b0, "throughput_samples_per_s"].max())
    xs = np.array(sorted(set(ok["per_device_batch"].astype(float))))
    dense = np.geomspace(xs[0], xs[-1], 64)  # the ideal is a curve on a log x axis, not a polyline
    ax.plot(dense, t0 * dense / b0, linestyle="--", color="#555555", label=f"ideal linear from per-device batch {b0:g}")

    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{v:g}" for v in xs])
    ax.minorticks_off()
    top = float(ok["throughput_high_samples_per_s"].fillna(ok["throughput_samples_per_s"]).max())
    ax.set_ylim(0, top * 1.25)  # the ideal line leaves the plot rather than squashing the measured ones
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _save(fig: Figure, path: str | Path) -> Path:
    """Write via a temp file and rename, so a viewer never shows a half-written PNG."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, dpi=120, format="png")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
