"""The configuration fingerprint: equal settings agree, any measured setting changes it, differences are named."""

import pytest

from sweep.core.fingerprint import differences, fingerprint, fingerprint_values, restoring_overrides

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
        {"machine__run_to_run_noise": 0.05},  # how the figures are judged, not what they are
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


@pytest.mark.parametrize(
    "change, restoring",
    [
        ({"trial__memory_margin": 0.1}, ["trial.memory_margin=0.05"]),  # a default that changed since
        ({"global_batch_size": 32}, ["global_batch_size=16"]),
        ({"num_devices": 2, "machine__num_devices": 2}, ["machine.num_devices=1"]),  # num_devices follows it
        ({"launcher__cpus_per_task": None}, ["hydra.launcher.cpus_per_task=2"]),
        ({"machine__cpu_threads": 4}, ["machine.cpu_threads=null"]),
        ({"machine__name": "my box"}, ["machine.name=cpu"]),
        ({"trial__memory_margin": 0.1, "trial__seed": 1}, ["trial.memory_margin=0.05", "trial.seed=0"]),
        ({"machine__memory_gib": 1, "trial__seed": 1, "trial__measure_steps": 4, "global_batch_size": 8}, None),  # too many
        ({"workload__layers": [1, 2]}, None),  # an added key cannot be unset from the command line
        ({}, []),
    ],
)
def test_restoring_overrides_give_back_the_old_values(change, restoring):
    old = values(trial__memory_margin=0.05)
    new = values(**{"trial__memory_margin": 0.05, **change})
    assert restoring_overrides(old, new) == restoring


def test_without_a_limit_every_changed_value_is_given_back():
    # A dir run with its own command, after several defaults changed (as the CPU demo's did at once).
    old = values(trial__memory_margin=0.05)
    new = values(machine__memory_gib=1, trial__seed=1, trial__measure_steps=4, global_batch_size=8)
    assert restoring_overrides(old, new) is None
    assert restoring_overrides(old, new, most=None) == [
        "global_batch_size=16", "machine.memory_gib=0.02", "trial.measure_steps=8", "trial.memory_margin=0.05", "trial.seed=0",
    ]


# -- wired in: real `python -m sweep` processes with the fast fake command as the workload ---------

import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402
from support.fingerprints import COMMAND, snapshot, sweep  # noqa: E402

from sweep.core.schema import TrialResult  # noqa: E402
from sweep.errors import ResultError  # noqa: E402
from sweep.records import collect_results, read_result, write_result  # noqa: E402


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path]:
    """One finished sweep at global batch 16: (working dir, sweep dir D)."""
    cwd = tmp_path_factory.mktemp("fp")
    proc = sweep(cwd, "hydra.sweep.dir=D", *COMMAND, "global_batch_size=16")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return cwd, cwd / "D"


