"""Headroom, tight, and the recommendation that avoids tight pairs (pure)."""

from __future__ import annotations

import pytest
from support.results import trial_result

from sweep.core.config import MachineConfig, TrialConfig, memory_margin
from sweep.core.ranking import SweepMeta, confidence_view
from sweep.core.recommendation import recommendation, recommendation_line
from sweep.core.schema import Status, TrialResult
from sweep.launch.memory import headroom, is_tight


@pytest.mark.parametrize(
    "peak, capacity, expected",
    [
        (76.0, 80.0, 0.05),
        (0.0, 80.0, 1.0),
        (80.0, 80.0, 0.0),
        (88.0, 80.0, -0.1),
        (None, 80.0, None),
        (1.0, None, None),
        (1.0, 0.0, None),
    ],
)
def test_headroom(peak, capacity, expected) -> None:
    got = headroom(peak, capacity)
    assert got == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(
    "ok, room, margin, tight",
    [
        (True, 0.03, 0.05, True),
        (True, 0.05, 0.05, False),
        (True, 0.30, 0.05, False),
        (True, -0.01, 0.0, True),
        (True, 0.01, 0.0, False),
        (True, None, 0.05, False),  # nothing measured: not called tight
        (False, 0.01, 0.05, False),  # an oom or failed trial is not tight, it failed
    ],
)
def test_tight(ok, room, margin, tight) -> None:
    assert is_tight(ok, room, margin) is tight


META = SweepMeta(sweep_id="s", machine="h100x8", workload="rnnt", global_batch_size=1024, num_devices=8)


def result(accum: int, split: int, throughput: float, room: float, margin: float = 0.05) -> TrialResult:
    return trial_result(accum, split, gbs=1024, devices=8, status=Status.OK, throughput=throughput, throughput_low=throughput,
                        throughput_high=throughput, headroom=room, tight=is_tight(True, room, margin))


def by_key(*results: TrialResult) -> dict[str, TrialResult]:
    return {r.key: r for r in results}


def test_a_faster_tight_pair_is_named_in_one_line_with_both_figures() -> None:
    rec = recommendation(META, by_key(result(2, 4, 170.6, 0.03), result(2, 2, 164.0, 0.20), result(1, 1, 120.0, 0.5)), 50, 0.05)
    assert (rec.accum, rec.split, rec.tight) == (2, 2, False)
    assert rec.memory_note == (
        "accum=2 split=4 is 4% faster (170.6 vs 164.0 samples/s) but leaves 3% headroom, below trial.memory_margin=0.05"
    )
    lines = recommendation_line(rec).splitlines()
    assert lines[0].startswith("recommended accum=2 split=2:") and lines[1] == rec.memory_note


def test_when_every_ok_pair_is_tight_the_fastest_is_recommended_and_called_tight() -> None:
    rec = recommendation(META, by_key(result(2, 4, 170.6, 0.03), result(2, 2, 164.0, 0.01)), None, 0.05)
    assert (rec.accum, rec.split, rec.tight) == (2, 4, True)
    assert rec.memory_note == "accum=2 split=4 is tight: it leaves 3% headroom, below trial.memory_margin=0.05; every ok pair does"


def test_without_tight_pairs_the_fastest_wins_and_nothing_is_added() -> None:
    rec = recommendation(META, by_key(result(2, 4, 170.6, 0.30), result(2, 2, 164.0, 0.01)), None, 0.05)
    assert (rec.accum, rec.split, rec.memory_note) == (2, 4, None)
    assert "\n" not in recommendation_line(rec)


@pytest.mark.parametrize(
    "room_4_1, baseline",
    [
        (0.03, (8, 1)),  # the seed's step-2 answer among pairs that fit with room: the tight (4, 1) is passed over
        (0.30, (4, 1)),  # roomy: the smallest accum at split 1 is the baseline
    ],
)
def test_the_speedup_baseline_is_the_smallest_split1_accum_that_is_not_tight(room_4_1, baseline) -> None:
    results = by_key(result(4, 1, 1000.0, room_4_1), result(8, 1, 700.0, 0.4), result(4, 2, 900.0, 0.2))
    rec = recommendation(META, results, None, 0.05)
    assert (rec.baseline_accum, 1) == baseline
    best = results[f"accum{rec.accum}_split{rec.split}"]
    assert rec.speedup == pytest.approx(best.throughput / results[f"accum{baseline[0]}_split1"].throughput, abs=1e-4)


def test_when_every_split1_pair_is_tight_the_smallest_accum_is_still_the_baseline() -> None:
    rec = recommendation(META, by_key(result(4, 1, 1000.0, 0.03), result(8, 1, 700.0, 0.02), result(4, 2, 900.0, 0.2)), None, 0.05)
    assert (rec.accum, rec.split, rec.baseline_accum) == (4, 2, 4)
    assert rec.speedup == pytest.approx(0.9)


