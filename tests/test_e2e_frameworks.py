"""One end-to-end 1-D sweep per kind of figure a trainer prints, through `python -m sweep` and the real
submitit launcher: a step time (nanoGPT), tokens/s per GPU (torchtitan) and samples/s (timm).

tests/fake_trainer.py prints each log line exactly as the framework's own format string does (the source
file is named there) and takes the framework's flag names. Its model: at micro-batch b each device does
200 b / (b + 8) samples/s, times 1 - 0.02 (accum - 1); a micro-batch above 32 dies with a CUDA OOM. At a
global batch of 64 the sweep must therefore find accum=2 (micro-batch 32), report it in the framework's
flags, record the unit, the post-warm-up figures and a real interval in every result, and say so in
sweep.json.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import yaml
from support.sweep_run import run_sweep

TRAINER = Path(__file__).with_name("fake_trainer.py")
STEPS = 10
pytestmark = pytest.mark.e2e


def samples_per_s(accum: int, b: int) -> float:
    return 200.0 * b / (b + 8) * (1 - 0.02 * (accum - 1))  # fake_trainer's model, one device


# (preset, fake_trainer kind, its batch flags as the framework spells them, unit recorded, per-sample factor,
#  the recommendation's flags for accum=2 at a global batch of 64)
CASES = [
    ("nanogpt", "step_time", ["--batch_size={per_device_batch}", "--gradient_accumulation_steps={accum}"],
     "samples/s", 1.0, "--batch_size=32 --gradient_accumulation_steps=2"),
    ("torchtitan", "tokens", ["--training.local_batch_size={per_device_batch}", "--training.global_batch_size={global_batch_size}"],
     "tokens/s", 1024.0, "--training.local_batch_size=32 --training.global_batch_size=64"),
    ("timm", "samples", ["--batch-size={per_device_batch}", "--grad-accum-steps={accum}"],
     "samples/s", 1.0, "--batch-size=32 --grad-accum-steps=2"),
]


@pytest.mark.slow
@pytest.mark.parametrize("preset,kind,flags,unit,per_sample,recommended", CASES, ids=[c[0] for c in CASES])
def test_a_1d_sweep_of_each_output_kind(tmp_path: Path, preset: str, kind: str, flags: list[str], unit: str,
                                        per_sample: float, recommended: str) -> None:
    argv = [sys.executable, str(TRAINER), f"--kind={kind}", f"--steps={STEPS}", "--oom_above=32", *flags]
    sweep_dir = tmp_path / "s"
    proc = run_sweep(
        [
            f"hydra.sweep.dir={sweep_dir}", "workload=command", "workload.argv=[" + ",".join(f'"{a}"' for a in argv) + "]",
            f"workload.parser.type={preset}", "workload.splits_apply=false", "global_batch_size=64", "accum=1,2,4",
            "search=grid", "search.drift_check=false",  # the figures each kind of log gives, not the re-timing (tests/test_drift.py)
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    results = {p.parent.name: json.loads(p.read_text()) for p in sweep_dir.glob("trials/*/result.json")}
    by_accum = {r["accum"]: r for r in results.values()}
    assert sorted(by_accum) == [1, 2, 4]
    assert by_accum[1]["status"] == "oom"  # micro-batch 64 > 32
    skip = {"nanogpt": 5, "torchtitan": 1, "timm": 1}[preset]  # the presets' warm-up defaults
    for accum in (2, 4):
        r = by_accum[accum]
        assert r["status"] == "ok", r["error"]
        expected = samples_per_s(accum, 64 // accum) * per_sample
        assert r["throughput"] == pytest.approx(expected, rel=0.011)  # step-to-step jitter is 1%
        assert r["throughput_low"] < r["throughput"] < r["throughput_high"]
        assert (r["throughput_unit"], r["steps_measured"], r["warmup_steps"]) == (unit, STEPS - skip, skip)

    meta = json.loads((sweep_dir / "sweep.json").read_text())
    assert (meta["parser"], meta["throughput_unit"], meta["splits_apply"]) == (preset, unit, False)
    rec = yaml.safe_load((sweep_dir / "recommendation.yaml").read_text())
    assert (rec["accum"], rec["flags"], rec["throughput_unit"]) == (2, recommended, unit)
    assert f"recommended {recommended} (accum=2)" in proc.stdout
    assert "split=" not in proc.stdout.split("recommended", 1)[1].splitlines()[0]
    rows = list(csv.DictReader((sweep_dir / "trials.csv").open()))
    assert {int(r["accum"]) for r in rows if r["status"] == "ok"} == {2, 4}
