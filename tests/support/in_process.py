"""sweep run inside the test's own process (its main, with monkeypatched argv), and four pretend GPUs for it."""

from __future__ import annotations

import sys

import pytest
import torch


def pretend_four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch reports four 80 GB CUDA devices: the GPU paths run on a CPU host."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=80 * 1024**3, name=f"Fake80GB{i}"))


def run_in_process(args: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    from sweep.cli.main import main

    monkeypatch.setattr(sys, "argv", ["sweep", *args])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("SWEEP_DEBUG", raising=False)
    return main()
