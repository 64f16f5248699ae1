"""The candidate space: (grad_accumulation_batches, batch_split_factor) pairs.

Pure functions on plain data. The two formulas every candidate must satisfy:

    per_device_batch * accum * num_devices = global_batch_size
    per_device_batch / split = joint_batch

A pair that breaks either (a non-integer batch) is *invalid*: it is listed with
the reason and never launched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TypedDict

from sweep.errors import SpaceError


class PairNumbers(TypedDict):
    """A pair's integers by name (Candidate.numbers, TrialSpec.numbers): a trial record's first fields, a template's values."""

    accum: int  # grad_accumulation_batches
    split: int  # batch_split_factor
    per_device_batch: int  # global_batch_size / (accum * num_devices)
    joint_batch: int  # per_device_batch / split
    global_batch_size: int
    num_devices: int


@dataclass(frozen=True, order=True)
class Candidate:
    """One (accum, split) pair with the batch sizes it implies."""

    accum: int
    split: int
    per_device_batch: int = 0  # 0 when invalid
    joint_batch: int = 0  # 0 when invalid
    reason: str = ""  # why the pair is invalid; empty when valid

    @property
    def valid(self) -> bool:
        return not self.reason

    @cached_property  # read in every search step's inner loops; frozen, so it never changes
    def key(self) -> str:
        """Stable identifier, also the trial's directory name."""
        return f"accum{self.accum}_split{self.split}"

    @property
    def product(self) -> int:
        """accum * split: the seed's step 3 trades one for the other at constant product."""
        return self.accum * self.split

    def numbers(self, global_batch_size: int, num_devices: int) -> PairNumbers:
        """The pair's integers by name, as a trial record (and TrialSpec.numbers) names them."""
        return {
            "accum": self.accum,
            "split": self.split,
            "per_device_batch": self.per_device_batch,
            "joint_batch": self.joint_batch,
            "global_batch_size": global_batch_size,
            "num_devices": num_devices,
        }


def pair_of_key(key: str) -> tuple[int, int]:
    """(accum, split) of a Candidate.key, a trial dir's name; ValueError for any other name."""
    accum, sep, split = key.removeprefix("accum").partition("_split")
    if not (key.startswith("accum") and sep and accum.isdigit() and split.isdigit()):
        raise ValueError(f"{key!r} is not a pair's key (accum<N>_split<M>)")
    return int(accum), int(split)


def check_positive_int(name: str, value: object) -> int:
    """Return value as int, or raise SpaceError naming the value and what is valid."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        elif isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        else:
            raise SpaceError(f"{name}={value!r} is not valid: expected a positive integer")
    if value <= 0:
        raise SpaceError(f"{name}={value} is not valid: expected a positive integer")
    return value


def check_batch_setting(global_batch_size: object, num_devices: object) -> tuple[int, int]:
    """Validate the fixed part of the formula before any candidate is made."""
    gbs = check_positive_int("global_batch_size", global_batch_size)
    nd = check_positive_int("num_devices", num_devices)
    if gbs % nd:
        divisors = [d for d in range(1, gbs + 1) if gbs % d == 0 and d <= 64]
        raise SpaceError(
            f"global_batch_size={gbs} is not divisible by num_devices={nd}: "
            f"use a multiple of {nd} (e.g. {gbs - gbs % nd or nd}), "
            f"or num_devices in {divisors}"
        )
    return gbs, nd


def make_candidate(accum: int, split: int, global_batch_size: int, num_devices: int) -> Candidate:
    """Apply both formulas to one pair; invalid pairs carry the reason."""
    per_device_total = global_batch_size // num_devices
    if per_device_total % accum:
        return Candidate(
            accum,
            split,
            reason=(
                f"per_device_batch = {global_batch_size}/({num_devices}*{accum}) "
                f"= {global_batch_size / (num_devices * accum):g} is not an integer"
            ),
        )
    per_device = per_device_total // accum
    if per_device % split:
        return Candidate(
            accum,
            split,
            per_device_batch=per_device,
            reason=f"joint_batch = {per_device}/{split} = {per_device / split:g} is not an integer",
        )
    return Candidate(accum, split, per_device, per_device // split)


def powers_of_two_up_to(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def default_accum_values(global_batch_size: int, num_devices: int) -> list[int]:
    """Every power of two that leaves an integer per-device batch (>= 1)."""
    per_device_total = global_batch_size // num_devices
    return [a for a in powers_of_two_up_to(per_device_total) if per_device_total % a == 0]


def default_split_values(global_batch_size: int, num_devices: int, max_split: int = 64) -> list[int]:
    """Powers of two up to the largest per-device batch (split can never exceed it)."""
    return powers_of_two_up_to(min(global_batch_size // num_devices, max_split))


def enumerate_candidates(
    global_batch_size: object,
    num_devices: object,
    accum_values: Sequence[object] | None = None,
    split_values: Sequence[object] | None = None,
) -> list[Candidate]:
    """Every (accum, split) pair, valid first, each sorted by (accum, split).

    None for a knob means "derive sensible defaults from the global batch and device count".
    """
    gbs, nd = check_batch_setting(global_batch_size, num_devices)
    accums = _checked_values("accum", accum_values) if accum_values is not None else default_accum_values(gbs, nd)
    splits = _checked_values("split", split_values) if split_values is not None else default_split_values(gbs, nd)
    cands = [make_candidate(a, s, gbs, nd) for a in accums for s in splits]
    cands.sort(key=lambda c: (not c.valid, c.accum, c.split))
    if not any(c.valid for c in cands):
        first = cands[0] if cands else None
        why = f" (e.g. accum={first.accum} split={first.split}: {first.reason})" if first else ""
        raise SpaceError(
            f"no valid (accum, split) pair for global_batch_size={gbs} on {nd} device(s){why}: "
            f"valid accum values are the divisors of {gbs // nd}"
        )
    return cands


def _checked_values(name: str, values: Iterable[object]) -> list[int]:
    out = sorted({check_positive_int(name, v) for v in values})
    if not out:
        raise SpaceError(f"{name}= is empty: give at least one positive integer, e.g. {name}=1,2,4")
    return out


def valid_only(cands: Iterable[Candidate]) -> list[Candidate]:
    return [c for c in cands if c.valid]