@pytest.mark.parametrize(
    "rooms, as_oom",
    [
        ((0.03, 0.20, 0.5), {"accum2_split4"}),  # a tight leader passed over: it counts as not fitting
        ((0.30, 0.01, 0.5), set()),  # the leader is roomy: the tight pair behind it changes nothing
        ((0.03, 0.01, 0.02), set()),  # every pair tight: the fastest is recommended, scored as it is
        ((0.30, 0.20, 0.5), set()),  # nothing tight
    ],
)
def test_the_confidence_is_scored_on_the_pair_recommended(rooms, as_oom) -> None:
    results = by_key(*(result(a, s, tp, room) for (a, s, tp), room in zip([(2, 4, 170.6), (2, 2, 164.0), (1, 1, 120.0)], rooms)))
    view = confidence_view(results)
    assert {k for k, r in view.items() if r.status == Status.OOM} == as_oom
    assert all(view[k] is results[k] for k in results if k not in as_oom)


def test_a_margin_of_zero_marks_nothing_tight_that_fits() -> None:
    rec = recommendation(META, by_key(result(2, 4, 170.6, 0.01, margin=0.0), result(2, 2, 164.0, 0.2, margin=0.0)), None, 0.0)
    assert (rec.accum, rec.split, rec.tight) == (2, 4, False)


# -- through a real sweep -----------------------------------------------------------------------

HOLDER = """
import sys, time
accum = int(sys.argv[1])
block = bytearray((495 if accum == 1 else 50) * 1024 * 1024)  # accum=1 nearly fills the 0.5 GiB card
block[::4096] = b"x" * len(block[::4096])
time.sleep(1.0)
for epoch in (1, 2, 3):
    print(f"DLL 2024-01-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : {200.0 / accum:8.2f} | train_avg_took : 0.16", flush=True)
"""


@pytest.mark.parametrize(
    "device, configured, margin",
    [
        ("cpu", None, 0.1),  # the emulated cap's peak understates the uncapped need (core/config.py)
        ("cuda", None, 0.05),
        ("cpu", 0.2, 0.2),
        ("cuda", 0.0, 0.0),  # zero is a setting, not "unset"
    ],
)
def test_the_margin_is_the_trials_own_else_its_devices_default(device, configured, margin) -> None:
    assert memory_margin(TrialConfig(memory_margin=configured), MachineConfig(device=device)) == margin


@pytest.mark.parametrize(
    "overrides, margin, same_as",
    [
        ([], 0.1, ["trial.memory_margin=0.1"]),
        (["+machine=a100x8"], 0.05, ["+machine=a100x8", "trial.memory_margin=0.05"]),
        (["trial.memory_margin=0.2"], 0.2, None),
    ],
    ids=["cpu_default", "cuda_default", "cpu_configured"],
)
def test_the_plan_resolves_the_margin_before_the_fingerprint(tmp_path, overrides, margin, same_as) -> None:
    """A sweep records the margin it used, and one made with the default keeps the fingerprint of the
    same margin spelled out: a CUDA sweep dir from before the per-device default still resumes."""
    from support.sbatch_golden import compose_plan

    plan = compose_plan(overrides, str(tmp_path / "s"))
    assert plan.trial.memory_margin == margin
    assert plan.fingerprint_values["trial"]["memory_margin"] == margin
    if same_as is not None:
        assert compose_plan(same_as, str(tmp_path / "s")).fingerprint == plan.fingerprint


@pytest.mark.e2e
def test_a_sweep_recommends_the_roomy_pair_and_names_the_faster_tight_one(tmp_path, monkeypatch, capsys) -> None:
    """A GPU profile without NVML (torch made to report one device): command trials count resident
    memory against machine.memory_gib; accum=1 is twice as fast but leaves almost nothing."""
    import sys

    import torch
    import yaml

    from sweep.launch.memory import start_nvml

    nvml = start_nvml()
    if nvml is not None:
        nvml.close()
        pytest.skip("NVML answers on this host: the trial would count GPU memory, not this test's host memory")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(sys, "argv", [
        "sweep", "workload=command", f"workload.argv=[{sys.executable},{tmp_path / 'train.py'},'{{accum}}']", "machine.device=cuda",
        "machine.memory_gib=0.5", "global_batch_size=8", "accum=1,2", "split=1", "search=grid", "trial.time_limit_s=60",
        f"hydra.sweep.dir={tmp_path / 's'}",
    ])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    (tmp_path / "train.py").write_text(HOLDER)
    from sweep.cli.main import main

    code = main()
    out = capsys.readouterr()
    assert code == 0, out.err
    rec = yaml.safe_load((tmp_path / "s" / "recommendation.yaml").read_text())
    assert (rec["accum"], rec["split"], rec["tight"]) == (2, 1, False)
    assert rec["memory_note"].startswith("accum=1 is 100% faster (200.0 vs 100.0 samples/s) but leaves ")  # 1-D: the command has no {split}
    assert rec["memory_note"].endswith("headroom, below trial.memory_margin=0.05")
    assert rec["memory_note"] in out.out
