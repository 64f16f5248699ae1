"""A workload's whole `parser:` section, validated once: how to read the log and how to summarise it.

    settings = parser_settings(workload.parser)      # ValueError, one line, on bad input
    parser = settings.make_parser()                  # fresh LineParser (feed/close), as make_parser
    ...
    summary = settings.summarize(measurements, global_batch_size=256, num_devices=8, accum=4)
    summary.value, summary.low, summary.high, summary.unit  # -> throughput, throughput_low/high, throughput_unit
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sweep.parsers.formats import COMMON_KEYS, DEFAULT_PARSER_TYPE, make_parser
from sweep.parsers.lines import LineParser, Measurement
from sweep.parsers.presets import PRESETS, Preset
from sweep.parsers.throughput import (
    THROUGHPUT_UNITS,
    BatchContext,
    ThroughputSummary,
    summarize,
)

# The built-in formats' warm-up: one epoch (or, in a log that numbers no epochs, one figure).
DEFAULT_SKIP_FIRST = 1


@dataclass(frozen=True)
class ParserSettings:
    type: str  # parser.type: a preset name, or regex / jsonl
    parser_spec: dict[str, Any]  # what make_parser takes (type and its own keys)
    preset: Preset | None  # the framework preset, when type names one (myrtle included)
    skip_first: int  # warm-up figures (or epochs, see warmup_by) before measuring
    warmup_by: str  # "figures" or "epochs"
    stop_after: int | None  # stop the trial once this many figures follow the warm-up
    tokens_per_sample: float | None  # set by the user; turns samples into tokens
    throughput_unit: str | None  # the unit to record; None: tokens/s for token figures, else samples/s
    prefer: tuple[str, ...] = field(default=())  # figure units, preferred first

    def make_parser(self) -> LineParser:
        return make_parser(self.parser_spec)

    def context(self, *, global_batch_size: int | None = None, num_devices: int = 1, accum: int | None = None) -> BatchContext:
        return BatchContext(global_batch_size, num_devices, accum, self.tokens_per_sample)

    def summarize(
        self,
        measurements: Sequence[Measurement],
        *,
        global_batch_size: int | None = None,
        num_devices: int = 1,
        accum: int | None = None,
    ) -> ThroughputSummary:
        """The trial's throughput from its figures; ThroughputError (a ValueError, one line) when there is none."""
        return summarize(
            measurements,
            self.context(global_batch_size=global_batch_size, num_devices=num_devices, accum=accum),
            skip_first=self.skip_first,
            prefer=self.prefer,
            warmup_by=self.warmup_by,
            unit=self.throughput_unit,
        )


def parser_settings(spec: Mapping[str, Any] | None) -> ParserSettings:
    """Validate a `parser:` section (type, its keys, and the common keys); ValueError, one line."""
    spec = dict(spec or {"type": DEFAULT_PARSER_TYPE})
    spec.setdefault("type", DEFAULT_PARSER_TYPE)
    common = {k: spec.pop(k) for k in COMMON_KEYS if k in spec}
    make_parser(spec)  # validates type and keys
    kind = str(spec["type"])
    preset = PRESETS.get(kind)
    skip = common.get("skip_first")
    if skip is None:
        skip = preset.skip_first if preset else DEFAULT_SKIP_FIRST
    if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
        raise ValueError(f"parser.skip_first={skip!r} must be a whole number >= 0")
    stop_after = common.get("stop_after")
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int) or stop_after < 1):
        raise ValueError(f"parser.stop_after={stop_after!r} must be a whole number >= 1")
    tps = common.get("tokens_per_sample")
    if tps is not None and (
        isinstance(tps, bool) or not isinstance(tps, (int, float)) or not math.isfinite(tps) or not tps > 0
    ):
        raise ValueError(f"parser.tokens_per_sample={tps!r} must be a positive number (tokens in one sample), not inf or nan")
    unit = common.get("throughput_unit")
    if unit is not None and unit not in THROUGHPUT_UNITS:
        raise ValueError(f"parser.throughput_unit={unit!r} is not one of {', '.join(THROUGHPUT_UNITS)}")
    return ParserSettings(
        type=kind,
        parser_spec=spec,
        preset=preset,
        skip_first=skip,
        warmup_by=preset.warmup_by if preset else "epochs",
        stop_after=stop_after,
        tokens_per_sample=float(tps) if tps is not None else None,
        throughput_unit=unit,
        prefer=preset.units if preset else (),
    )
