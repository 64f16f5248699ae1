"""The log formats sweep reads throughput from, chosen by a workload's `parser:` config."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from sweep.parsers.lines import LineParser, Measurement, to_float, to_int
from sweep.parsers.presets import PRESET_PARSERS
from sweep.parsers.throughput import FIGURE_UNITS, SAMPLES_PER_S

# --- Myrtle.ai caiman-asr (dllogger) -----------------------------------------------

_DLL = re.compile(r"(?<![A-Za-z])DLL(L?) ")
# Indices are capped at 18 digits: int() refuses very long digit strings, and no real index is one.
_INDEX = re.compile(r"^(epoch|iter|step)\s+(\d{1,18})(?:\s*/\s*\S+)?$", re.IGNORECASE)
_METRIC = re.compile(
    r"^(?P<key>.+?)\s*(?::\s*|\s+)"
    r"(?P<val>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
    r"(?:\s+(?P<unit>[^\s\d]\S*))?$"
)
# Samples (utterances) per second under every name releases used:
# "avg train utts/s" (up to v1.11), "train_avg_throughput-audio-samples-per-sec"
# and per step "train_throughput-audio-samples-per-sec" (v1.12 on). Audio
# seconds per second ("...-audio-secs-per-sec") is a different unit and must not match.
_THROUGHPUT_KEY = re.compile(r"(?:samples|utts|utterances)(?:[-_ ]?per[-_ ]?sec(?:ond)?|/s(?:ec)?)$", re.IGNORECASE)
_TOOK_KEY = re.compile(r"(?:^|[_ ])took$", re.IGNORECASE)
# Validation runs inside the epoch and logs its own figures; they are not training throughput.
_EVAL_KEY = re.compile(r"^(?:dev|val|valid|validation|eval|test)(?:$|[_ ])", re.IGNORECASE)


class MyrtleParser(LineParser):
    """Myrtle.ai RNN-T dllogger lines: stdout `DLL ...` (both releases' formats) and nvlog.json `DLLL {...}`."""

    needle = b"DLL"

    def parse_line(self, text: str) -> Measurement | None:
        m = _DLL.search(text)
        if m is None:
            return None
        body = text[m.end():]
        return self._parse_json(body) if m.group(1) else self._parse_stdout(body)

    def _parse_stdout(self, body: str) -> Measurement | None:
        # "<timestamp> - epoch    2 | iter   10/100 | step   20 | key :  1.5 | key2 3 s"
        _, dash, rest = body.partition(" - ")
        if not dash:
            return None
        segments = [s.strip() for s in rest.split("|")]
        index: dict[str, int] = {}
        if segments[0].startswith("("):  # dllogger's default step format: a tuple, "(2, 10, 100, 20)"
            index = _tuple_index([int(n) for n in re.findall(r"\d{1,18}", segments[0])])
        values: dict[str, str] = {}
        for seg in segments:
            if len(seg) > 512:  # real fields are short; a huge one could make _METRIC backtrack for ages
                continue
            im = _INDEX.match(seg)
            if im:
                index[im.group(1).lower()] = int(im.group(2))
                continue
            mm = _METRIC.match(seg)
            if mm:
                values.setdefault(mm.group("key").strip(), mm.group("val"))
        step = index.get("step", index.get("iter"))
        return _measurement(values, index.get("epoch"), step)

    def _parse_json(self, body: str) -> Measurement | None:
        try:
            record = json.loads(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
            return None  # METADATA records and foreign JSON
        data: dict[str, Any] = record["data"]
        raw_step = record.get("step")
        epoch = step = None
        if isinstance(raw_step, list):
            index = _tuple_index([to_int(v) for v in raw_step])
            epoch, step = index.get("epoch"), index.get("step", index.get("iter"))
        elif isinstance(raw_step, dict):
            epoch = to_int(raw_step.get("epoch"))
            step = to_int(raw_step.get("step", raw_step.get("iter")))
        elif isinstance(raw_step, (int, float)):
            # A bare number: an epoch for epoch averages, else a step.
            if any("avg" in k for k in data):
                epoch = to_int(raw_step)
            else:
                step = to_int(raw_step)
        if epoch is None:
            epoch = to_int(data.get("epoch", record.get("epoch")))
        return _measurement(data, epoch, step)


def _tuple_index(values: list[int | None]) -> dict[str, int]:
    """caiman-asr's step tuple: (epoch,), (epoch, iter, iters_per_epoch, step)."""
    index: dict[str, int] = {}
    for name, pos in (("epoch", 0), ("iter", 1), ("step", 3)):
        if len(values) > pos and values[pos] is not None:
            index[name] = values[pos]  # type: ignore[assignment]
    return index


def _measurement(values: Mapping[str, Any], epoch: int | None, step: int | None) -> Measurement | None:
    throughput = took = None
    for key, value in values.items():
        if not isinstance(key, str) or _EVAL_KEY.match(key):
            continue
        if throughput is None and _THROUGHPUT_KEY.search(key):
            throughput = to_float(value)
        elif took is None and _TOOK_KEY.search(key):
            took = to_float(value)
    if throughput is None:
        return None
    if step is None:
        return Measurement(throughput, epoch=epoch, epoch_time_s=took)
    return Measurement(throughput, epoch=epoch, step=step, step_time_s=took)


# --- a user's regex ----------------------------------------------------------------

_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


class RegexParser(LineParser):
    """Lines matching a user pattern with named groups: throughput (required), step, epoch, step_time.

    The throughput group holds a figure in `unit` (samples/s unless told: tokens/s, ms/step, ...). Without a `step` group
    (and without an `epoch` group) each matching line is one step's figure, numbered in the order the lines come: a
    trainer that prints its rate once a step is read as per-step figures (their median), not as averages, of which only
    one would count (issue 50: that one put the log 25% from the probe). With `epoch` alone, a line is an epoch's average.
    """

    def __init__(self, pattern: str, step_time_unit: str = "s", unit: str = SAMPLES_PER_S, per_device: bool = False) -> None:
        super().__init__()
        self._unit, self._per_device = _figure_unit(unit, per_device)
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"parser.pattern must be a non-empty regex string, got {pattern!r}")
        try:
            self._rx = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"parser.pattern {pattern!r} does not compile: {e}") from None
        if "throughput" not in self._rx.groupindex:
            raise ValueError(
                f"parser.pattern {pattern!r} has no named group 'throughput'; "
                r"mark the samples/s figure with (?P<throughput>[0-9.]+)"
            )
        if step_time_unit not in _TIME_UNITS:
            raise ValueError(f"parser.step_time_unit={step_time_unit!r} is not one of {', '.join(_TIME_UNITS)}")
        self._scale = _TIME_UNITS[step_time_unit]
        self._groups = set(self._rx.groupindex)
        self._numbers_steps = "step" not in self._groups and "epoch" not in self._groups
        self._lines_matched = 0  # the step a line without a step group is numbered (from 1)

    def parse_line(self, text: str) -> Measurement | None:
        m = self._rx.search(text)
        if m is None:
            return None
        throughput = to_float(m.group("throughput"))
        if throughput is None:
            return None
        step_time = to_float(m.group("step_time")) if "step_time" in self._groups else None
        step = to_int(m.group("step")) if "step" in self._groups else None
        if self._numbers_steps:
            self._lines_matched += 1
            step = self._lines_matched
        return Measurement(
            throughput,
            epoch=to_int(m.group("epoch")) if "epoch" in self._groups else None,
            step=step,
            step_time_s=None if step_time is None else step_time * self._scale,
            unit=self._unit,
            per_device=self._per_device,
        )


