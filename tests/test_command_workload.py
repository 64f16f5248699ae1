"""workload=command end to end: real external commands through the real submitit launcher."""

import csv
import json
import sys
from pathlib import Path

import pytest
from support.scripts import DDP_TRAINER
from support.sweep_run import run_sweep

FAKE = Path(__file__).with_name("fake_train.py")
pytestmark = pytest.mark.e2e


def command_args(behaviours: str, parser: str = "myrtle", extra=()):
    argv = f'["{sys.executable}","{FAKE}","--accum={{accum}}","--split={{split}}","--global_batch_size={{global_batch_size}}","--behaviours={behaviours}"]'
    return ["workload=command", f"workload.argv={argv}", f"workload.parser.type={parser}", "global_batch_size=64", "search=grid", *extra]


def rows_by_accum(sweep_dir):
    return {int(r["accum"]): r for r in csv.DictReader((sweep_dir / "trials.csv").open())}


def test_every_outcome_is_classified_and_the_sweep_goes_on(tmp_path):
    behaviours = "1:oom_joint,2:oom_encoder,4:oom_optimizer,8:hang,16:crash,32:silent,64:sigkill"
    sweep_dir = tmp_path / "s"
    extra = ["accum=1,2,4,8,16,32,64", "split=1", "trial.time_limit_s=8", "max_in_flight=2"]
    proc = run_sweep([f"hydra.sweep.dir={sweep_dir}", *command_args(behaviours, extra=extra)], cwd=tmp_path)
    rows = rows_by_accum(sweep_dir)
    expected = {
        1: ("oom", "joint"),
        2: ("oom", "encoder"),
        4: ("oom", "optimizer"),
        8: ("timeout", ""),
        16: ("failed", ""),
        32: ("failed", ""),
        64: ("failed", ""),  # a SIGKILL with no sign of running out of memory is not an OOM (issue 30)
    }
    assert {a: (r["status"], r["oom_phase"]) for a, r in rows.items()} == expected, proc.stdout
    assert "bad shard" in rows[16]["reason"]
    assert "printed no throughput" in rows[32]["reason"]
    assert "no sign of running out of memory" in rows[64]["reason"]
    for r in rows.values():
        assert Path(r["log"]).exists() and "\n" not in r["reason"]
    assert proc.returncode == 1  # nothing ran ok: no recommendation
    assert "no recommendation" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("fmt, parser", [("myrtle_old", "myrtle"), ("myrtle_new", "myrtle"), ("dlll", "myrtle"), ("jsonl", "jsonl"), ("regex", "regex")])