@pytest.mark.e2e
@pytest.mark.parametrize(
    "args, named",
    [
        # The cases: a rerun into the same dir with another global batch, a resume on another machine.
        (["hydra.sweep.dir=D", *COMMAND, "global_batch_size=32"], "global_batch_size: 16 -> 32"),
        (["resume=D", "+machine=cpu2"], "num_devices: 1 -> 2"),
        (["resume=D", "trial.measure_steps=3"], "trial.measure_steps: 8 -> 3"),
        (["resume=D", "hydra.launcher.cpus_per_task=2"], "launcher.cpus_per_task: null -> 2"),
        # Each stored record's `tight` was decided with the sweep's margin (docs/gpus.md, "Headroom and tight").
        (["resume=D", "trial.memory_margin=0.2"], "trial.memory_margin: 0.1 -> 0.2"),
    ],
    ids=["rerun_other_global_batch", "resume_other_machine", "resume_other_trial_setting", "resume_other_launcher_shape",
         "resume_other_memory_margin"],
)
def test_a_rerun_with_other_settings_is_refused_naming_what_differs(finished, args, named):
    cwd, d = finished
    before = snapshot(d)
    proc = sweep(cwd, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweep: error: "), proc.stderr
    assert f"{d} holds a sweep with other settings" in lines[0] and named in lines[0], lines[0]
    assert "choose a new hydra.sweep.dir" in lines[0]
    assert "reusing" not in proc.stdout and proc.stdout == ""
    assert snapshot(d) == before  # nothing written


@pytest.mark.e2e
def test_a_dir_swept_before_a_default_changed_is_refused_with_the_command_that_resumes_it(tmp_path):
    """Such a dir's stored command lacks the setting (it was the default then): the refusal spells its
    value out, and that command resumes it."""
    proc = sweep(tmp_path, "hydra.sweep.dir=D", *COMMAND, "global_batch_size=16", "trial.memory_margin=0.05")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta_path = tmp_path / "D" / "sweep.json"
    meta = json.loads(meta_path.read_text())
    meta["argv"] = [a for a in meta["argv"] if not a.startswith("trial.memory_margin=")]
    meta_path.write_text(json.dumps(meta))

    refused = sweep(tmp_path, "resume=D")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "trial.memory_margin: 0.05 -> 0.1" in refused.stderr
    hint = refused.stderr.strip().rsplit("run with that dir's own settings: ", 1)[1].rstrip(")")
    assert hint == f"python -m sweep resume={tmp_path / 'D'} trial.memory_margin=0.05"
    resumed = sweep(tmp_path, *shlex.split(hint)[3:])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "reusing 2 finished trial(s)" in resumed.stdout


@pytest.mark.e2e
def test_a_dir_swept_before_many_defaults_changed_is_refused_with_every_value_spelled_out(tmp_path):
    """More than three settings differ, all of them defaults that changed (the dir's own command, run
    again): the refusal spells every one out, and that command resumes it."""
    old_defaults = ["global_batch_size=16", "trial.memory_margin=0.05", "trial.seed=3", "trial.warmup_steps=1", "machine.memory_gib=0.5"]
    proc = sweep(tmp_path, "hydra.sweep.dir=D", *COMMAND, *old_defaults)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta_path = tmp_path / "D" / "sweep.json"
    meta = json.loads(meta_path.read_text())
    meta["argv"] = [a for a in meta["argv"] if a not in old_defaults]
    meta_path.write_text(json.dumps(meta))

    refused = sweep(tmp_path, "resume=D")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "and 2 more" in refused.stderr
    hint = refused.stderr.strip().rsplit("run with that dir's own settings: ", 1)[1].rstrip(")")
    assert hint == (f"python -m sweep resume={tmp_path / 'D'} global_batch_size=16 machine.memory_gib=0.5 "
                    "trial.memory_margin=0.05 trial.seed=3 trial.warmup_steps=1")
    # With arguments of its own, the user changed the sweep on purpose: past three differences, the hint
    # is the dir's own command alone.
    other = sweep(tmp_path, "resume=D", "trial.measure_steps=3")
    assert other.returncode == 2 and other.stderr.rstrip().endswith(f"python -m sweep resume={tmp_path / 'D'})"), other.stderr
    resumed = sweep(tmp_path, *shlex.split(hint)[3:])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "reusing 2 finished trial(s)" in resumed.stdout


@pytest.mark.e2e
def test_sweep_json_records_the_fingerprint_and_every_result_carries_it(finished):
    _, d = finished
    meta = json.loads((d / "sweep.json").read_text())
    values = meta["fingerprint_values"]
    assert meta["fingerprint"] == fingerprint(values)
    assert values["global_batch_size"] == 16 and values["num_devices"] == 1
    assert values["machine"]["name"] == "local" and values["workload"]["name"] == "command"
    assert set(values["launcher"]) == {"tasks_per_node", "gpus_per_node", "nodes", "cpus_per_task"}
    assert "measure_steps" in values["trial"]
    for key in ("accum1_split1", "accum2_split1"):
        assert read_result(d / "trials" / key / "result.json").fingerprint == meta["fingerprint"]


@pytest.mark.e2e
def test_a_rerun_with_the_same_settings_reuses_what_finished(finished, tmp_path):
    cwd, d = finished
    copy = tmp_path / "D"
    shutil.copytree(d, copy)
    first = json.loads((copy / "sweep.json").read_text())
    proc = sweep(tmp_path, "resume=D", "trial.time_limit_s=99")  # when to give up is not a measured setting
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reusing 2 finished trial(s)" in proc.stdout
    again = json.loads((copy / "sweep.json").read_text())
    # The same sweep, resumed: its id and first start are kept; only the finish moves.
    assert (again["sweep_id"], again["started_at"]) == (first["sweep_id"], first["started_at"])
    assert again["finished_at"] >= first["finished_at"]


@pytest.mark.e2e
def test_a_resume_with_another_run_to_run_noise_rescores_without_rerunning(finished, tmp_path):
    cwd, d = finished
    copy = tmp_path / "D"
    shutil.copytree(d, copy)
    results = {p.relative_to(copy): p.read_bytes() for p in (copy / "trials").rglob("result.json")}
    before = yaml.safe_load((copy / "recommendation.yaml").read_text())["confidence"]
    proc = sweep(tmp_path, "resume=D", "machine.run_to_run_noise=0.3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reusing 2 finished trial(s)" in proc.stdout
    assert {p.relative_to(copy): p.read_bytes() for p in (copy / "trials").rglob("result.json")} == results
    rec = yaml.safe_load((copy / "recommendation.yaml").read_text())
    assert rec["confidence"] < before  # the same two figures, judged on a noisier machine
    assert rec["run_to_run_noise"] == 0.3  # what the score assumed, beside it


def _result(accum: int, fp: str = "abc", **change) -> TrialResult:
    res = TrialResult(accum=accum, split=1, per_device_batch=16 // accum, joint_batch=16 // accum, global_batch_size=16,
                      num_devices=1, status="ok", throughput=100.0, fingerprint=fp)
    for k, v in change.items():
        setattr(res, k, v)
    return res


def _place(root: Path, dir_name: str, res: TrialResult, **raw) -> Path:
    tdir = root / "trials" / dir_name
    write_result(res, tdir)
    if raw:
        data = json.loads((tdir / "result.json").read_text())
        data.update(raw)
        (tdir / "result.json").write_text(json.dumps(data))
    return tdir / "result.json"


@pytest.mark.parametrize(
    "dir_name, res, raw, why",
    [
        ("accum1_split1", _result(2), {}, "records accum=2 split=1, not this dir's pair (accum1_split1)"),
        ("accum1_split1", _result(1, fp="other"), {}, "measured under other settings (fingerprint other, this sweep's is abc)"),
        ("accum1_split1", _result(1, fp=""), {}, "measured under other settings (no fingerprint"),
        ("accum1_split1", _result(1), {"throughput": "fast"}, "throughput='fast' is not a number"),
        ("accum1_split1", _result(1), {"accum": "1"}, "accum='1' is not an integer"),
        ("accum1_split1", _result(1), {"accum": True}, "accum=True is not an integer"),
        ("accum1_split1", _result(1), {"step_times_s": [0.1, None]}, "step_times_s=[0.1, None] is not a list of numbers"),
        ("accum1_split1", _result(1), {"tight": "no"}, "tight='no' is not true or false"),
        ("accum1_split1", _result(1), {"error": None}, "error=None is not a string"),
        ("accum1_split1", _result(1), {"oom_phase": "disk"}, "oom_phase='disk' is not one of"),
        # issue 30: numbers no measurement gives are refused like wrong types (JSON's Infinity and NaN parse)
        ("accum1_split1", _result(1), {"throughput": float("inf")}, "throughput=inf is not a finite number"),
        ("accum1_split1", _result(1), {"throughput": -5.0}, "throughput=-5.0 is not above zero"),
        ("accum1_split1", _result(1), {"throughput": 0}, "throughput=0 is not above zero"),
        ("accum1_split1", _result(1), {"throughput_low": float("nan")}, "throughput_low=nan is not a finite number"),
        ("accum1_split1", _result(1), {"peak_mem_gib": -1.0}, "peak_mem_gib=-1.0 is negative"),
        ("accum1_split1", _result(1), {"step_times_s": [0.1, -0.2]}, "step_times_s holds -0.2, not a positive finite time"),
        ("accum1_split1", _result(1), {"split": 0}, "split=0 is not above zero"),
    ],
    ids=["misplaced_pair", "foreign_fingerprint", "no_fingerprint", "throughput_text", "accum_text", "accum_bool",
         "step_time_null", "tight_text", "error_null", "oom_phase_unknown", "throughput_inf", "throughput_negative",
         "throughput_zero", "interval_nan", "peak_negative", "step_time_negative", "split_zero"],
)
def test_a_result_not_of_its_place_or_wrongly_typed_is_ignored_with_its_file_named(tmp_path, dir_name, res, raw, why):
    path = _place(tmp_path, dir_name, res, **raw)
    _place(tmp_path, "accum4_split1", _result(4))  # a good one beside it is still taken
    errors: dict[str, str] = {}
    found = collect_results(tmp_path, errors=errors, fingerprint="abc")
    assert list(found) == ["accum4_split1"]
    assert errors[dir_name].startswith(f"{path}: ") and why in errors[dir_name], errors


def test_every_field_of_a_record_has_its_type_checked():
    """The checked kinds come from TrialResult's annotations: a field added later is checked too."""
    import dataclasses

    from sweep.core.schema import _FIELD_KINDS

    # The lists are checked on their own (test_a_list_field_of_the_wrong_type_is_a_result_error).
    lists = {"step_times_s", "step_peak_reserved_gib", "step_alloc_retries"}
    assert set(_FIELD_KINDS) == {f.name for f in dataclasses.fields(TrialResult)} - lists
    assert _FIELD_KINDS["throughput"] == ("a number", True) and _FIELD_KINDS["status"] == ("a string", False)
    assert _FIELD_KINDS["tight"] == ("true or false", False) and _FIELD_KINDS["steps_measured"] == ("an integer", True)


@pytest.mark.parametrize("name", ["step_times_s", "step_peak_reserved_gib"])
def test_a_list_field_of_the_wrong_type_is_a_result_error(tmp_path, name):
    path = _place(tmp_path, "accum1_split1", _result(1), **{name: [1.0, "x"]})
    with pytest.raises(ResultError, match=rf"result\.json: {name}=\[1\.0, 'x'\] is not a list of numbers"):
        read_result(path)


def test_a_wrong_typed_field_is_a_result_error_naming_the_file(tmp_path):
    path = _place(tmp_path, "accum1_split1", _result(1), peak_mem_gib="lots")
    with pytest.raises(ResultError, match=r"result\.json: peak_mem_gib='lots' is not a number"):
        read_result(path)


@pytest.mark.e2e
def test_a_wrong_typed_result_does_not_block_a_resume(finished, tmp_path):
    """It is reported, named, and its trial runs again; the sweep finishes."""
    cwd, d = finished
    shutil.copytree(d, tmp_path / "D")
    broken = tmp_path / "D" / "trials" / "accum2_split1" / "result.json"
    data = json.loads(broken.read_text())
    data["throughput"] = "fast"
    broken.write_text(json.dumps(data))
    proc = sweep(tmp_path, "resume=D")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ignoring {broken}: throughput='fast' is not a number" in proc.stdout
    assert "reusing 1 finished trial(s)" in proc.stdout
    assert read_result(broken).throughput == 550.0  # measured again


@pytest.mark.e2e
@pytest.mark.parametrize("bad", [float("inf"), -550.0], ids=["infinity", "negative"])
def test_a_result_with_an_impossible_figure_does_not_block_a_resume(finished, tmp_path, bad):
    """Infinity gave 'infx the baseline, 99/100'; a negative figure crashed every resume (issue 30)."""
    cwd, d = finished
    shutil.copytree(d, tmp_path / "D")
    broken = tmp_path / "D" / "trials" / "accum2_split1" / "result.json"
    data = json.loads(broken.read_text())
    data["throughput"] = bad
    broken.write_text(json.dumps(data))
    proc = sweep(tmp_path, "resume=D")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ignoring {broken}: throughput={bad!r}" in proc.stdout
    assert "inf" not in proc.stdout.split(f"ignoring {broken}")[1].split("\n", 1)[1]
    assert read_result(broken).throughput == 550.0  # measured again


@pytest.mark.parametrize("figure", [0.0, float("inf"), float("nan"), -3.0])
def test_an_ok_record_without_a_real_figure_is_written_as_failed(tmp_path, figure):
    """A zero-throughput trial was 'ok 0.0'. Every writer goes through write_result/write_ended."""
    res = _result(1, throughput=figure, throughput_low=figure, throughput_high=figure, peak_mem_gib=float("inf"))
    path = write_result(res, tmp_path / "trials" / "accum1_split1")
    assert res.status == "failed" and "is no measurement" in res.error
    back = read_result(path)
    assert back.status == "failed" and back.throughput is None and back.peak_mem_gib is None
    assert "Infinity" not in path.read_text() and "NaN" not in path.read_text()


def test_a_fifo_named_result_json_is_not_waited_on(tmp_path):
    """Reading it blocked a resume forever; it is a record that cannot be read, named."""
    tdir = tmp_path / "trials" / "accum1_split1"
    tdir.mkdir(parents=True)
    os.mkfifo(tdir / "result.json")
    errors: dict[str, str] = {}
    assert collect_results(tmp_path, errors=errors) == {}
    assert "result.json: not a regular file" in errors["accum1_split1"]


@pytest.mark.e2e
def test_two_hosts_sweeps_of_the_same_dir_name_compare_as_two(finished, tmp_path):
    """sweep_id is unique per sweep, not the dir's basename: hostA/run1 and hostB/run1 are two sweeps."""
    import sweep as api

    cwd, _ = finished
    for host in ("hostA", "hostB"):
        (tmp_path / host).mkdir()
        proc = sweep(tmp_path / host, "hydra.sweep.dir=run1", *COMMAND, "global_batch_size=16")
        assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = [json.loads((tmp_path / h / "run1" / "sweep.json").read_text())["sweep_id"] for h in ("hostA", "hostB")]
    assert ids[0] != ids[1] and all(i.startswith("run1-") for i in ids)
    table = api.compare([str(tmp_path / "hostA" / "run1"), str(tmp_path / "hostB" / "run1")])
    assert table["sweep_id"].nunique() == 2, table


@pytest.mark.e2e
def test_default_dirs_of_sweeps_started_in_the_same_second_are_separate(tmp_path):
    """The default dir is named by the second; a second sweep finding it taken gets the next free name."""
    taken = tmp_path / "outputs" / "same"
    taken.mkdir(parents=True)
    (taken / "sweep.json").write_text("{}")
    env_dir = "outputs/${oc.env:SAME_SECOND}"
    os.environ["SAME_SECOND"] = "same"
    try:
        # hydra.sweep.dir set in a config (as the default is), not on the command line: a default dir.
        (tmp_path / "sweeps").mkdir()
        (tmp_path / "sweeps" / "fixed.yaml").write_text(f"# @package _global_\nhydra:\n  sweep:\n    dir: {env_dir}\n")
        procs = [subprocess.Popen([sys.executable, "-m", "sweep", "+sweep=fixed", *COMMAND, "global_batch_size=16"], cwd=tmp_path,
                                  env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL) for _ in range(2)]
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        del os.environ["SAME_SECOND"]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert (taken / "sweep.json").read_text() == "{}"  # the earlier sweep's dir was not touched
    dirs = sorted(p.name for p in (tmp_path / "outputs").iterdir() if not p.is_symlink() and p.name != "same")
    assert dirs == ["same-2", "same-3"], dirs


def test_a_resume_removes_only_the_temp_files_the_orchestrator_alone_writes(tmp_path):
    """A killed orchestrator can leave .NAME.*.tmp beside its files; a running trial's own are not its to remove."""
    from sweep.orchestration.sweep_dir import remove_stale_temp_files

    trial = tmp_path / "trials" / "accum2_split4"
    trial.mkdir(parents=True)
    stale = [tmp_path / ".trials.csv.x1.tmp", tmp_path / ".sweep.json.x2.tmp", trial / ".job.json.x3.tmp"]
    kept = [trial / ".result.json.x4.tmp", trial / ".progress.json.x5.tmp", tmp_path / "trials.csv", trial / "job.json"]
    for path in stale + kept:
        path.write_text("{}")
    remove_stale_temp_files(tmp_path, ("trials.csv", "recommendation.yaml", "sweep.json"), ("job.json",))
    assert [p for p in stale if p.exists()] == []
    assert [p for p in kept if not p.exists()] == []
