"""`python -m sweep.report DIR [--compare DIR...] [--export FORM]`: read a sweep dir, report on it.

Plain run: print the ranked table (the one table model, core/table.py: a rich table on a
terminal, plain text otherwise; Markdown in summary.md) and the recommendation, and write summary.md, heatmap.png and
scaling.png into DIR. `--compare`: print and write DIR/comparison.md instead.
`--export`: print only that form of the recommendation, for `$(...)` in scripts.

Exit codes: 0 done; 1 nothing to export yet or DIR not writable; 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from sweep.analysis import api, compare, export
from sweep.core.recommendation import Recommendation, recommendation_line
from sweep.core.schema import Status
from sweep.core.table import (
    SweepTable,
    interval_cell,
    markdown_grid,
    render_markdown,
    render_plain,
    row_from_mapping,
    status_cell,
    sweep_table,
)
from sweep.errors import LoadError, ReportError
from sweep.records import atomic_write_text


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """load()'s rows as plain dicts, missing values as None: what the table model takes."""
    return [{k: (None if _missing(v) else v) for k, v in r.items()} for r in df.to_dict("records")]


def _missing(v: Any) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def report_table(df: pd.DataFrame) -> SweepTable:
    """The sweep table (core/table.py) for a loaded sweep; 1-D sweeps (split always 1) drop split and joint."""
    return sweep_table(records(df))


def plain_table(df: pd.DataFrame) -> str:
    return render_plain(report_table(df))


