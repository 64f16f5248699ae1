"""Sweeps of tests/attack_train.py (fake trainers with set true speeds) for the reliability benches, and their verdicts:
what reliability_validity.py and reliability_assumptions.py share (neither imports the other's helpers)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ATTACK = ROOT / "tests" / "attack_train.py"
GBS = 64
CONFIDENT = 80


def run_sweep(root: Path, argv: str, *args: str) -> tuple[subprocess.CompletedProcess, dict, dict]:
    """`python -m sweep` of the command `argv` (a workload.argv list) in root: (the process, trials.csv rows by pair,
    recommendation.yaml or {})."""
    root.mkdir(parents=True, exist_ok=True)
    sweep_dir = root / "sweep"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "sweep", f"hydra.sweep.dir={sweep_dir}", "workload=command", f"workload.argv={argv}",
                           f"global_batch_size={GBS}", "max_in_flight=1", "trial.time_limit_s=120", "live=false", *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    rows = {}
    if (sweep_dir / "trials.csv").exists():
        rows = {(int(r["accum"]), int(r["split"])): r for r in csv.DictReader((sweep_dir / "trials.csv").open())}
    rec_path = sweep_dir / "recommendation.yaml"
    rec = yaml.safe_load(rec_path.read_text()) if rec_path.exists() else {}
    return proc, rows, rec or {}


def attack_sweep(root: Path, extra_argv: str, *args: str) -> tuple[subprocess.CompletedProcess, dict, dict]:
    """One sweep of the attack trainer (_run_sweep), extra_argv appended to its argv."""
    argv = (f'["{sys.executable}","{ATTACK}","--batch={{per_device_batch}}","--accum={{accum}}","--split={{split}}",'
            f'"--global-batch={{global_batch_size}}","--marker-dir={root}"{extra_argv}]')
    return run_sweep(root, argv, *args)


def answer(rec: dict) -> str:
    return f"recommended accum={rec['accum']} split={rec['split']} at {rec['confidence']}/100" if rec.get("accum") else "no recommendation"


def wrong(rec: dict, best: tuple[int, int]) -> bool:
    return bool(rec.get("accum")) and (rec["accum"], rec["split"]) != best and int(rec.get("confidence") or 0) >= CONFIDENT
