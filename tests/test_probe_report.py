"""core/probe_report.py: the pure summary of the probe's records, and the module-path -> OOM phase map."""

from __future__ import annotations

import json

import pytest

from sweep.core.probe_report import oom_phase_of, parse_records, summarise

GIB = 1024**3


def step(index, seconds, rank=0, device="cpu", **memory):
    return {"kind": "step", "step": index, "rank": rank, "seconds": seconds, "device": device, "optimizers": 1, "skipped": 0, **memory}


def start(rank=0):
    return {"kind": "start", "rank": rank, "pid": 1}


def test_each_step_is_the_slowest_ranks_and_memory_the_largest():
    records = {
        "rank0-pid1.jsonl": [start(0), step(0, 0.5, 0, resident_peak=3, address_peak=10), step(1, 0.2, 0, resident_peak=5, address_peak=11)],
        "rank1-pid2.jsonl": [start(1), step(0, 0.4, 1, resident_peak=4, address_peak=12), step(1, 0.3, 1, resident_peak=2, address_peak=9)],
    }
    report = summarise(records)
    assert report.ranks == [0, 1] and report.armed and report.device == "cpu"
    assert report.step_times_s == [0.5, 0.3]
    assert [(s.peak_bytes, s.peak_reserved_bytes, s.ranks) for s in report.steps] == [(4, 12, 2), (5, 11, 2)]
    assert (report.peak_bytes, report.peak_step, report.peak_reserved_bytes) == (5, 1, 12)


def test_cuda_steps_take_the_allocators_figures():
    records = {"r": [step(0, 1.0, device="cuda", allocated_peak=2 * GIB, reserved_peak=3 * GIB, retries=1, resident_peak=GIB, address_peak=9 * GIB)]}
    report = summarise(records)
    (only,) = report.steps
    assert (only.peak_bytes, only.peak_reserved_bytes, only.resident_peak_bytes, only.retries) == (2 * GIB, 3 * GIB, GIB, 1)
    assert report.device == "cuda"


def test_a_step_some_rank_did_not_record_counts_the_ranks_that_did():
    records = {"a": [step(0, 0.1, 0), step(1, 0.1, 0), step(2, 0.4, 0)], "b": [step(0, 0.2, 1), step(1, 0.3, 1)]}
    report = summarise(records)
    assert report.step_times_s == [0.2, 0.3, 0.4]
    assert [s.ranks for s in report.steps] == [2, 2, 1]


def test_missing_step_indices_leave_gaps_not_zeros():
    report = summarise({"a": [step(0, 0.1), step(2, 0.3)]})
    assert [s.index for s in report.steps] == [0, 2] and report.step_times_s == [0.1, 0.3]


def test_nothing_recorded_is_an_unarmed_empty_report():
    report = summarise({})
    assert (report.armed, report.ranks, report.steps, report.peak_bytes, report.peak_step, report.oom, report.device) == (
        False, [], [], None, None, None, "")


def test_armed_without_steps_and_problems_are_kept():
    report = summarise({"a": [start(), {"kind": "problem", "message": "clear_refs: PermissionError"}]}, ["b: line 3 is not JSON"])
    assert report.armed and report.steps == []
    assert report.problems == ["b: line 3 is not JSON", "a: clear_refs: PermissionError"]


def test_the_first_oom_in_time_over_all_ranks():
    oom = lambda t, rank, module: {"kind": "oom", "t": t, "rank": rank, "step": 3, "module": module, "where": "forward", "inside": True, "message": "m"}  # noqa: E731
    report = summarise({"a": [oom(5.0, 0, "joint")], "b": [oom(4.0, 1, "encoder.lstm")]})
    assert (report.oom.module, report.oom.rank, report.oom.step) == ("encoder.lstm", 1, 3)


def test_parse_records_drops_a_cut_off_last_line_and_names_bad_lines():
    text = "\n".join([json.dumps(start()), "not json", json.dumps([1]), json.dumps(step(0, 0.1)), '{"kind": "step", "st'])
    records, problems = parse_records(text, "rank0-pid1.jsonl")
    assert [r["kind"] for r in records] == ["start", "step"]
    assert problems == [
        "rank0-pid1.jsonl: line 2 is not JSON",
        "rank0-pid1.jsonl: line 3 is not a probe record",
        "rank0-pid1.jsonl: line 5 cut off (the process ended mid-write)",
    ]
    assert parse_records(json.dumps(start()) + "\n", "x") == ([start()], [])


@pytest.mark.parametrize(
    ("path", "phase"),
    [
        ("encoder", "encoder"),
        ("encoder.lstm", "encoder"),
        ("module.encoder.layers.0", "encoder"),  # DDP's wrapper in front
        ("pred_rnn", "encoder"),
        ("prediction.embed", "encoder"),
        ("joint_enc", "joint"),  # the joint's own projection of the encoder output
        ("joint_pred", "joint"),
        ("joint_net.out", "joint"),
        ("encoder.joint", "joint"),  # deepest first
        ("optimizer:Adam", "optimizer"),
        ("decoder.layers.3", None),
        ("", None),
    ],
)
def test_oom_phase_of_default_patterns(path, phase):
    assert oom_phase_of(path, None) == phase


def test_oom_phase_of_own_patterns_and_bad_ones():
    assert oom_phase_of("transformer.h.3.attn", {"encoder": [r"^h$"]}) == "encoder"
    assert oom_phase_of("lm_head", {"joint": r"head"}) == "joint"
    with pytest.raises(ValueError, match="unknown phase 'decoder'; valid phases: encoder, joint, optimizer"):
        oom_phase_of("x", {"decoder": ["x"]})
    with pytest.raises(ValueError, match=r"'\(' does not compile"):
        oom_phase_of("x", {"joint": ["("]})