# --- JSON lines ----------------------------------------------------------------------

_DECODER = json.JSONDecoder()


class JsonlParser(LineParser):
    """JSON-lines logs; the throughput at a dotted key path. Text before the first '{' is ignored."""

    needle = b"{"

    def __init__(
        self,
        key: str,
        step_key: str | None = None,
        epoch_key: str | None = None,
        step_time_key: str | None = None,
        unit: str = SAMPLES_PER_S,
        per_device: bool = False,
    ) -> None:
        super().__init__()
        self._unit, self._per_device = _figure_unit(unit, per_device)
        self._key = _key_path("key", key)
        self._step = _key_path("step_key", step_key) if step_key is not None else None
        self._epoch = _key_path("epoch_key", epoch_key) if epoch_key is not None else None
        self._step_time = _key_path("step_time_key", step_time_key) if step_time_key is not None else None

    def parse_line(self, text: str) -> Measurement | None:
        start = text.find("{")
        if start < 0:
            return None
        try:
            record, _ = _DECODER.raw_decode(text, start)  # raw_decode: trailing text is fine
        except (ValueError, RecursionError):
            return None
        if not isinstance(record, dict):
            return None
        throughput = to_float(_lookup(record, self._key))
        if throughput is None:
            return None
        return Measurement(
            throughput,
            epoch=to_int(_lookup(record, self._epoch)) if self._epoch else None,
            step=to_int(_lookup(record, self._step)) if self._step else None,
            step_time_s=to_float(_lookup(record, self._step_time)) if self._step_time else None,
            unit=self._unit,
            per_device=self._per_device,
        )


