"""Parallel screening (orchestration/screening.py, core/screening.py) driven end to end on a CPU host:
torch is made to report 4 CUDA devices, as tests/test_gpu_groups.py does; a sweep with
machine.num_devices=2 screens every pair as one-rank trials at half the global batch, side by side on
disjoint single devices, then confirms the leaders with full 2-device trials."""

from __future__ import annotations

import csv
import itertools
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml
from support.in_process import pretend_four_gpus, run_in_process
from support.results import trial_result
from support.scripts import GATED

from sweep.core.schema import Status, TrialResult
from sweep.core.screening import confirm_candidates, screens

# Records what it was given; reports a throughput the default (Myrtle) parser reads. accum=2 leads and
# accum=1 is 4% behind it, accum=4 and 8 far slower.
SCRIPT = r'''
import json, os, sys, time
accum, gbs, ndev, ledger = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
start = time.time()
time.sleep(1.5)
name = f"accum{accum}_n{ndev}_{os.getpid()}.json"
with open(os.path.join(ledger, name), "w") as f:
    json.dump({"accum": accum, "gbs": gbs, "ndev": ndev, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start, "end": time.time()}, f)
speed = {1: 960.0, 2: 1000.0, 4: 500.0, 8: 250.0}[accum]
for epoch in (1, 2, 3):
    print(f"DLL 2024-01-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : {speed:8.2f} | train_avg_took : {0.016 * accum:6.2f}", flush=True)
'''


def test_screening_modes():
    from sweep.core.config import SearchConfig, refusal

    assert screens("auto", 8) and screens("on", 2) and not screens("off", 8) and not screens("auto", 1)
    # The edge refuses any other word by search.screen's rule (core/config.py), before screens is asked.
    assert refusal(SearchConfig(screen="sometimes"), "search.") == "search.screen='sometimes' is not valid: expected one of auto, on, off"
    assert refusal(SearchConfig(screen="on"), "search.") is None


def test_yaml_on_and_off_mean_the_words_they_spell(tmp_path):
    """`screen: on` in a YAML file (as docs/gpus.md spells the values) is a boolean to YAML 1.1, 'True' to the schema."""
    from sweep.orchestration.settings import screen_word

    assert [screen_word(v) for v in (True, "True", False, "False", "on", "auto", "sometimes")] == ["on", "on", "off", "off", "on", "auto", "sometimes"]
    from support.plans import plan

    # What YAML's `on` becomes: true, which the str schema holds as 'True'. `on` screens even CPU sweeps of 2 ranks.
    assert plan(["+machine=cpu2", "search.screen=true"], tmp_path / "on").screen
    assert not plan(["+machine=cpu2", "search.screen=false"], tmp_path / "off").screen
    assert not plan(["+machine=cpu2"], tmp_path / "auto").screen  # auto: CUDA sweeps only


def _ok(accum: int, times: list[float], tight: bool = False) -> TrialResult:
    return trial_result(accum, gbs=64, status=Status.OK, times=times, tight=tight)


def test_the_pairs_inside_the_leaders_noise_are_confirmed_and_a_failed_confirmation_opens_the_next():
    steady = [0.010, 0.0101, 0.0099, 0.010, 0.0102, 0.0098, 0.010, 0.0100]
    screened = {r.key: r for r in (_ok(1, steady), _ok(2, [t * 1.01 for t in steady]), _ok(4, [t * 2 for t in steady]))}
    assert [r.key for r in confirm_candidates(screened)] == ["accum1_split1", "accum2_split1"]
    # Both confirmations ran out of memory as full trials: the next screened pair is confirmed.
    ooms = {k: TrialResult(accum=r.accum, split=1, per_device_batch=r.per_device_batch, joint_batch=r.joint_batch, global_batch_size=128,
                           num_devices=2, status=Status.OOM) for k, r in screened.items() if k != "accum4_split1"}
    assert [r.key for r in confirm_candidates(screened, ooms)] == ["accum4_split1"]


