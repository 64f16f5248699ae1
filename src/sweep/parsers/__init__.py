"""Reading trial logs: throughput figures, and why a trial failed.

    parser = make_parser(workload.parser)        # {"type": "myrtle"|"regex"|"jsonl", ...}
    tail = LogTail(log_path)
    while running:
        for m in parser.feed(tail.read_new()): ...
    measurements += parser.close()
    chosen = select_measurement(measurements)   # second epoch, else the last figure
    verdict = classify_failure(read_tail(log_path), exit_code)

Pure code: no torch, no hydra.
"""

from __future__ import annotations

from sweep.parsers.classify import (
    DEFAULT_PHASE_PATTERNS,
    MAX_REASON_CHARS,
    Classification,
    classify_failure,
    compile_phase_patterns,
    no_throughput_reason,
    one_line,
)
from sweep.parsers.formats import (
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
from sweep.parsers.tail import DEFAULT_CHUNK, LogTail, Parser, iter_file, read_tail, scan_file

__all__ = [
    "DEFAULT_CHUNK",
    "DEFAULT_PARSER_TYPE",
    "DEFAULT_PHASE_PATTERNS",
    "MAX_LINE_BYTES",
    "MAX_REASON_CHARS",
    "PARSER_TYPES",
    "Classification",
    "JsonlParser",
    "LineParser",
    "LineSplitter",
    "LogTail",
    "Measurement",
    "MyrtleParser",
    "Parser",
    "RegexParser",
    "Selection",
    "classify_failure",
    "compile_phase_patterns",
    "iter_file",
    "make_parser",
    "no_throughput_reason",
    "one_line",
    "read_tail",
    "scan_file",
    "select_measurement",
    "split_rank_prefix",
]
