"""The configuration fingerprint: equal settings agree, any measured setting changes it, differences are named."""

import pytest

from sweep.core.fingerprint import differences, fingerprint, fingerprint_values

BASE = dict(
    machine={"name": "cpu", "device": "cpu", "num_devices": 1, "nodes": 1, "memory_gib": 0.02, "cpu_threads": None, "description": "x"},
    workload={"name": "rnnt", "vocab": 448, "enc_hidden": 16},
    trial={"warmup_steps": 2, "measure_steps": 8, "time_limit_s": 300.0, "seed": 0},
    global_batch_size=16,
    num_devices=1,
    launcher={"tasks_per_node": 1, "gpus_per_node": None, "nodes": 1, "cpus_per_task": 2, "partition": "a", "timeout_min": 5},
)


def values(**change):
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for key, value in change.items():
        group, _, leaf = key.partition("__")
        if leaf:
            merged[group][leaf] = value
        else:
            merged[group] = value
    return fingerprint_values(**merged)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"global_batch_size": 32}, "global_batch_size: 16 -> 32"),
        ({"num_devices": 2}, "num_devices: 1 -> 2"),
        ({"machine__memory_gib": 0.5}, "machine.memory_gib: 0.02 -> 0.5"),
        ({"machine__name": "a100x8"}, 'machine.name: "cpu" -> "a100x8"'),
        ({"workload__vocab": 4096}, "workload.vocab: 448 -> 4096"),
        ({"trial__measure_steps": 4}, "trial.measure_steps: 8 -> 4"),
        ({"launcher__tasks_per_node": 8}, "launcher.tasks_per_node: 1 -> 8"),
        ({"launcher__cpus_per_task": 4}, "launcher.cpus_per_task: 2 -> 4"),
    ],
)
def test_a_measured_setting_changes_the_fingerprint_and_is_named(change, named):
    old, new = values(), values(**change)
    assert fingerprint(old) != fingerprint(new)
    assert differences(old, new) == [named]


@pytest.mark.parametrize(
    "change",
    [
        {"trial__time_limit_s": 900.0},  # when to give up, not what a step measures
        {"machine__description": "another label"},
        {"launcher__partition": "b"},
        {"launcher__timeout_min": 60},
    ],
)
def test_settings_that_do_not_change_a_measurement_keep_the_fingerprint(change):
    assert fingerprint(values()) == fingerprint(values(**change))
    assert differences(values(), values(**change)) == []


def test_key_order_and_number_spelling_do_not_matter():
    a = values(machine__memory_gib=2.0)
    b = values(machine__memory_gib=2)
    b["workload"] = dict(reversed(list(b["workload"].items())))
    assert fingerprint(a) == fingerprint(b)


def test_an_added_or_removed_key_is_named():
    new = values()
    new["workload"]["amp"] = True
    assert differences(values(), new) == ["workload.amp: (unset) -> true"]
