"""Waiting in tests for something another process does: poll until it is seen, or fail naming it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(what: Callable[[], T], timeout_s: float = 120.0, seen: str = "", poll_s: float = 0.1) -> T:
    """what()'s first truthy value, polled every poll_s; AssertionError after timeout_s, naming `seen`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(poll_s)
    raise AssertionError(f"not seen in {timeout_s:g} s" + (f": {seen}" if seen else ""))
