"""Ctrl-C while `python -m sweep` starts: one line and exit status 130, never a traceback.

Until sweep first writes anything, an interrupt has nothing to clean up, so the process just
ends. Letting KeyboardInterrupt rise instead would land it inside third-party start-up code
(Hydra's config store, OmegaConf's flag caches), which can turn it into an unrelated
AttributeError from a half-built object: a traceback that reads as a bug in sweep.

`install()` runs as the package is imported under `python -m` (sweep/__init__.py); `over()` runs
just before the first write (the sweep dir's claim, or a single in-process trial). From then on
Python's own handler is back and the orchestrator's StopSignals takes over.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

INTERRUPTED_LINE = b"sweep: interrupted\n"


def _interrupted_while_starting(signum: int, frame: Any) -> None:
    os.write(2, INTERRUPTED_LINE)
    os._exit(128 + signal.SIGINT)


def runs_as_the_cli() -> bool:
    """`python [options] -m sweep ...`; not `-m sweep.logs` nor `-m sweep.workloads.rnnt.train`, whose Ctrl-C stays Python's."""
    argv = getattr(sys, "orig_argv", [])
    return any(a == "-m" and b == "sweep" for a, b in zip(argv, argv[1:]))


def install() -> None:
    # An ignored SIGINT (nohup, a launcher that ignores it) stays ignored.
    if runs_as_the_cli() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_while_starting)


def over() -> None:
    """Sweep is about to write: Ctrl-C raises KeyboardInterrupt again, for sweep's own handlers."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)
