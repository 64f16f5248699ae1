"""A sweep's configuration fingerprint: what a trial measures depends on these values alone.

A finished trial's throughput is only meaningful under the settings it ran with, so a
sweep dir records the fingerprint of those settings, and every result carries it. A rerun
or resume with other settings is refused (naming what differs) instead of relabelling
old figures as new ones.

Pure: plain nested dicts of JSON values in, a hex digest and human-readable differences out.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

# Launcher keys that shape a trial (how many ranks, where); the rest (partition, time limits,
# comments, ...) change when or where a trial runs, not what it measures.
LAUNCHER_SHAPE_KEYS = ("tasks_per_node", "gpus_per_node", "nodes", "cpus_per_task")
# Trial settings that only decide when to stop, not what one step measures: a resumed sweep
# may change them (e.g. raise the time limit) and still reuse what finished.
TRIAL_KEYS_NOT_MEASURED = ("time_limit_s",)
# Machine keys that describe or judge the figures rather than shape them: a resume may rescore with
# another run-to-run noise without rerunning anything.
MACHINE_KEYS_NOT_MEASURED = ("description", "run_to_run_noise")


def fingerprint_values(
    *,
    machine: Mapping[str, Any],
    workload: Mapping[str, Any],
    trial: Mapping[str, Any],
    global_batch_size: int,
    num_devices: int,
    launcher: Mapping[str, Any],
) -> dict[str, Any]:
    """The values a fingerprint is made of, as one nested dict of JSON values."""
    machine_values = {k: v for k, v in machine.items() if k not in MACHINE_KEYS_NOT_MEASURED}
    return {
        "global_batch_size": int(global_batch_size),
        "num_devices": int(num_devices),
        "machine": _plain(machine_values),
        "workload": _plain(workload),
        "trial": _plain({k: v for k, v in trial.items() if k not in TRIAL_KEYS_NOT_MEASURED}),
        "launcher": {k: _plain(launcher.get(k)) for k in LAUNCHER_SHAPE_KEYS},
    }


def fingerprint(values: Mapping[str, Any]) -> str:
    """A short, stable digest of fingerprint_values(): key order and int/float spelling do not matter."""
    text = json.dumps(_plain(values), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """`key: old -> new` for every leaf that differs, dotted keys, sorted."""
    return [f"{name}: {_show(a)} -> {_show(b)}" for name, a, b in _changed_leaves(old, new)]


def restoring_overrides(old: Mapping[str, Any], new: Mapping[str, Any], most: int | None = 3) -> list[str] | None:
    """Command-line overrides that give back the old values where they differ (e.g. a default changed
    since the old sweep ran: `trial.memory_margin=0.05`); None when more than `most` leaves differ (None:
    no limit) or one cannot be spelled as a plain override. num_devices is left out: machine.num_devices sets it."""
    changed = [(name, a) for name, a, _ in _changed_leaves(old, new) if name != "num_devices"]
    if most is not None and len(changed) > most:
        return None
    out = []
    for name, value in changed:
        spelled = _override_value(value)
        if spelled is None:
            return None
        out.append(f"{'hydra.' if name.startswith('launcher.') else ''}{name}={spelled}")
    return out


def _changed_leaves(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    out: list[tuple[str, Any, Any]] = []
    for key in sorted(set(old) | set(new)):
        name = f"{prefix}{key}"
        a, b = old.get(key, _MISSING), new.get(key, _MISSING)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _changed_leaves(a, b, prefix=f"{name}.")
        elif _plain(a) != _plain(b):
            out.append((name, a, b))
    return out


def _override_value(value: Any) -> str | None:
    """A JSON scalar as Hydra reads it back; None for what an override cannot restore (unset, lists, maps)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(_plain(value))
    if isinstance(value, str):
        return value if re.fullmatch(r"[A-Za-z0-9_./-]+", value) else hydra_quoted(value)
    return None


def hydra_quoted(value: str) -> str:
    """A value as one quoted Hydra override value: spaces, non-ASCII letters and quotes survive."""
    return "'" + value.replace("'", "\\'") + "'"  # Hydra reads a backslash as an escape only before a quote


class _Missing:
    def __repr__(self) -> str:
        return "(unset)"


_MISSING = _Missing()


def _show(value: Any) -> str:
    return repr(value) if value is _MISSING else json.dumps(value)


def _plain(value: Any) -> Any:
    """JSON-comparable: tuples as lists, integral floats as ints (2.0 and 2 are the same setting)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
