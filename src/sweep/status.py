"""Watch a sweep from its dir alone, from any shell that sees it: attached, detached, running or finished.

    python -m sweep.status outputs/latest            # refreshes in place on a terminal until the sweep ends
    python -m sweep.status outputs/latest --once     # one snapshot
    python -m sweep.status outputs/latest --json     # one snapshot for scripts

Shows where the search runs (pid or Slurm job, and whether it is alive), the sweep's state, the ranked table as
trials land (trials.csv, which the search rewrites at each landing), the recommendation so far and its confidence,
and each trial that has not ended: queued (with Slurm's pending reason), or running with its timed steps and figure
so far. It reads files each writer writes atomically and writes nothing. Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from sweep.core.schema import ENDED_FILE, RESULT_FILE
from sweep.core.stats import throughput_summary
from sweep.errors import SweepError
from sweep.launch.backend import JOB_FILE
from sweep.launch.clusters import cluster_named
from sweep.orchestration.plan import META_FILE
from sweep.orchestration.search_record import SEARCH_FILE, read_search_record, search_alive
from sweep.records import progress_step_times

TABLE_FILE = "trials.csv"
RECOMMENDATION_FILE = "recommendation.yaml"
REFRESH_S = 2.0
ENDED_STATES = ("done", "interrupted")


def sweep_dir_arg(text: str) -> Path:
    """A sweep dir (one with sweep.json, or search.json: a search that has only just started), else one line naming
    what would be valid."""
    path = Path(text)
    if not (path / META_FILE).is_file() and not (path / SEARCH_FILE).is_file():
        raise SweepError(f"{text} is not a sweep dir (no {META_FILE} inside): give a dir a sweep printed, e.g. outputs/latest")
    return path


def snapshot(sweep_dir: Path) -> dict[str, Any]:
    """Everything the status shows, from the files in `sweep_dir` (and, for liveness, the host or squeue)."""
    meta = _json(sweep_dir / META_FILE) or {}
    record = read_search_record(sweep_dir)
    search: dict[str, Any] | None = None
    if record is not None:
        search = {"pid": record.pid, "host": record.host, "slurm_job_id": record.slurm_job_id, "detached": record.detached,
                  "log": record.log, "alive": search_alive(record)}
    gbs = int(meta.get("global_batch_size") or 0)
    return {
        "sweep_dir": str(sweep_dir),
        "state": meta.get("state", "unknown"),
        "search": search,
        "running": _unfinished(sweep_dir, gbs),
        "table": _table(sweep_dir),
        "recommendation": _recommendation(sweep_dir),
    }


def _json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def _unfinished(sweep_dir: Path, global_batch_size: int) -> list[dict[str, Any]]:
    """Each trial with a job and no record yet: queued, or running with its steps so far."""
    out = []
    for tdir in sorted((sweep_dir / "trials").glob("*")):
        job = _json(tdir / JOB_FILE)
        if job is None or (tdir / RESULT_FILE).exists() or (tdir / ENDED_FILE).exists():
            continue
        steps = progress_step_times(tdir)
        entry: dict[str, Any] = {"pair": tdir.name, "job_id": job.get("job_id"), "cluster": job.get("cluster"),
                                 "state": "running" if steps else "starting", "steps": len(steps), "throughput": None}
        if steps and global_batch_size:
            entry["throughput"] = round(throughput_summary(steps, global_batch_size)[0], 1)
        if not steps:
            entry["state"], entry["reason"] = cluster_named(str(job.get("cluster"))).queue_state(str(job.get("job_id")))
        out.append(entry)
    return out


def _table(sweep_dir: Path) -> list[dict[str, str]]:
    try:
        with (sweep_dir / TABLE_FILE).open(newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def _recommendation(sweep_dir: Path) -> dict[str, Any] | None:
    try:
        value = yaml.safe_load((sweep_dir / RECOMMENDATION_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(value, dict):
        return None
    return {k: value.get(k) for k in ("accum", "split", "confidence", "flags", "throughput_samples_per_s")}


def render(snap: dict[str, Any]) -> str:
    """The snapshot as the terminal shows it."""
    from sweep.orchestration.display import format_table

    lines = [f"sweep dir {snap['sweep_dir']}: {snap['state']}"]
    search = snap["search"]
    if search is None:
        lines.append("search: no search.json (a sweep from before `sweep.status`, or one that has not started)")
    else:
        where = f"Slurm job {search['slurm_job_id']}" if search["slurm_job_id"] else f"pid {search['pid']} on {search['host']}"
        alive = {True: "alive", False: "not running", None: "unknown from this host"}[search["alive"]]
        how = "detached, output in " + str(search["log"]) if search["detached"] else "attached to the terminal that started it"
        lines.append(f"search: {where}, {alive} ({how})")
        if search["alive"] is False and snap["state"] not in ENDED_STATES:
            lines.append(f"  the search is not running and the sweep did not end: resume it with python -m sweep resume={snap['sweep_dir']}")
    rows = [r for r in snap["table"] if r.get("status") not in (None, "", "pending", "invalid")]  # what ran, runs or was ruled out
    if rows:
        lines += ["", format_table(rows)]
    for t in snap["running"]:
        figure = f", {t['throughput']:g} samples/s so far" if t.get("throughput") else ""
        reason = f" ({t['reason']})" if t.get("reason") else ""
        lines.append(f"  {t['pair']}: {t['state']}{reason}, job {t['job_id']}, {t['steps']} timed step(s){figure}")
    rec = snap["recommendation"]
    if rec:
        ended = snap["state"] == "done"
        lines.append(f"{'recommended' if ended else 'recommended so far'}: accum={rec['accum']} split={rec['split']}, "
                     f"confidence {rec['confidence']}/100")
        lines.append(f"flags: {rec['flags']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweep.status", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", help="a sweep dir (e.g. outputs/latest)")
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.add_argument("--json", action="store_true", help="print one snapshot as JSON and exit")
    args = parser.parse_args(argv)
    try:
        sweep_dir = sweep_dir_arg(args.sweep_dir)
    except SweepError as e:
        print(f"sweep.status: {e}", file=err)
        return 2
    if args.json:
        print(json.dumps(snapshot(sweep_dir), indent=2), file=out)
        return 0
    if args.once or not out.isatty():
        print(render(snapshot(sweep_dir)), file=out)
        return 0
    return _watch(sweep_dir, out)


def _watch(sweep_dir: Path, out: TextIO) -> int:
    """Refresh in place until the sweep has ended and its search is gone (Ctrl-C leaves at once)."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console(file=out)
    try:
        with Live(console=console, auto_refresh=False) as live:
            while True:
                snap = snapshot(sweep_dir)
                live.update(Text(render(snap)), refresh=True)
                search = snap["search"]
                if snap["state"] in ENDED_STATES and (search is None or search["alive"] is not True):
                    return 0
                time.sleep(REFRESH_S)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
