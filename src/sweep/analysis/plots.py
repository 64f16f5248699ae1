"""PNG plots of one sweep: the (accum, split) throughput heatmap and the scaling check.

Figures are built with matplotlib's object API on the Agg canvas, never pyplot:
no global backend switch, no figure registry, so this is safe to call from a
notebook, a headless CI job or a thread.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib
import matplotlib.colors
import matplotlib.ticker
import matplotlib.transforms
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


# The noise the heatmap's colours are drawn at when the caller does not give the machine's: the
# confidence score's floor (confidence.TRIAL_FLOOR), the least run-to-run noise any machine is scored with.
DEFAULT_NOISE = 0.01
# Two pairs' throughputs within this many noise sds of each other (their difference's 95% band,
# 1.96 * sqrt(2) sds) are not told apart: the heatmap draws them in one colour.
_TIE_SDS = 1.96 * 2**0.5
RECOMMENDED_EDGE = "#d62728"
TIGHT_EDGE = "#ff7f0e"


RANKED = "ranked_throughput_samples_per_s"


def ranked_figure(df: pd.DataFrame) -> pd.Series:
    """Each row's figure as the sweep ranks it: ranked_throughput (a re-timed pair's geometric mean of both timings),
    else the trial's own throughput (a trials.csv from before that column)."""
    own = df["throughput_samples_per_s"].astype("float64")
    return df[RANKED].astype("float64").fillna(own) if RANKED in df else own


def recommended_pair(df: pd.DataFrame) -> tuple[int, int] | None:
    """(accum, split) the sweep recommends: the fastest ok pair that is not tight (core/recommendation.py's rule), on
    the figures the sweep ranks by (ranked_figure), so the heatmap's `rec` is recommendation.yaml's pair."""
    ranked = df.assign(_ranked=ranked_figure(df))
    ok = ranked[(ranked["status"] == "ok") & ranked["_ranked"].notna()]
    if ok.empty:
        return None
    tight = _tight(ok)
    pool = ok[~tight] if (~tight).any() else ok
    best = pool.sort_values(["_ranked", "accum", "split"], ascending=[False, True, True]).iloc[0]
    return int(best["accum"]), int(best["split"])


def _tight(rows: pd.DataFrame) -> pd.Series:
    if "tight" not in rows:
        return pd.Series(False, index=rows.index)
    return rows["tight"].astype("boolean").fillna(False).astype(bool)


def heatmap(df: pd.DataFrame, path: str | Path, one_d: bool | None = None, noise: float | None = None) -> Path:
    """Throughput over accum (rows) x split (columns) for one sweep; non-ok cells labelled by why.

    A 1-D sweep (one_d; None: when only split=1 ran) draws one column with no split axis.
    noise: the machine's run-to-run noise (recommendation.yaml's run_to_run_noise); see heatmap_figure.
    """
    return _save(heatmap_figure(df, one_d, noise), path)


def heatmap_figure(df: pd.DataFrame, one_d: bool | None = None, noise: float | None = None) -> Figure:
    """The heatmap's figure, unsaved.

    Colours: pairs whose throughput is within the noise of the best (a factor exp(-1.96 * sqrt(2) * noise) of it)
    share the top colour, and the scale spans at least four such bands, so a pair a few percent
    behind on a noisy machine is not drawn as far worse. Marks: the recommended pair has a solid red
    outline and "rec"; a tight pair (ok, but below trial.memory_margin) a dashed orange one and "tight".
    """
    one_d = _one_d(df, one_d)
    unit = _unit(df)
    if df.empty:
        raise ValueError("heatmap of an empty sweep table")
    noise = DEFAULT_NOISE if noise is None else float(noise)
    accums = sorted(int(a) for a in df["accum"].unique())
    splits = sorted(int(s) for s in df["split"].unique())
    grid = np.full((len(accums), len(splits)), np.nan)
    figure = ranked_figure(df)  # what each cell shows and is coloured by: the figure its rank rests on
    for i, row in df[df["status"] == "ok"].iterrows():
        grid[accums.index(int(row["accum"])), splits.index(int(row["split"]))] = figure[i]

    fig = Figure(figsize=(2.0 + 1.25 * len(splits), 1.6 + 0.85 * len(accums)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["viridis"]
    finite = grid[np.isfinite(grid)]
    best = float(finite.max()) if finite.size else 1.0
    band = _TIE_SDS * noise  # in log throughput (the noise is a relative sd): within it of the best is within the noise
    tie = best * float(np.exp(-band))  # from here up: within the noise of the best, one colour
    vmin = min(float(finite.min()) if finite.size else tie, best * float(np.exp(-4 * band)))  # > 0 at any noise
    if vmin >= tie:
        vmin = tie * 0.95
    # The bar spans every cell's value, the best included (a bar that stopped at the tie line read 211 beside
    # cells of 635 and 819 at a noise of 49%); the colour map is flat from the tie line up, so ties still share a colour.
    vmax = max(best, tie)
    cmap = _flat_above(cmap, (tie - vmin) / (vmax - vmin) if vmax > vmin else 1.0)
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    bar = fig.colorbar(image, ax=ax)
    bar.set_label(f"throughput ({unit})\nabove {tie:,.0f}: within the noise ({noise:.0%} sd) of the best", fontsize=8)

    rec = recommended_pair(df)
    legend: dict[str, Patch] = {}
    tight_rows = _tight(df)
    for i, row in df.iterrows():
        y, x = accums.index(int(row["accum"])), splits.index(int(row["split"]))
        if row["status"] == "ok":
            value = figure[i]
            marks = []
            if (int(row["accum"]), int(row["split"])) == rec:
                marks.append("rec")
                ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor=RECOMMENDED_EDGE, linewidth=3.5))
                legend.setdefault("recommended", Patch(fill=False, edgecolor=RECOMMENDED_EDGE, linewidth=2.5, label="rec = recommended"))
            if tight_rows[i]:
                marks.append("tight")
                inset = 0.08 if "rec" in marks else 0.0  # inside the red outline when both
                ax.add_patch(Rectangle((x - 0.5 + inset, y - 0.5 + inset), 1 - 2 * inset, 1 - 2 * inset, fill=False,
                                       edgecolor=TIGHT_EDGE, linewidth=2.5, linestyle="--"))
                legend.setdefault("tight", Patch(fill=False, edgecolor=TIGHT_EDGE, linewidth=2, linestyle="--",
                                                 label="tight = below trial.memory_margin: may OOM in training"))
            text = (f"#{int(row['rank'])} " if pd.notna(row["rank"]) and int(row["rank"]) <= 3 else "") + f"{value:,.0f}"
            if pd.notna(row["speedup"]):
                text += f"\n{row['speedup']:.2f}x"
            if "retimed_throughput_samples_per_s" in row and pd.notna(row["retimed_throughput_samples_per_s"]):
                marks.append("retimed")  # the value shown is the geometric mean of its two timings
            if marks:
                text += "\n" + " ".join(marks)
            # Dark text on the bright (fast) end of viridis, light text on the dark end.
            shade = min(1.0, (value - vmin) / (tie - vmin)) if np.isfinite(value) and tie > vmin else 1.0
            ax.text(x, y, text, ha="center", va="center", fontsize=8.5, color="black" if shade > 0.55 else "white",
                    fontweight="bold" if "rec" in marks else "normal")
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
                  ncol=min(len(legend), 3), fontsize=8, frameon=False)
    return fig


