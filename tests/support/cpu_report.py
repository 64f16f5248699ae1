"""Each test's CPU, for choosing what only `--full` runs (`python -m pytest --full --cpu-report=FILE`, docs/development.md).

A test's CPU is what its process tree spent while it ran (setup, call, teardown): the pytest process (an xdist
worker) and every live descendant, user and system time, with the children each of them has waited for. So the
trials, `python -m sweep` runs, forked scripts and torchrun ranks a test starts count towards it, whatever else runs
on the machine; the Slurm daemons and jobs (not descendants) do not. A module fixture counts towards the first test
that uses it. One JSON line per test goes to FILE (appended to by every worker):
{"id": nodeid, "cpu": seconds, "wall": seconds}.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest


def tree_cpu(process: psutil.Process) -> float:
    """CPU seconds of a process and its live descendants, each with the children it has waited for."""
    total = 0.0
    try:
        tree = [process, *process.children(recursive=True)]
    except psutil.Error:
        tree = [process]
    for member in tree:
        try:
            t = member.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuReport:
    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.me = psutil.Process()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> Iterator[None]:
        cpu, wall = tree_cpu(self.me), time.monotonic()
        yield
        line = {"id": item.nodeid, "cpu": round(tree_cpu(self.me) - cpu, 3), "wall": round(time.monotonic() - wall, 3)}
        with self.path.open("a") as out:
            out.write(json.dumps(line) + "\n")


def summary(path: str | os.PathLike, threshold_s: float) -> list[tuple[str, float]]:
    """The test functions (their parameters' CPU summed) at or above threshold_s, the most CPU first."""
    per_function: dict[str, float] = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        function = row["id"].split("@")[0].split("[")[0]
        per_function[function] = per_function.get(function, 0.0) + row["cpu"]
    return sorted(((f, c) for f, c in per_function.items() if c >= threshold_s), key=lambda fc: -fc[1])


if __name__ == "__main__":  # python tests/support/cpu_report.py FILE [THRESHOLD_S]: the test functions to mark slow
    import sys

    total = sum(json.loads(line)["cpu"] for line in Path(sys.argv[1]).read_text().splitlines())
    picked = summary(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 7.0)
    for function, cpu in picked:
        print(f"{cpu:7.1f} s  {function}")
    print(f"{sum(c for _, c in picked):7.1f} s of {total:.1f} s in {len(picked)} test functions")