def test_each_log_format_gives_the_second_epoch_throughput(tmp_path, fmt, parser):
    parser_args = {
        "jsonl": ["+workload.parser.key=metrics.samples_per_sec", "+workload.parser.epoch_key=epoch"],
        "regex": [r"+workload.parser.pattern='epoch (?P<epoch>\d+) step \d+ took (?P<step_time>[0-9.]+)s -> (?P<throughput>[0-9.]+) samples/s'"],
    }.get(fmt, [])
    sweep_dir = tmp_path / "s"
    extra = ["accum=1,2", "split=1,2", "search.drift_check=false", *parser_args]  # the figures each format gives; re-timing: test_drift.py
    proc = run_sweep([f"hydra.sweep.dir={sweep_dir}", *command_args(f"1:{fmt},2:{fmt}", parser, extra)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    rows = [r for r in csv.DictReader((sweep_dir / "trials.csv").open())]
    ok = {(int(r["accum"]), int(r["split"])): float(r["throughput_samples_per_s"]) for r in rows if r["status"] == "ok"}
    # fake_train prints 1000*(1+split/10)/accum from epoch 2 on (epoch 1 is 200 lower: warm-up).
    assert ok == pytest.approx({(a, s): 1000 * (1 + s / 10) / a for a in (1, 2) for s in (1, 2)}, rel=1e-3)
    assert "recommended accum=1 split=2" in proc.stdout


def test_env_placeholders_reach_the_command_and_values_cannot_inject(tmp_path):
    sweep_dir = tmp_path / "s"
    extra = ["accum=1", "split=1", "+workload.env.SWEEP_FAKE_ENV='pdb={per_device_batch};$(touch pwned)'"]
    proc = run_sweep([f"hydra.sweep.dir={sweep_dir}", *command_args("", extra=extra)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    log = Path(rows_by_accum(sweep_dir)[1]["log"]).read_text()
    assert "env=pdb=64;$(touch pwned)" in log  # passed literally: no shell ever sees it
    assert not list(tmp_path.rglob("pwned"))


@pytest.mark.parametrize(
    "override, message",
    [
        ('workload.argv=["python","--x={nope}"]', "uses placeholder {nope}: valid placeholders are {accum}"),
        ('workload.argv=["python","--x={accum:>5}"]', "uses placeholder {accum:>5}"),
        ('workload.argv=["no-such-trainer-xyz","--b={accum}"]', "workload.argv[0]='no-such-trainer-xyz' is not an executable on PATH"),
        ("workload.argv=[]", "workload.argv is empty"),
        # issue 29: every pair would run the same command
        ('workload.argv=["python","train.py","--steps=3"]', "use none of {accum}, {split}, {per_device_batch}, {joint_batch}"),
        # issue 29: a relative script is looked for where sweep starts (the trial dir is never the cwd)
        ('workload.argv=["python","no_such_train.py","--b={accum}"]', "names 'no_such_train.py', which is not a file in"),
        ('workload.argv=["torchrun","--nproc_per_node={num_devices}","missing/train.py","--b={accum}"]', "names 'missing/train.py'"),
        ('workload.cwd=/no/such/dir', "workload.cwd='/no/such/dir' is not a directory"),
        ("workload.parser.type=csv", "parser.type='csv' is not supported"),
    ],
)
@pytest.mark.parametrize("dry_run", [False, True])
def test_bad_command_templates_fail_in_one_line_before_launch(tmp_path, override, message, dry_run):
    args = [f"hydra.sweep.dir={tmp_path / 's'}", "workload=command", 'workload.argv=["python","--b={accum}"]', override]
    proc = run_sweep([*args, *(["dry_run=true"] if dry_run else [])], cwd=tmp_path)
    assert message in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "s").exists()
    # A path this host lacks (the script, the executable, the cwd) only stops a run: a dry run shows its plan and warns.
    host_path = any(s in proc.stderr for s in ("which is not a file in", "is not an executable on PATH", "is not a directory"))
    if dry_run and host_path:
        assert proc.returncode == 0 and proc.stderr.startswith("sweep: warning: ") and "a run from here would stop on it" in proc.stderr
        assert "valid pairs" in proc.stdout or "accum" in proc.stdout, proc.stdout
    else:
        assert proc.returncode == 2, proc.stdout


@pytest.mark.slow
def test_builtin_workload_as_a_command_with_a_real_oom(tmp_path):
    """The shipped example sweeps/builtin_command.yaml, at test size, with a budget that the
    biggest joint batch exceeds: the OOM phase comes from the traceback in the log."""
    sweep_dir = tmp_path / "s"
    tiny = '["python","-m","sweep.workloads.rnnt.train","--global_batch_size={global_batch_size}","--grad_accumulation_batches={accum}","--batch_split_factor={split}","--epochs=2","--steps_per_epoch=1","--frames=16","--enc_hidden=16","--pred_hidden=16","--label_len=16","--vocab=4096","--joint_hidden=256","--memory_gib=0.25"]'
    proc = run_sweep([f"hydra.sweep.dir={sweep_dir}", "+sweep=builtin_command", f"workload.argv={tiny}", "global_batch_size=64", "accum=1,16", "split=1", "search=grid"], cwd=tmp_path)
    rows = rows_by_accum(sweep_dir)
    assert (rows[1]["status"], rows[1]["oom_phase"]) == ("oom", "joint"), proc.stdout
    assert rows[16]["status"] == "ok", proc.stdout


def test_a_slow_trial_does_not_delay_the_report_of_a_fast_one(tmp_path):
    """Asynchronous collection: the fast trial's row is ok in trials.csv while the slow one still runs."""
    import os
    import subprocess
    import time

    sweep_dir = tmp_path / "s"
    args = [f"hydra.sweep.dir={sweep_dir}", *command_args("1:slow,2:myrtle_new", extra=["accum=1,2", "split=1", "max_in_flight=2"])]
    proc = subprocess.Popen([sys.executable, "-m", "sweep", *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if (sweep_dir / "trials.csv").exists():
            rows = rows_by_accum(sweep_dir)
            if rows.get(2, {}).get("status") == "ok":
                seen = {a: r["status"] for a, r in rows.items()}
                break
        time.sleep(0.2)
    out, _ = proc.communicate(timeout=60)
    assert seen == {1: "running", 2: "ok"}, out
    assert proc.returncode == 0
    assert rows_by_accum(sweep_dir)[1]["status"] == "ok"


def test_a_trial_stops_once_its_measurement_is_good_enough(tmp_path):
    """parser.stop_after: once that many post-warm-up figures are in, the command is stopped, ok."""
    sweep_dir = tmp_path / "s"
    extra = ["accum=1", "split=1", "+workload.parser.stop_after=1", "trial.time_limit_s=60"]
    proc = run_sweep([f"hydra.sweep.dir={sweep_dir}", *command_args("1:then_hang", extra=extra)], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    row = rows_by_accum(sweep_dir)[1]
    assert row["status"] == "ok" and float(row["throughput_samples_per_s"]) == pytest.approx(1100.0)
    assert float(row["wall_s"]) < 30  # stopped long before the hour-long "run" or the time limit


@pytest.mark.slow
def test_a_torchrun_command_on_cpu2_starts_exactly_two_ranks_per_trial(tmp_path):
    """Issue 29: one launcher per node per trial; torchrun starts the ranks (it used to be two launchers, four ranks)."""
    (tmp_path / "train.py").write_text(DDP_TRAINER)  # relative: found where sweep starts, not in the trial dir
    sweep_dir = tmp_path / "s"
    argv = '["torchrun","--nproc_per_node={num_devices}","--nnodes={nodes}","--node_rank={node_rank}","--master_addr={master_addr}","--master_port={master_port}","train.py","--accum={accum}","--gbs={global_batch_size}"]'
    proc = run_sweep(
        [f"hydra.sweep.dir={sweep_dir}", "+machine=cpu2", "workload=command", f"workload.argv={argv}", "global_batch_size=16",
         "accum=1,2", "search=grid", "max_in_flight=2", "trial.warmup_steps=2", "trial.measure_steps=4",
         "search.drift_check=false"],  # the ranks each trial starts, not the end-of-sweep re-timing (test_drift.py)
        cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    # 1-D without being told: the command uses neither {split} nor {joint_batch}, so one pair per accum.
    assert sorted((r["accum"], r["split"]) for r in csv.DictReader((sweep_dir / "trials.csv").open())) == [("1", "1"), ("2", "1")]  # ranked rows: either may lead
    rows = rows_by_accum(sweep_dir)
    assert set(rows) == {1, 2}
    ports = set()
    for accum in rows:
        trial = sweep_dir / "trials" / f"accum{accum}_split1"
        ranks = [json.loads(p.read_text()) for p in trial.glob("rank*.json")]
        assert len(ranks) == 2 and {r["world"] for r in ranks} == {2}, ranks
        assert {r["cwd"] for r in ranks} == {str(tmp_path)}
        ports |= {r["port"] for r in ranks}
        result = json.loads((trial / "result.json").read_text())
        assert result["status"] == "ok" and result["measured_by"] == "probe" and result["ranks_seen"] == 2, result
    assert len(ports) == 2 and "29500" not in ports  # each trial its own free port, side by side
