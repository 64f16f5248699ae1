"""How a running sweep stops when asked: Ctrl-C, SIGTERM, or a stdout nobody reads any more.

A signal is only noted here; the orchestrator's loop acts on it at its next safe point (never
between submitting a job and tracking it), cancels its own trials, marks sweep.json
`interrupted` and prints one line with the resume command: no traceback. A second Ctrl-C
does not abort that cleanup; it only cuts the wait for the cancelled trials short. The exit
status is the shell's for the signal (128 + its number): 130 for SIGINT, 143 for SIGTERM,
141 for a closed stdout (SIGPIPE).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

HANDLED = (signal.SIGINT, signal.SIGTERM)
WORDS: dict[int, str] = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGPIPE: "stdout closed"}


class Interrupted(Exception):
    """Raised by the loop at a safe point once a stop was asked for."""


class StopSignals:
    """A context that notes SIGINT and SIGTERM instead of raising where they land."""

    def __init__(self) -> None:
        self.signal: int | None = None  # what stopped the sweep (SIGPIPE: stdout closed)
        self.hurry = False  # a second signal came: stop waiting for cancelled trials to end
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signal is None:
            self.signal = signum
        else:
            self.hurry = True

    def __enter__(self) -> StopSignals:
        # A signal ignored from the start stays ignored, as in Python and the shells: a sweep run as
        # `python -m sweep &` from a script inherits SIGINT ignored, so the terminal's Ctrl-C is the
        # foreground job's alone; SIGTERM still stops it.
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in HANDLED if signal.getsignal(sig) is not signal.SIG_IGN}
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def exit_status(self) -> int:
        return 128 + int(self.signal or signal.SIGINT)

    def hint(self, note: str, sweep_dir: Path) -> str:
        """The one line a stopped sweep prints: what happened to its trials and how to go on."""
        why = WORDS.get(self.signal or signal.SIGINT, "interrupted")
        return f"{why}: {note}; finished results are kept in {sweep_dir}; resume with: python -m sweep {shlex.quote(f'resume={sweep_dir}')}"


def silence_stdout() -> None:
    """Later writes to a closed stdout go nowhere instead of raising again (and at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
