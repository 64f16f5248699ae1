"""Check a parser against a real log before spending cluster hours on it.

    python -m sweep.logs train.log --parser nanogpt --global-batch-size 480 --num-devices 8

Prints every figure the parser finds (step or epoch, value, unit, and whether it is warm-up,
measured or ignored), then the throughput a trial would record: the median, its 95%
interval and the unit. Bad input (unknown parser, unreadable file, no figures, a figure
that needs a flag not given): one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from sweep.errors import UsageError as _BadInput
from sweep.parsers import PRESETS, ThroughputSummary, parser_settings, scan_file
from sweep.parsers.formats import PARSER_TYPES, valid_types
from sweep.parsers.throughput import IGNORED, ThroughputError

BAD_INPUT = 2


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
    if not measurements:
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
    return 0


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