def print_table(df: pd.DataFrame, stream: TextIO, use_rich: bool, width: int | None = None) -> None:
    table = report_table(df)
    if not use_rich:
        print(render_plain(table), file=stream)
        return
    from rich.console import Console

    from sweep.orchestration.display import rich_table

    console = Console(file=stream, width=width)
    console.print(rich_table(table, framed=True))
    for line in [*([table.notes_title] if table.notes else []), *(f"  {n}" for n in table.notes), *table.footer]:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def sweep_dir(path: str | Path) -> Path:
    """DIR checked to be one sweep dir (outputs/latest included)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ReportError(f"{path}: no such directory; expected a sweep dir containing {api.TRIALS_CSV}, e.g. outputs/latest")
    if not p.is_dir() or not (p / api.TRIALS_CSV).is_file():
        raise ReportError(f"{path}: not a sweep dir; expected a directory containing {api.TRIALS_CSV}, e.g. outputs/latest")
    return p


def read_recommendation(directory: Path) -> Recommendation | None:
    """recommendation.yaml, or None before any trial ran ok (the sweep writes it only then)."""
    import yaml

    path = directory / api.RECOMMENDATION_YAML
    if not path.is_file():
        return None
    try:
        rec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        first = str(e).splitlines()[0]
        raise ReportError(f"{path}: not readable YAML ({first}); rerun `python -m sweep {shlex.quote(f'resume={directory}')}`") from None
    if rec is not None and not isinstance(rec, dict):
        raise ReportError(f"{path}: expected a mapping of recommendation keys, found {type(rec).__name__}")
    if rec is None:
        return None
    try:
        return Recommendation.from_record(rec)
    except (TypeError, ValueError) as e:
        raise ReportError(f"{path}: {e}") from None


def _counts(df: pd.DataFrame) -> str:
    counts = df["status"].value_counts(sort=False)
    return ", ".join(f"{n} {s}" for s, n in counts.items() if n)


def _headline(df: pd.DataFrame, meta: Mapping[str, Any] | None) -> str:
    first = df.iloc[0]
    state = (meta or {}).get("state", "unknown")
    return (
        f"sweep {first['sweep_id']}: {first['machine']}, workload {first['workload']}, "
        f"global batch {first['global_batch_size']} on {first['num_devices']} device(s), state {state}"
    )


def summary_markdown(df: pd.DataFrame, meta: Mapping[str, Any] | None, rec: Recommendation | None,
                     forms: Mapping[str, str], plots: bool = True) -> str:
    first = df.iloc[0]
    meta = meta or {}
    lines = [
        f"# Sweep {first['sweep_id']}",
        "",
        f"- machine: {first['machine']}",
        f"- workload: {first['workload']}",
        f"- global batch: {first['global_batch_size']} samples over {first['num_devices']} device(s)",
        f"- search: {meta.get('search', '?')}; state: {meta.get('state', '?')}; "
        f"started {meta.get('started_at') or '?'}, finished {meta.get('finished_at') or '-'}",
        f"- trials: {_counts(df)}",
        "",
        "## Recommendation",
        "",
        recommendation_line(rec),
    ]
    if rec is not None and rec.throughput_samples_per_s is not None:
        detail = f"{rec.throughput_samples_per_s:,.1f} samples/s"
        interval = rec.throughput_interval_samples_per_s
        if interval is not None:
            detail += f" (95% interval {interval[0]:,.1f}-{interval[1]:,.1f})"
        lines += ["", f"{detail}, per-device batch {rec.per_device_batch}, joint batch {rec.joint_batch}"]
    lines += ["", "## Ranked table", "", render_markdown(report_table(df))]
    if forms:
        lines += ["", "## Use it"]
        titles = {"flags": "CLI flags", "yaml": "YAML", "nemo": "NeMo overrides", "slurm": "Slurm"}
        for form, text in forms.items():
            lines += ["", f"{titles.get(form, form)}:", "", "```" + ("yaml" if form == "yaml" else "sh"), text, "```"]
    if plots:
        lines += ["", "## Plots", "", "![throughput by (accum, split)](heatmap.png)", "",
                  "![throughput vs per-device batch](scaling.png)"]
    return "\n".join(lines) + "\n"


def _sweep_cell(r: Mapping[str, Any]) -> str:
    if pd.isna(r["status"]):
        return "-"  # the pair is not in this sweep
    row = row_from_mapping({k: (None if _missing(v) else v) for k, v in r.items()})
    if row.status != Status.OK:
        return status_cell(row)
    cell = f"{row.throughput:,.1f}"
    return cell + (f" [{interval_cell(row)}]" if interval_cell(row) else "")


def _change_cell(r: Mapping[str, Any]) -> str:
    if pd.isna(r["ratio_vs_first"]):
        return ""
    return f"{r['ratio_vs_first']:.2f}x" + (" (noise)" if pd.notna(r["within_noise"]) and r["within_noise"] else "")


def comparison_markdown(cmp: pd.DataFrame, metas: Mapping[str, Mapping[str, Any] | None]) -> str:
    sweeps = cmp.drop_duplicates("sweep_order").sort_values("sweep_order")
    labels = {int(o): chr(ord("A") + int(o)) if o < 26 else f"S{o}" for o in sweeps["sweep_order"]}
    lines = ["# Sweep comparison", "", "Reference: A. Changes are throughput ratios against A for the same (accum, split); "
             "\"(noise)\" marks a change whose 95% interval overlaps A's.", ""]
    legend_rows = []
    for sw in sweeps.to_dict("records"):
        meta = metas.get(sw["sweep_id"]) or {}
        legend_rows.append([labels[sw["sweep_order"]], str(sw["sweep_id"]), str(sw["machine"]), str(sw["workload"]),
                            str(sw["global_batch_size"]), str(sw["num_devices"]), str(meta.get("state", "?")),
                            str(meta.get("started_at") or "?")])
    lines.append(markdown_grid(["", "sweep", "machine", "workload", "global batch", "devices", "state", "started"],
                                legend_rows, [False] * 4 + [True, True, False, False]))
    if sweeps["global_batch_size"].nunique() > 1:
        lines += ["", "Warning: the sweeps use different global batch sizes, so one (accum, split) pair means "
                      "different per-device batches in each."]

    headers = ["accum", "split"]
    for o, label in labels.items():
        headers.append(f"{label} samples/s [95%]")
        if o:
            headers.append(f"{label} vs A")
    rows = []
    for (accum, split), group in cmp.groupby(["accum", "split"], sort=True):
        row = [str(accum), str(split)]
        for r in group.sort_values("sweep_order").to_dict("records"):
            row.append(_sweep_cell(r))
            if r["sweep_order"]:
                row.append(_change_cell(r))
        rows.append(row)
    lines += ["", "## Throughput by (accum, split)", "", markdown_grid(headers, rows, [True] * len(headers)), ""]

    lines += ["## Best pair per sweep", ""]
    for o, label in labels.items():
        best = cmp[(cmp["sweep_order"] == o) & (cmp["rank"] == 1)]
        if best.empty:
            lines.append(f"- {label}: no trial ran ok")
            continue
        b = best.iloc[0]
        # The figure its rank 1 rests on (both timings' geometric mean where the drift check re-timed it), as summary.md shows.
        figure = b["ranked_throughput_samples_per_s"] if pd.notna(b["ranked_throughput_samples_per_s"]) else b["throughput_samples_per_s"]
        lines.append(f"- {label}: accum={b['accum']} split={b['split']}, {figure:,.1f} samples/s")
    for o, label in list(labels.items())[1:]:
        sub = cmp[(cmp["sweep_order"] == o) & cmp["within_noise"].notna()]
        faster = int(((sub["ratio_vs_first"] > 1) & ~sub["within_noise"].astype(bool)).sum())
        slower = int(((sub["ratio_vs_first"] < 1) & ~sub["within_noise"].astype(bool)).sum())
        lines.append(f"- {label} vs A: {faster} pair(s) faster, {slower} slower, "
                     f"{int(sub['within_noise'].sum())} within noise, over {len(sub)} pair(s) both ran ok")
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sweep.report", description="Report on a sweep dir.")
    p.add_argument("dir", help="sweep dir, e.g. outputs/latest")
    p.add_argument("--compare", nargs="+", metavar="DIR", help="other sweep dirs: write DIR/comparison.md against DIR")
    p.add_argument("--export", choices=export.FORMS, help="print only this form of the recommendation")
    p.add_argument("--nodes", type=int, default=1, help="nodes for the slurm form (default 1)")
    p.add_argument("--train-command", default=export.DEFAULT_TRAIN_COMMAND,
                   help="training command template for the slurm form; placeholders: {flags}, "
                        "{global_batch_size}, {accum}, {split}, {per_device_batch}, ...")
    p.add_argument("--no-plots", action="store_true", help="skip heatmap.png and scaling.png")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (LoadError, ReportError) as e:
        print(f"sweep.report: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader (e.g. `| head`) left: stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:
        print(f"sweep.report: error: cannot write {e.filename or 'the report'}: {e.strerror}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    directory = sweep_dir(args.dir)
    if args.export:
        rec = read_recommendation(directory)
        if rec is None:
            print(f"sweep.report: {recommendation_line(None)} in {directory}", file=sys.stderr)
            return 1
        try:
            text = export.render(args.export, rec, nodes=args.nodes, template=args.train_command)
        except ValueError as e:
            raise ReportError(f"{e} (see --nodes and --train-command)") from None
        print(text)
        return 0
    if args.compare:
        others = [sweep_dir(d) for d in args.compare]
        cmp = compare.compare([directory, *others])
        metas = {}
        for d in [directory, *others]:
            meta = api.read_meta(d)
            if meta:
                metas[str(meta.get("sweep_id"))] = meta
        text = comparison_markdown(cmp, metas)
        atomic_write_text(directory / "comparison.md", text)
        print(text, end="")
        print(f"wrote {directory / 'comparison.md'}", file=sys.stderr)
        return 0

    written = write_report(directory, nodes=args.nodes, template=args.train_command, plots=not args.no_plots,
                           stream=sys.stdout, use_rich=sys.stdout.isatty())
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def write_report(directory: Path, *, nodes: int = 1, template: str = export.DEFAULT_TRAIN_COMMAND,
                 plots: bool = True, stream: TextIO | None = None, use_rich: bool = False) -> list[Path]:
    """Print the table and recommendation to `stream` (if given) and write the files beside the results."""
    df = api.load(directory)
    if df.empty:
        raise ReportError(f"{directory / api.TRIALS_CSV}: has no candidate rows yet; wait for the sweep to list its candidates")
    meta = api.read_meta(directory)
    rec = read_recommendation(directory)
    try:
        forms = export.all_forms(rec, nodes=nodes, template=template) if rec else {}
    except ValueError as e:
        raise ReportError(f"{e} (see --nodes and --train-command)") from None
    # Files first: a reader piping the printout into `head` must still get them.
    summary = directory / "summary.md"
    atomic_write_text(summary, summary_markdown(df, meta, rec, forms, plots))
    written = [summary]
    if plots:
        from sweep.analysis import plots as plotting  # matplotlib is heavy: only load it when drawing

        # Colours are drawn at the noise the confidence score assumed (recorded beside it).
        written.append(plotting.heatmap(df, directory / "heatmap.png", noise=rec.run_to_run_noise if rec else None))
        written.append(plotting.scaling(df, directory / "scaling.png"))
    if stream is not None:
        print(_headline(df, meta), file=stream)
        print(f"trials: {_counts(df)}", file=stream)
        print_table(df, stream, use_rich)
        print(recommendation_line(rec), file=stream)
        if rec:
            print(f"flags: {forms['flags']}", file=stream)
    return written


if __name__ == "__main__":
    raise SystemExit(main())