def _figure_unit(unit: Any, per_device: Any) -> tuple[str, bool]:
    if unit not in FIGURE_UNITS:
        raise ValueError(f"parser.unit={unit!r} is not one of {', '.join(FIGURE_UNITS)}")
    if not isinstance(per_device, bool):
        raise ValueError(f"parser.per_device={per_device!r} must be true or false")
    return unit, per_device


def _key_path(name: str, value: Any) -> tuple[str, ...]:
    parts = tuple(value.split(".")) if isinstance(value, str) else ()
    if not parts or not all(parts):
        raise ValueError(f"parser.{name} must be a dotted key path like metrics.samples_per_sec, got {value!r}")
    return parts


def _lookup(obj: Any, parts: tuple[str, ...]) -> Any:
    """obj at a dotted path; a key that itself contains dots ("perf.samples_per_sec") also matches."""
    if not parts:
        return obj
    if isinstance(obj, dict):
        for n in range(len(parts), 0, -1):  # longest literal key first
            key = ".".join(parts[:n])
            if key in obj:
                found = _lookup(obj[key], parts[n:])
                if found is not None:
                    return found
        return None
    if isinstance(obj, list) and parts[0].isdigit() and int(parts[0]) < len(obj):
        return _lookup(obj[int(parts[0])], parts[1:])
    return None


# --- construction from config ----------------------------------------------------------

# type -> (class, required keys, optional keys)
PARSER_TYPES: dict[str, tuple[Callable[..., LineParser], tuple[str, ...], tuple[str, ...]]] = {
    "jsonl": (JsonlParser, ("key",), ("step_key", "epoch_key", "step_time_key", "unit", "per_device")),
    "myrtle": (MyrtleParser, (), ()),
    "regex": (RegexParser, ("pattern",), ("step_time_unit", "unit", "per_device")),
    **{name: (cls, (), ()) for name, cls in PRESET_PARSERS.items()},
}
DEFAULT_PARSER_TYPE = "myrtle"
# Keys of a `parser:` section about turning figures into a trial's throughput, not about
# reading lines: every type takes them (see parser_settings); make_parser leaves them alone.
COMMON_KEYS = ("skip_first", "stop_after", "tokens_per_sample", "throughput_unit")


def valid_types() -> str:
    """The parser types for an error message: the general formats, then the framework presets."""
    formats = sorted(k for k in PARSER_TYPES if k not in PRESET_PARSERS)
    return f"{', '.join(formats)}, and the framework presets {', '.join(sorted(PRESET_PARSERS))}"


def make_parser(spec: Mapping[str, Any] | None) -> LineParser:
    """A fresh parser from a `parser:` config section; an empty section means Myrtle's format.

    Raises ValueError, one line, naming the bad type or key and the valid ones.
    """
    valid = valid_types()
    if spec is None or (isinstance(spec, Mapping) and len(spec) == 0):
        spec = {"type": DEFAULT_PARSER_TYPE}
    if not isinstance(spec, Mapping):
        raise ValueError(f"parser: expected a mapping with a 'type' key ({valid}), got {type(spec).__name__}")
    kind = spec.get("type")
    if kind is None:
        raise ValueError(f"parser: 'type' is missing; valid types: {valid}")
    if kind not in PARSER_TYPES:
        raise ValueError(f"parser.type={kind!r} is not supported; valid types: {valid}")
    cls, required, optional = PARSER_TYPES[kind]
    options = {str(k): v for k, v in spec.items() if k != "type" and k not in COMMON_KEYS and v is not None}
    unknown = sorted(set(options) - set(required) - set(optional))
    if unknown:
        allowed = ", ".join(required + optional) or "none"
        raise ValueError(
            f"parser: unknown key(s) {', '.join(unknown)} for type {kind!r}; valid keys: {allowed}"
            f" (and {', '.join(COMMON_KEYS)} for every type)"
        )
    missing = [k for k in required if k not in options]
    if missing:
        raise ValueError(f"parser.type={kind!r} needs {', '.join(missing)}")
    return cls(**options)
