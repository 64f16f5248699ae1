"""Check a parser against a real log before spending cluster hours on it.

    python -m sweep.logs train.log --parser nanogpt --global-batch-size 480 --num-devices 8

Prints every figure the parser finds (step or epoch, value, unit, and whether it is warm-up,
measured or ignored), then the throughput a trial would record: the median, its 95%
interval and the unit. Bad input (unknown parser, unreadable file, no figures, a figure
that needs a flag not given): one line on stderr, exit status 2.

A trial's log (trials/<pair>/command-N.log) has the probe's records beside it (probe-N, or
--probe DIR): the probe's figures are shown next to the log's, and a disagreement over
DISAGREE_FRACTION is flagged (a smoothed bar, an average that includes validation, ...) where it is beyond the noise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from sweep.errors import ThroughputError
from sweep.errors import UsageError as _BadInput
from sweep.parsers import PRESETS, ThroughputSummary, parser_settings, scan_file
from sweep.parsers.formats import PARSER_TYPES, valid_types
from sweep.parsers.throughput import IGNORED

BAD_INPUT = 2
DISAGREE_FRACTION = 0.05  # log and probe medians further apart than this are flagged


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be > 0")
    return value


def _skip(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2, as the rest of sweep."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _BadInput(f"sweep.logs: {message}")


def build_argparser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m sweep.logs",
        description="Show the throughput figures a parser finds in a training log, and what a trial would record.",
    )
    p.add_argument("file", help="the training log to read")
    p.add_argument("--parser", required=True, metavar="NAME", help=f"a preset ({', '.join(PRESETS)}) or regex/jsonl with --pattern/--key")
    p.add_argument("--pattern", help="for --parser regex: a regex with a named group 'throughput'")
    p.add_argument("--key", help="for --parser jsonl: the dotted key path of the figure")
    p.add_argument("--unit", help="for regex/jsonl: the figure's unit (samples/s, tokens/s, s/step, ms/step, steps/s, ...)")
    p.add_argument("--global-batch-size", type=_positive_int, metavar="N", help="samples per optimizer step (needed for step times)")
    p.add_argument("--num-devices", type=_positive_int, default=1, metavar="N", help="devices (scales per-GPU figures; default 1)")
    p.add_argument("--accum", type=_positive_int, metavar="N", help="micro-batches per optimizer step (for bars that count micro-batches)")
    p.add_argument("--tokens-per-sample", type=_positive_float, metavar="N", help="tokens in one sample: report tokens/s")
    p.add_argument("--skip-first", type=_skip, metavar="N", help="warm-up figures to skip (default: the preset's)")
    p.add_argument("--probe", metavar="DIR", help="the probe's record dir to compare with (default: probe-N beside command-N.log)")
    p.add_argument("--probe-warmup", type=_skip, default=2, metavar="N", help="probe steps not timed (trial.warmup_steps; default 2)")
    return p


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    parser = build_argparser()
    try:
        args = parser.parse_args(argv)
        return _check(args, out)
    except _BadInput as e:
        print(str(e), file=err)
        return BAD_INPUT
    except (ValueError, OSError) as e:  # ThroughputError is a ValueError
        print(f"sweep.logs: {e}", file=err)
        return BAD_INPUT


def _check(args: argparse.Namespace, out: TextIO) -> int:
    if args.parser not in PARSER_TYPES:
        raise _BadInput(f"sweep.logs: --parser {args.parser!r} is not known; valid parsers: {valid_types()}")
    spec: dict = {"type": args.parser}
    for name in ("pattern", "key", "unit"):
        if getattr(args, name) is not None:
            spec[name] = getattr(args, name)
    if args.skip_first is not None:
        spec["skip_first"] = args.skip_first
    if args.tokens_per_sample is not None:
        spec["tokens_per_sample"] = args.tokens_per_sample
    settings = parser_settings(spec)
    try:
        measurements = scan_file(args.file, settings.make_parser())
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        raise _BadInput(f"sweep.logs: cannot read {args.file}: {e.strerror}") from None
    probe_dir = _probe_dir(args)
    if not measurements:
        if probe_dir is not None:
            _print_probe(out, probe_dir, args, None)
        raise _BadInput(f"sweep.logs: no figures the {args.parser} parser recognises in {args.file}")
    try:
        summary = settings.summarize(
            measurements, global_batch_size=args.global_batch_size, num_devices=args.num_devices, accum=args.accum
        )
    except ThroughputError as e:
        _print_figures(out, measurements, None)
        raise _BadInput(f"sweep.logs: {e}") from None
    _print_figures(out, measurements, summary)
    _print_summary(out, summary, settings.skip_first, settings.warmup_by)
    if probe_dir is not None:
        _print_probe(out, probe_dir, args, summary)
    return 0


def _probe_dir(args: argparse.Namespace) -> Path | None:
    """--probe, else the probe-N dir beside a trial's command-N.log; None where there is none."""
    if args.probe:
        if not Path(args.probe).is_dir():
            raise _BadInput(f"sweep.logs: --probe {args.probe!r} is not a directory")
        return Path(args.probe)
    log = Path(args.file)
    beside = log.with_name(log.stem.replace("command", "probe", 1)) if log.stem.startswith("command-") else None
    return beside if beside is not None and beside.is_dir() else None


