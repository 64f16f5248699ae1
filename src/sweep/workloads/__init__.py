"""The workloads a sweep can measure, by name: one registry line each.

A new workload is a package beside rnnt/ and command/ whose __init__ defines
`WORKLOAD = Workload(...)` (sweep.workloads.base), plus its line below and its
conf/workload/<name>.yaml.
"""

from __future__ import annotations

from sweep.errors import SweepError
from sweep.workloads.base import CheckContext, Workload
from sweep.workloads.command import WORKLOAD as _COMMAND
from sweep.workloads.rnnt import WORKLOAD as _RNNT

REGISTRY: dict[str, Workload] = {w.name: w for w in (_RNNT, _COMMAND)}

__all__ = ["REGISTRY", "CheckContext", "Workload", "get"]


def get(name: object) -> Workload:
    """The registered workload called `name`; a SweepError naming the valid ones otherwise."""
    try:
        return REGISTRY[str(name)]
    except KeyError:
        raise SweepError(f"workload.name={name!r} is not valid: expected one of {', '.join(REGISTRY)}") from None
