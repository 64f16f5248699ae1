"""From the figures a log prints to the throughput a trial records (pure).

Trainers print samples/s, tokens/s, a step time, or a progress-bar rate, globally
or per device. Each figure is converted to samples/s or tokens/s with what the
trial knows (global batch, device count, accumulation, tokens per sample), the
first `skip_first` figures are warm-up, and the rest give the median and its
distribution-free 95% interval (core/stats.py), whatever the unit.

    ctx = BatchContext(global_batch_size=256, num_devices=8, accum=4)
    summary = summarize(measurements, ctx, skip_first=5, prefer=("ms/step",))
    summary.value, summary.low, summary.high, summary.unit   # one figure: the noise floor, see interval()
    for f in summary.figures: f.role, f.throughput            # every figure, and what it counted as
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from sweep.core.confidence import DEFAULT_SE
from sweep.core.stats import median, median_interval_coverage, median_interval_ranks
from sweep.errors import ThroughputError
from sweep.parsers.lines import Measurement

SAMPLES_PER_S = "samples/s"
TOKENS_PER_S = "tokens/s"
THROUGHPUT_UNITS = (SAMPLES_PER_S, TOKENS_PER_S)  # what a trial records (throughput_unit)

# What a log may print. "step" is one optimizer step (the global batch); "batch" is one
# micro-batch on every device (a progress bar that counts dataloader batches).
S_PER_STEP, MS_PER_STEP, STEPS_PER_S = "s/step", "ms/step", "steps/s"
S_PER_BATCH, BATCHES_PER_S = "s/batch", "batches/s"
FIGURE_UNITS = (SAMPLES_PER_S, TOKENS_PER_S, S_PER_STEP, MS_PER_STEP, STEPS_PER_S, S_PER_BATCH, BATCHES_PER_S)

# One figure has no spread: its interval is the noise floor, +-10% (x / 1.103 to x * 1.103). It is
# confidence.py's DEFAULT_SE (5% standard error in log throughput, a 95% half-width of 1.96 x 5%), larger
# than the run-to-run spread measured in fresh processes on one H100 (0.3% at scale, 8% for a tiny model).
NOISE_FLOOR_SE = DEFAULT_SE
NOISE_FLOOR_FACTOR = math.exp(1.96 * NOISE_FLOOR_SE)
ONE_FIGURE_NOTE = f"one figure only: interval widened by the +-{NOISE_FLOOR_FACTOR - 1:.0%} noise floor, not measured"

# Roles of a figure in the summary.
MEASURED, WARMUP, IGNORED = "measured", "warm-up", "ignored"


@dataclass(frozen=True)
class BatchContext:
    """What the trial knows that a log line may not say."""

    global_batch_size: int | None = None  # samples per optimizer step, all devices
    num_devices: int = 1  # data-parallel devices: scales per-device figures
    accum: int | None = None  # micro-batches per optimizer step: for figures counted per micro-batch
    tokens_per_sample: float | None = None  # turns samples into tokens; the log's own figure wins

    def __post_init__(self) -> None:
        for name in ("global_batch_size", "num_devices", "accum", "tokens_per_sample"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
                raise ThroughputError(f"{name}={v!r} must be a positive number")


@dataclass(frozen=True)
class Figure:
    """One figure of the log and what the summary made of it."""

    measurement: Measurement
    role: str  # MEASURED, WARMUP or IGNORED
    throughput: float | None  # converted to the summary's unit; None when ignored or not convertible
    note: str = ""  # why it was ignored


@dataclass(frozen=True)
class ThroughputSummary:
    """The throughput a trial records."""

    value: float  # median of the measured figures
    low: float | None  # 95% interval of the median; from one figure, the noise floor (see interval_note)
    high: float | None
    unit: str  # "samples/s" or "tokens/s"
    measured: int  # figures the median is over
    warmup: int  # figures skipped as warm-up
    after_warmup: bool  # False: no figure came after the warm-up, so the value includes it
    note: str  # one line: which figures were used
    interval_note: str = ""  # why the interval is unknown or below 95%; "" when it is a full 95% interval
    figures: tuple[Figure, ...] = field(default=(), repr=False)


def output_unit(measurement_unit: str, ctx: BatchContext, want: str | None = None) -> str:
    """The unit a trial records: as asked, else tokens/s when the log counts tokens or tokens_per_sample is set."""
    if want is not None:
        if want not in THROUGHPUT_UNITS:
            raise ThroughputError(f"throughput unit {want!r} is not one of {', '.join(THROUGHPUT_UNITS)}")
        return want
    return TOKENS_PER_S if measurement_unit == TOKENS_PER_S or ctx.tokens_per_sample else SAMPLES_PER_S


def convert(m: Measurement, ctx: BatchContext, unit: str) -> float:
    """One figure as a global rate in `unit` (samples/s or tokens/s). Raises ThroughputError, one line."""
    if m.unit not in FIGURE_UNITS:
        raise ThroughputError(f"figure unit {m.unit!r} is not one of {', '.join(FIGURE_UNITS)}")
    value = float(m.throughput)
    gbs = m.global_batch_size or ctx.global_batch_size
    if m.unit in (SAMPLES_PER_S, TOKENS_PER_S):
        rate, counts = value, m.unit
    else:
        if gbs is None:
            raise ThroughputError(f"a figure in {m.unit} needs the global batch size (--global-batch-size); the log does not print it")
        if m.unit in (S_PER_BATCH, BATCHES_PER_S):
            if ctx.accum is None:
                raise ThroughputError(f"a figure in {m.unit} counts micro-batches and needs the accumulation steps (accum)")
            per_event = gbs / ctx.accum
        else:
            per_event = float(gbs)
        if m.unit in (S_PER_STEP, MS_PER_STEP, S_PER_BATCH):
            seconds = value / 1000.0 if m.unit == MS_PER_STEP else value
            if seconds <= 0:
                raise ThroughputError(f"a step time of {value:g} {m.unit} is not positive")
            rate = per_event / seconds
        else:
            rate = per_event * value
        counts = SAMPLES_PER_S
    if m.per_device:
        rate *= ctx.num_devices
    if counts == unit:
        return rate
    tps = m.tokens_per_sample or ctx.tokens_per_sample
    if tps is None:
        raise ThroughputError(f"turning {counts} into {unit} needs tokens_per_sample (--tokens-per-sample); the log does not print it")
    return rate * tps if unit == TOKENS_PER_S else rate / tps


def interval(values: Sequence[float], level: float = 0.95) -> tuple[float | None, float | None, str]:
    """(low, high, note): the order-statistic interval of the median.

    One figure (an epoch or run average) has no spread to build an interval from. It is not
    "[x, x]": it is widened by the noise floor, x / f to x * f with f = exp(1.96 * NOISE_FLOOR_SE),
    the same standard error the confidence score gives a result with no spread of its own, so
    result.json, the table, trials.csv and the confidence score all read one consistent figure.
    """
    n = len(values)
    if n == 0:
        raise ThroughputError("no figures")
    if n == 1:
        x = float(values[0])
        return x / NOISE_FLOOR_FACTOR, x * NOISE_FLOOR_FACTOR, ONE_FIGURE_NOTE
    s = sorted(values)
    lo, hi = median_interval_ranks(n, level)
    coverage = median_interval_coverage(n, lo)
    note = "" if coverage >= level else f"only {n} figures: the interval is their range, {coverage:.0%} coverage, not 95%"
    return s[lo], s[hi], note


def summarize(
    measurements: Sequence[Measurement],
    ctx: BatchContext,
    *,
    skip_first: int = 0,
    prefer: Sequence[str] = (),
    warmup_by: str = "figures",
    unit: str | None = None,
) -> ThroughputSummary:
    """The throughput a trial records from every figure its log printed.

    - One rank's figures: the lowest rank when a launcher prefixed lines with ranks.
    - One kind of figure: the first unit in `prefer` that has figures after the warm-up,
      else the first unit found (a preset reads a step time before a bar rate, say).
    - A step printed twice (a progress bar redrawn) counts once: its last figure.
    - Warm-up: the first `skip_first` figures (warmup_by="figures"), or every figure of the
      first `skip_first` epochs in the order they appear (warmup_by="epochs", Myrtle's rule).
    - Per-step figures are preferred to averages (no step) whenever there are any after the warm-up;
      an average counts only without them, alone: the epoch after the warm-up (sweep.parsers.select_measurement).

    Raises ThroughputError (one line) when there are no figures or one cannot be converted.
    """
    if skip_first < 0:
        raise ThroughputError(f"skip_first={skip_first} must be >= 0")
    if warmup_by not in ("figures", "epochs"):
        raise ThroughputError(f"warmup_by={warmup_by!r} must be 'figures' or 'epochs'")
    if not measurements:
        raise ThroughputError("no throughput figures in the log")
    roles: dict[int, tuple[str, str]] = {}  # index -> (role, note)

    ranks = sorted({m.rank for m in measurements if m.rank is not None})
    keep_rank = ranks[0] if ranks else None
    pool = []
    for i, m in enumerate(measurements):
        if ranks and m.rank != keep_rank:
            roles[i] = (IGNORED, f"rank {m.rank}: rank {keep_rank}'s figures are used")
        else:
            pool.append(i)

    # Later figures for the same step replace earlier ones (tqdm redraws a bar many times a step).
    last_of: dict[tuple, int] = {}
    for i in pool:
        m = measurements[i]
        if m.step is not None:
            last_of[(m.unit, m.epoch, m.step)] = i
    deduped = []
    for i in pool:
        m = measurements[i]
        if m.step is not None and last_of[(m.unit, m.epoch, m.step)] != i:
            roles[i] = (IGNORED, "redrawn: a later figure for the same step counts")
        else:
            deduped.append(i)

    units_found = list(dict.fromkeys(measurements[i].unit for i in deduped))
    order = [u for u in prefer if u in units_found] + [u for u in units_found if u not in prefer]
    chosen_unit, chosen, warm = order[0], [], []
    for u in order:
        of_unit = [i for i in deduped if measurements[i].unit == u]
        w, c = _split_warmup(of_unit, measurements, skip_first, warmup_by)
        if c:
            chosen_unit, chosen, warm = u, c, w
            break
    else:
        of_unit = [i for i in deduped if measurements[i].unit == chosen_unit]
        warm, chosen = _split_warmup(of_unit, measurements, skip_first, warmup_by)
    for i in deduped:
        if measurements[i].unit != chosen_unit:
            roles[i] = (IGNORED, f"a {measurements[i].unit} figure: the {chosen_unit} figures are used")
    for i in warm:
        roles[i] = (WARMUP, "")

    after_warmup = bool(chosen)
    if not chosen:  # nothing after the warm-up: the last warm-up figure, flagged
        chosen, warm = [warm[-1]], warm[:-1]
    steps = [i for i in chosen if measurements[i].step is not None]
    averages = [i for i in chosen if measurements[i].step is None]
    # Per-step figures whenever there are any: an average spans what the steps do not (caiman-asr's
    # epoch average includes validation, HF's run average its evaluations and start-up). Few steps
    # give a wide interval, which the score then carries; an average would give a narrow wrong one.
    if steps:
        used, what = steps, "per-step figures"
    else:
        used, what = [averages[0] if after_warmup else averages[-1]], "average"
    for i in chosen:
        if i not in used:
            roles[i] = (IGNORED, "per-step figures are used" if what == "per-step figures" else "another average is used")

    out_unit = output_unit(chosen_unit, ctx, unit)
    values = []
    for i in used:
        values.append(convert(measurements[i], ctx, out_unit))
        roles[i] = (MEASURED, "")
    value = median(values)
    low, high, interval_note = interval(values)
    first = measurements[used[0]]
    where = f"line {first.line}" if len(used) == 1 else f"lines {first.line}-{measurements[used[-1]].line}"
    if what == "average":
        what = f"epoch {first.epoch} average" if first.epoch is not None else "run average"
    note = f"median of {len(used)} {what} in {chosen_unit} ({where}); skipped {len(warm)} warm-up figure(s)"
    if not after_warmup:
        note = f"{what} in {chosen_unit} ({where}) includes warm-up: no figure after the {skip_first} to skip"
    figures = tuple(
        Figure(
            m,
            roles[i][0],
            _try_convert(m, ctx, out_unit) if roles[i][0] != IGNORED or m.unit == chosen_unit else None,
            roles[i][1],
        )
        for i, m in enumerate(measurements)
    )
    return ThroughputSummary(
        value=value, low=low, high=high, unit=out_unit, measured=len(used), warmup=len(warm),
        after_warmup=after_warmup, note=note, interval_note=interval_note, figures=figures,
    )


def _split_warmup(indices: list[int], ms: Sequence[Measurement], skip: int, by: str) -> tuple[list[int], list[int]]:
    if by == "figures":
        return indices[:skip], indices[skip:]
    epochs = list(dict.fromkeys(ms[i].epoch for i in indices if ms[i].epoch is not None))
    warm_epochs = set(epochs[:skip])
    if not epochs:  # no epoch numbers: count figures instead
        return indices[:skip], indices[skip:]
    warm = [i for i in indices if ms[i].epoch in warm_epochs or ms[i].epoch is None]
    return warm, [i for i in indices if i not in warm]


def _try_convert(m: Measurement, ctx: BatchContext, unit: str) -> float | None:
    try:
        return convert(m, ctx, unit)
    except ThroughputError:
        return None