def _print_probe(out: TextIO, record_dir: Path, args: argparse.Namespace, log: ThroughputSummary | None) -> None:
    """The probe's figures for the same run (samples over the wall time of its timed steps), and whether the log's agree."""
    from sweep.core.stats import throughput_summary
    from sweep.probe import read_probe

    report = read_probe(record_dir)
    print(file=out)
    if not report.armed:
        print(f"probe ({record_dir}): never armed (the command did not import torch); the log's figures stand alone", file=out)
        return
    times = [t for t in report.step_times_s[args.probe_warmup :] if t > 0]
    peak = "" if report.peak_bytes is None else f"; peak {report.peak_bytes / 1024**3:.3f} GiB at step {report.peak_step}"
    print(f"probe ({record_dir}): {len(report.ranks)} rank(s), {len(report.step_times_s)} step(s), first {args.probe_warmup} not timed{peak}", file=out)
    if not times or args.global_batch_size is None:
        why = "no timed step" if not times else "give --global-batch-size for its throughput"
        print(f"probe throughput: unknown ({why})", file=out)
        return
    value, low, high = throughput_summary(times, args.global_batch_size)
    factor = args.tokens_per_sample if log is not None and log.unit == "tokens/s" and args.tokens_per_sample else 1.0
    unit = "tokens/s" if factor != 1.0 else "samples/s"
    print(f"probe throughput: {value * factor:,.1f} {unit}, 95% interval [{low * factor:,.1f}, {high * factor:,.1f}] over {len(times)} step(s)", file=out)
    if log is None or log.unit != unit:
        return
    # Like with like: the log's figure is a median of its per-step rates, so it is set against the probe's median step
    # (and its order-statistic interval), not against the wall-time figure, which counts every slow step (issue 50).
    like, like_low, like_high = (factor * x for x in _median_step_figure(times, args.global_batch_size))
    verdict = agreement(log, (like, like_low, like_high))
    print(f"log vs probe: {log.value:,.1f} vs {like:,.1f} {unit} (the probe's median step): {verdict}", file=out)


def _median_step_figure(times: Sequence[float], samples_per_step: int) -> tuple[float, float, float]:
    """(the median step's rate, its 95% order-statistic interval): the statistic a log's median of per-step rates is."""
    from sweep.core.stats import median, median_interval_ranks

    ordered = sorted(times)
    lo_rank, hi_rank = median_interval_ranks(len(ordered))
    return samples_per_step / median(ordered), samples_per_step / ordered[hi_rank], samples_per_step / ordered[lo_rank]


def agreement(log: ThroughputSummary, probe: tuple[float, float, float]) -> str:
    """Whether the log's median agrees with the probe's (median, low, high): a gap over DISAGREE_FRACTION
    is flagged only when it is evidence, that is when a median lies outside the other's 95% interval.
    On a loaded host the two clocks bracket a step a moment apart, and a stall between the marks can
    move two honest medians a few percent apart (docs/trainers.md); both inside the other's interval
    is then what the figures can say."""
    value, low, high = probe
    gap = abs(log.value - value) / value
    if gap <= DISAGREE_FRACTION:
        return f"agree ({gap:.1%} apart; flagged above {DISAGREE_FRACTION:.0%})"
    log_low, log_high = (None, None) if log.interval_note else (log.low, log.high)  # an interval the log's figures can back
    if log_low is not None and log_high is not None and low <= log.value <= high and log_low <= value <= log_high:
        return (f"too noisy to tell ({gap:.1%} apart, but each median is inside the other's 95% interval: "
                "run it again on a quieter machine)")
    return f"DISAGREE ({gap:.1%} apart; flagged above {DISAGREE_FRACTION:.0%})"


def _print_figures(out: TextIO, measurements: Sequence, summary: ThroughputSummary | None) -> None:
    roles = summary.figures if summary else None
    unit_out = summary.unit if summary else ""
    print(f"{'line':>6}  {'rank':>4}  {'epoch':>5}  {'step':>7}  {'value':>12}  {'unit':<13}  {'counts as':<9}  {unit_out}", file=out)
    for i, m in enumerate(measurements):
        rank = "" if m.rank is None else str(m.rank)
        epoch = "" if m.epoch is None else str(m.epoch)
        step = "" if m.step is None else str(m.step)
        unit = m.unit + (" /GPU" if m.per_device else "")
        role, converted, note = ("", "", "")
        if roles is not None:
            f = roles[i]
            role = f.role
            converted = "" if f.throughput is None else f"{f.throughput:,.1f}"
            note = f"  ({f.note})" if f.role == IGNORED and f.note else ""
        print(f"{m.line:>6}  {rank:>4}  {epoch:>5}  {step:>7}  {m.value:>12,.6g}  {unit:<13}  {role:<9}  {converted}{note}", file=out)


def _print_summary(out: TextIO, s: ThroughputSummary, skip: int, by: str) -> None:
    print(file=out)
    print(f"{len(s.figures)} figure(s); warm-up: first {skip} {'epoch(s)' if by == 'epochs' else 'figure(s)'}", file=out)
    if s.low is None or s.high is None:
        interval = f"95% interval unknown ({s.interval_note})"
    else:
        interval = f"95% interval [{s.low:,.1f}, {s.high:,.1f}]"
        if s.interval_note:
            interval += f" ({s.interval_note})"
    print(f"throughput: {s.value:,.1f} {s.unit}, {interval}", file=out)
    print(f"from: {s.note}", file=out)


if __name__ == "__main__":
    sys.exit(main())
