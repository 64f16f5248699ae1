"""A user's parser regex must not hang a trial: checked against long, awkward lines before launch.

A pattern with nested quantifiers (`(a+)+$`, `(\\d+\\s?)+x`) backtracks exponentially on a
line that almost matches; in a trial that shows as a command that never ends and is recorded
as a timeout, blaming the training script. Python's `re` cannot be interrupted, so the check
runs the pattern in a child process with a deadline, and a slow one is a parser problem named
before anything launches.
"""

from __future__ import annotations

import subprocess
import sys

TIME_LIMIT_S = 3.0
LINE_LENGTH = 4000
# Runs of the characters training logs are made of, each ended by a character that breaks the
# match at the very end: the lines that make a backtracking pattern try every split of the run.
_RUNS = ("a", "1", "0.", " ", "1 ", "a1", "x=1, ", "-", "=", "1.5e-3 ", "\t")
_PROBE = r"""
import re, sys
rx = re.compile(sys.argv[1])
n = int(sys.argv[2])
for run in sys.argv[3:]:
    body = run * (n // len(run))
    for line in (body + "\x00!", "step " + body + "\x00", body):
        rx.search(line)
"""


def check_regex_speed(pattern: str, time_limit_s: float = TIME_LIMIT_S) -> str:
    """'' if the pattern searches every probe line within the limit, else why not (one line)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, pattern, str(LINE_LENGTH), *_RUNS],
            capture_output=True, text=True, timeout=time_limit_s, stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return (
            f"parser.pattern {pattern!r} takes over {time_limit_s:g} s on a {LINE_LENGTH}-character log line "
            "(catastrophic backtracking): avoid nested repeats such as (a+)+ or (\\d+\\s?)+; anchor it and "
            "match the figure directly, e.g. throughput: (?P<throughput>[0-9.]+)"
        )
    except OSError:
        return ""  # no child process here: the trial's own time limit remains the backstop
    if proc.returncode != 0:
        return ""  # it does not compile: the parser's own check names that
    return ""