def _flat_above(cmap: matplotlib.colors.Colormap, at: float) -> matplotlib.colors.Colormap:
    """cmap stretched to reach its top colour at `at` (0..1) and flat from there: the tie band in one colour."""
    at = min(1.0, max(1e-6, at))
    # Entry i colours [i/n, (i+1)/n): sampled at its upper edge, the entry the tie line falls in is already the top colour.
    n = 1024
    return matplotlib.colors.ListedColormap([cmap(min(1.0, (i + 1) / n / at)) for i in range(n)], name="within_noise")


def scaling(df: pd.DataFrame, path: str | Path, one_d: bool | None = None) -> Path:
    """Throughput versus per-device batch, one line per split (one line for a 1-D sweep), against ideal linear scaling.

    The tuning playbook's check: while a larger per-device batch still buys
    near-linear throughput the device is under-used; where the lines bend away
    from the reference, more per-device batch stops paying.
    """
    return _save(scaling_figure(df, one_d), path)


def scaling_figure(df: pd.DataFrame, one_d: bool | None = None) -> Figure:
    """The scaling plot's figure, unsaved.

    Both axes are logarithmic, so ideal linear scaling is a straight line of slope 1 that stays in
    view; per-device batches where every pair ran out of memory (or was predicted to) are marked on
    the bottom edge with how many pairs did.
    """
    if df.empty:
        raise ValueError("scaling plot of an empty sweep table")
    one_d = _one_d(df, one_d)
    unit = _unit(df)
    ok = df[(df["status"] == "ok") & df["throughput_samples_per_s"].notna() & df["per_device_batch"].notna()]
    oom = df[df["status"].isin(["oom", "predicted_oom"]) & df["per_device_batch"].notna()]
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
    xs = np.array(sorted(set(ok["per_device_batch"].astype(float)) | set(oom["per_device_batch"].astype(float))))
    ok_xs = np.array(sorted(set(ok["per_device_batch"].astype(float))))
    ideal_x = np.array([ok_xs[0], ok_xs[-1]])
    ax.plot(ideal_x, t0 * ideal_x / b0, linestyle="--", color="#555555", label=f"ideal linear from per-device batch {b0:g}")

    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs, [f"{v:g}" for v in xs])
    ax.minorticks_off()
    lows = ok["throughput_low_samples_per_s"].fillna(ok["throughput_samples_per_s"])
    highs = ok["throughput_high_samples_per_s"].fillna(ok["throughput_samples_per_s"])
    bottom = float(min(lows.min(), t0)) / 1.6  # room under the lowest point for the OOM marks
    top = float(max(highs.max(), t0 * ok_xs[-1] / b0)) * 1.25  # the whole ideal line in view
    ax.set_ylim(bottom, top)
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlim(xs[0] / 1.4, xs[-1] * 1.4)
    if not oom.empty:
        # OOM pairs have no throughput: a row of marks on the bottom edge, at their per-device batch.
        counts = oom.groupby(oom["per_device_batch"].astype(float)).size()
        edge = matplotlib.transforms.blended_transform_factory(ax.transData, ax.transAxes)
        ax.scatter(counts.index, [0.04] * len(counts), marker="X", s=70, color="#d62728", transform=edge, zorder=5,
                   clip_on=False, label="out of memory (count of pairs)")
        for b, n in counts.items():
            ax.text(b, 0.09, f"{n} OOM", transform=edge, ha="center", va="bottom", fontsize=8, color="#d62728")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", title="log-log axes: ideal scaling is a slope-1 line", title_fontsize=8)
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