def test_every_pair_inside_the_leaders_noise_is_confirmed_a_tie_with_a_confirmed_one_included():
    """Issue 32: the top pairs, all inside the noise of the leader, run as full trials. A pair screened within the
    run-to-run noise of the confirmed leader is confirmed too: two pairs screening cannot order are each measured at
    full scale, and the table and recommendation rest on those."""
    steady = [0.010, 0.0101, 0.0099, 0.010, 0.0102, 0.0098, 0.010, 0.0100]
    wide = [0.010, 0.012, 0.008, 0.0115, 0.0085, 0.011, 0.009, 0.010]
    lead = _ok(4, steady)
    tied_one = _ok(2, [t * 1.01 for t in wide])  # 1% off the leader: inside cuda's 2.8% tie band
    slower = _ok(8, [t * 1.05 for t in wide])  # 5% slower, its interval still reaching the leader's lower bound
    screened = {r.key: r for r in (lead, tied_one, slower)}
    assert [r.key for r in confirm_candidates(screened)] == ["accum4_split1", "accum2_split1", "accum8_split1"]
    confirmed = {lead.key: TrialResult(**{**lead.to_dict(), "num_devices": 2, "global_batch_size": 128})}
    assert [r.key for r in confirm_candidates(screened, confirmed)] == ["accum2_split1", "accum8_split1"]
    # Only an ok, roomy confirmation counts: one that ran out of memory at full scale leaves the rest to confirm.
    oom = {lead.key: TrialResult(accum=4, split=1, per_device_batch=16, joint_batch=16, global_batch_size=128, num_devices=2, status=Status.OOM)}
    assert [r.key for r in confirm_candidates(screened, oom)] == ["accum2_split1", "accum8_split1"]


