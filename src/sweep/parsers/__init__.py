"""Reading trial logs: throughput figures, and why a trial failed.

    settings = parser_settings(workload.parser)  # {"type": "myrtle"|"nanogpt"|...|"regex"|"jsonl", ...}
    parser = settings.make_parser()              # or make_parser(spec) for the line parser alone
    tail = LogTail(log_path)
    while running:
        for m in parser.feed(tail.read_new()): ...
    measurements += parser.close()
    chosen = select_measurement(measurements)   # second epoch, else the last figure
    summary = settings.summarize(measurements, global_batch_size=..., num_devices=..., accum=...)
                                                # median + 95% interval (one figure: the noise floor) in samples/s or tokens/s
    verdict = classify_failure(read_tail(log_path), exit_code)

Pure code: no torch, no hydra.
"""

from __future__ import annotations

from sweep.parsers.classify import (
    DEFAULT_PHASE_PATTERNS,
    MAX_REASON_CHARS,
    OOM_PEAK_FRACTION,
    Classification,
    KillEvidence,
    classify_failure,
    compile_phase_patterns,
    no_throughput_reason,
    one_line,
)
from sweep.parsers.formats import (
    COMMON_KEYS,
    DEFAULT_PARSER_TYPE,
    PARSER_TYPES,
    JsonlParser,
    MyrtleParser,
    RegexParser,
    make_parser,
)
from sweep.parsers.lines import (
    MAX_LINE_BYTES,
    LineParser,
    LineSplitter,
    Measurement,
    Selection,
    select_measurement,
    split_rank_prefix,
)
from sweep.parsers.presets import PRESETS, Preset, get_preset
from sweep.parsers.settings import ParserSettings, parser_settings
from sweep.parsers.tail import (
    DEFAULT_CHUNK,
    LogTail,
    Parser,
    iter_file,
    read_tail,
    scan_file,
)
from sweep.parsers.throughput import (
    FIGURE_UNITS,
    SAMPLES_PER_S,
    THROUGHPUT_UNITS,
    TOKENS_PER_S,
    BatchContext,
    Figure,
    ThroughputSummary,
    convert,
    summarize,
)

__all__ = [
    "COMMON_KEYS",
    "DEFAULT_CHUNK",
    "DEFAULT_PARSER_TYPE",
    "DEFAULT_PHASE_PATTERNS",
    "FIGURE_UNITS",
    "MAX_LINE_BYTES",
    "MAX_REASON_CHARS",
    "OOM_PEAK_FRACTION",
    "PARSER_TYPES",
    "PRESETS",
    "SAMPLES_PER_S",
    "THROUGHPUT_UNITS",
    "TOKENS_PER_S",
    "BatchContext",
    "Classification",
    "Figure",
    "JsonlParser",
    "KillEvidence",
    "LineParser",
    "LineSplitter",
    "LogTail",
    "Measurement",
    "MyrtleParser",
    "Parser",
    "ParserSettings",
    "Preset",
    "RegexParser",
    "Selection",
    "ThroughputSummary",
    "classify_failure",
    "compile_phase_patterns",
    "convert",
    "get_preset",
    "iter_file",
    "make_parser",
    "no_throughput_reason",
    "one_line",
    "parser_settings",
    "read_tail",
    "scan_file",
    "select_measurement",
    "split_rank_prefix",
    "summarize",
]