@pytest.mark.e2e
def test_a_two_device_sweep_screens_one_rank_trials_side_by_side_then_confirms_with_full_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    pretend_four_gpus(monkeypatch)
    script, ledger, sweep_dir = tmp_path / "train.py", tmp_path / "ledger", tmp_path / "sweep"
    script.write_text(SCRIPT)
    ledger.mkdir()
    code = run_in_process(
        [
            "workload=command", f"workload.argv=[{sys.executable},{script},'{{accum}}','{{global_batch_size}}','{{num_devices}}',{ledger}]",
            "machine.name=fake4gpu", "machine.device=cuda", "machine.num_devices=2", "hydra.launcher.tasks_per_node=2",
            "machine.memory_gib=80", "global_batch_size=128", "search=grid", "accum=1,2,4,8", "split=1", "trial.time_limit_s=60",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        monkeypatch,
    )
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    seen = [json.loads(p.read_text()) for p in ledger.glob("*.json")]
    screening = [r for r in seen if r["ndev"] == 1]
    full = [r for r in seen if r["ndev"] == 2]
    # Every pair screened once, one rank at half the global batch, on one device of its own, some side by side.
    assert sorted(r["accum"] for r in screening) == [1, 2, 4, 8] and {r["gbs"] for r in screening} == {64}
    assert all(r["visible"] in {"0", "1", "2", "3"} for r in screening)
    side_by_side = [(a, b) for a, b in itertools.combinations(screening, 2) if a["start"] < b["end"] and b["start"] < a["end"]]
    assert side_by_side and all(a["visible"] != b["visible"] for a, b in side_by_side)
    # Only the two pairs inside the leader's noise ran as full trials, at the full global batch, after screening: accum=1,
    # 4% behind the leader accum=2 (beyond the 2.8% of cuda's run-to-run noise), has the bigger micro-batch, so no
    # confirmation of accum=2 rules it out; accum=4 and 8 are outside the noise.
    assert {r["accum"] for r in full} == {1, 2} and {r["gbs"] for r in full} == {128}
    assert min(r["start"] for r in full) > max(r["end"] for r in screening)
    # The table rests on the full trials; the screening rows are kept in their own sweep dir.
    rows = {r["accum"]: r for r in csv.DictReader((sweep_dir / "trials.csv").open())}
    assert {a for a, r in rows.items() if r["status"] == "ok"} == {"1", "2"}
    assert all(r["num_devices"] == "2" for r in rows.values())
    screened = {r["accum"]: r for r in csv.DictReader((sweep_dir / "screening" / "trials.csv").open())}
    assert {a for a, r in screened.items() if r["status"] == "ok"} == {"1", "2", "4", "8"}
    assert all(r["num_devices"] == "1" and r["global_batch_size"] == "64" for r in screened.values())
    assert "screening: 4 pairs as one-rank trials at global_batch_size=64" in out.out
    screening_log = out.out.split(f"dir {sweep_dir}\n")[0]  # up to the full sweep's first line
    assert "screening" in screening_log and "recommended" not in screening_log and "confidence" not in screening_log
    rec = yaml.safe_load((sweep_dir / "recommendation.yaml").read_text())
    assert (rec["accum"], rec["split"]) == (2, 1)


@pytest.mark.parametrize("extra", [[], ["machine.nodes=2", "machine.num_devices=16"]], ids=["8 GPUs", "2 nodes of 8"])
def test_on_slurm_screening_trials_are_one_gpu_jobs(tmp_path: Path, extra: list[str]) -> None:
    from support.sbatch_golden import SLURM, _srun_not_required, compose_plan

    from sweep.launch import backend as backends
    from sweep.orchestration.screening import screening_plan

    plan = compose_plan(["+machine=a100x8", *SLURM, *extra], str(tmp_path / "s"))
    assert plan.screen  # auto: CUDA and more than one device
    sub = screening_plan(plan)
    assert (sub.meta.num_devices, sub.meta.global_batch_size, sub.max_in_flight) == (1, plan.meta.global_batch_size // plan.meta.num_devices, plan.meta.num_devices)
    assert sub.sweep_dir == plan.sweep_dir / "screening" and sub.trial.max_measure_steps == plan.trial.measure_steps
    backends.check_task_layout(sub.launcher, sub.machine.num_devices)
    with _srun_not_required():
        executor = backends.make_executor(sub.launcher, sub.time_limit_s)
        text = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    assert "#SBATCH --gpus-per-node=1" in text and "#SBATCH --ntasks-per-node=1" in text and "#SBATCH --nodes=1" in text
    assert compose_plan(["+machine=a100x8", *SLURM, "search.screen=off"], str(tmp_path / "t")).screen is False
    assert compose_plan(["+machine=cpu2", *SLURM], str(tmp_path / "u")).screen is False  # auto: CUDA only


def test_screening_rows_meet_the_stress_step_and_only_the_confirmations_never_stop_provisionally(tmp_path: Path) -> None:
    """A screened pair may be confirmed by a fresh N-rank job, so it meets the workload's stress step at one rank
    before it stops ahead or tied, as a full trial does; the search's first screened pair stops provisionally
    (never run again: a screening row is never the answer), and no confirmation does (the first is the leader)."""
    from support.sbatch_golden import SLURM, compose_plan

    from sweep.core.decision import PROVISIONAL_STEPS
    from sweep.orchestration.racing import StopSteps, plan_ahead_steps, plan_stop_steps
    from sweep.orchestration.screening import screening_plan

    plan = compose_plan(["+machine=a100x8", *SLURM], str(tmp_path / "s"))
    ahead = plan_ahead_steps(plan.workload, plan.trial.warmup_steps)
    assert plan.screen and plan_stop_steps(plan) == StopSteps(plan.trial.measure_steps, ahead, 0, plan.trial.max_measure_steps)
    sub = screening_plan(plan)
    assert sub.nominates_only and plan_stop_steps(sub) == StopSteps(plan.trial.measure_steps, ahead, PROVISIONAL_STEPS, sub.trial.max_measure_steps)
    # The grid's first pair is its biggest micro-batch, as likely the answer as not: never provisional.
    grid = compose_plan(["+machine=a100x8", *SLURM, "search=grid"], str(tmp_path / "g"))
    assert plan_stop_steps(screening_plan(grid)).provisional == 0


def test_a_bad_screen_mode_is_one_line(tmp_path: Path) -> None:
    from support.sbatch_golden import compose_plan

    from sweep.errors import SweepError

    with pytest.raises(SweepError, match="search.screen='sometimes' is not valid: expected one of auto, on, off"):
        compose_plan(["search.screen=sometimes"], str(tmp_path / "s"))


# accum=1 prints its per-iteration figures at once; every other accum sits in a long warm-up first.
SLOW_START = r'''
import sys, time
accum = int(sys.argv[1])
if accum > 1:
    time.sleep(40)
for it in range(12):
    print(f"iter {it}: loss 1.0000, time {10.0 * accum * (1 + 0.001 * (it % 3)):.2f}ms, mfu 30.00%", flush=True)
    time.sleep(0.02)
'''


@pytest.mark.e2e
def test_a_screening_trial_the_ordering_rules_out_before_its_first_step_is_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The staircase screens accum=2 and accum=1 side by side; once accum=1 lands, accum=2 (no bigger
    micro-batch) is not needed: cancelled in its warm-up, not left to run 40 s."""
    import time

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    script, sweep_dir = tmp_path / "train.py", tmp_path / "sweep"
    script.write_text(SLOW_START)
    t0 = time.monotonic()
    code = run_in_process(
        [
            "workload=command", f"workload.argv=[{sys.executable},{script},'{{accum}}']", "workload.parser.type=nanogpt",
            "machine.device=cuda", "machine.num_devices=2", "hydra.launcher.tasks_per_node=2", "machine.memory_gib=80",
            "global_batch_size=64", "search=staircase", "accum=1,2,4,8", "split=1", "trial.time_limit_s=120",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        monkeypatch,
    )
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    screened = {r["accum"]: r for r in csv.DictReader((sweep_dir / "screening" / "trials.csv").open())}
    assert screened["1"]["status"] == "ok" and screened["2"]["status"] == "cancelled"
    assert "accum=2 split=1: cancelled before its first timed step: outranked by accum1_split1" in out.out
    assert time.monotonic() - t0 < 40  # accum=2's warm-up was not waited out
    rec = yaml.safe_load((sweep_dir / "recommendation.yaml").read_text())
    assert (rec["accum"], rec["split"]) == (1, 1)


@pytest.mark.e2e
def test_stopped_while_screening_it_says_to_resume_the_whole_sweep(tmp_path: Path) -> None:
    """Ctrl-C during the screening phase (search.screen=on with 2 CPU ranks): the hint names the sweep dir,
    whose sweep.json already holds the command that resume= replays."""
    import os
    import signal
    import subprocess
    import time

    from support.interrupts import ARGV

    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweep", f"hydra.sweep.dir={sweep_dir}", "workload=command", ARGV, "global_batch_size=16", "search=grid",
         "accum=1,2,4", "split=1", "trial.time_limit_s=60", "search.screen=on", "machine.num_devices=2", "hydra.launcher.tasks_per_node=2"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (sweep_dir / "screening" / "trials" / "accum1_split1" / "result.json").exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert f"resume with: python -m sweep resume={sweep_dir}\n" in out, out
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert record["state"] == "screening" and "search.screen=on" in record["argv"]
    assert not (sweep_dir / "trials.csv").exists()  # no full trial ran


def test_a_dry_run_says_screening_comes_first(tmp_path: Path) -> None:
    from support.sbatch_golden import compose_plan

    from sweep.orchestration.preflight import dry_run_text

    text = dry_run_text(compose_plan(["+machine=a100x8"], str(tmp_path / "s")))
    assert "screening first (search.screen): the candidates as one-rank trials at global_batch_size=128, 8 at a time" in text
    assert "screening" not in dry_run_text(compose_plan(["+machine=a100x8", "search.screen=off"], str(tmp_path / "t")))


def test_a_screening_sweeps_staircase_gives_spare_devices_the_retry(tmp_path: Path) -> None:
    """orchestration/: the screening sweep's strategy is made with spare_retry (its rows only nominate), the sweep's own
    is not; the confirmations are proposed from the screening rows."""
    from types import SimpleNamespace

    from support.sbatch_golden import SLURM, compose_plan

    from sweep.orchestration.orchestrator import Orchestrator
    from sweep.orchestration.screening import run_screening, screening_plan

    plan = compose_plan(["+machine=a100x8", *SLURM], str(tmp_path / "s"))
    assert Orchestrator(screening_plan(plan)).strategy.spare_retry and not Orchestrator(plan).strategy.spare_retry
    stand_in = SimpleNamespace(run=lambda: 0, results={}, stop=SimpleNamespace(signal=None, hint=lambda note, where: ""),
                               display=SimpleNamespace(log=lambda line: None))
    confirm, code = run_screening(plan, lambda sub: stand_in)
    assert code == 0 and confirm is not None and confirm.screening == {}


@pytest.mark.e2e
def test_a_second_sweep_into_a_dir_being_screened_is_refused_and_screening_names_no_answer(tmp_path: Path) -> None:
    """The sweep dir's lock is held from before screening writes anything: a second sweep into it (search.screen=off,
    which would run its full trials at once) is refused and writes nothing. The screening phase prints no
    recommendation, confidence or flags (and writes no recommendation.yaml): the sweep's answer comes once, after it."""
    import os
    import re
    import time

    from support.sweep_run import background_sweep, run_sweep

    script, sweep_dir, out_file = tmp_path / "train.py", tmp_path / "sweep", tmp_path / "first.out"
    script.write_text(GATED)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    args = [f"hydra.sweep.dir={sweep_dir}", "workload=command", f"workload.argv=[{sys.executable},{script},'{{accum}}','{{num_devices}}']",
            "global_batch_size=16", "search=grid", "accum=1,2,4", "split=1", "trial.time_limit_s=60", "search.drift_check=false",
            "machine.num_devices=2", "hydra.launcher.tasks_per_node=2"]
    first = background_sweep([*args, "search.screen=on"], tmp_path, env, out_file)
    deadline = time.monotonic() + 60
    while not (tmp_path / "screening").exists():
        assert first.poll() is None and time.monotonic() < deadline, out_file.read_text()
        time.sleep(0.05)
    second = run_sweep([*args, "search.screen=off"], tmp_path, timeout=60)
    print(second.stderr)
    assert second.returncode == 2, second.stdout + second.stderr
    assert second.stderr == f"sweep: error: another sweep is running in {sweep_dir} (lock .sweep.lock held): wait for it, or choose another hydra.sweep.dir\n"
    assert "search.screen=on" in json.loads((sweep_dir / "sweep.json").read_text())["argv"]  # the first's, not overwritten
    assert not (sweep_dir / "trials").exists()  # no full trial of the second's
    (tmp_path / "go").touch()
    assert first.wait(120) == 0, out_file.read_text()
    out = out_file.read_text()
    print(out)
    main_start = re.search(rf"^\[ *[\d.]+s\] sweep \S+: .* dir {re.escape(str(sweep_dir))}$", out, re.M)
    assert main_start, out
    screening = out[: main_start.start()]
    assert f"dir {sweep_dir / 'screening'}" in screening and "results: " in screening
    assert not re.search(r"recommended|confidence|flags:", screening), screening
    assert len(re.findall(r"^flags: ", out, re.M)) == 1
    assert not (sweep_dir / "screening" / "recommendation.yaml").exists()
    rec = yaml.safe_load((sweep_dir / "recommendation.yaml").read_text())
    assert (rec["accum"], rec["split"]) == (1, 1)
