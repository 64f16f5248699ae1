"""A command trial over several nodes, without a cluster (issue 44): the placeholders each node's launch line gets, the
one-decider protocol and how node 0 files the trial from every node's verdict (workloads/command/nodes.py), and the
steps a figure may rest on while another node's records are still on their way. The same on a real two-node
cluster: tests/test_slurm_nodes.py."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from support.results import trial_result
from support.sweep_run import run_sweep

from sweep.core.probe_report import summarise
from sweep.core.schema import Status, TrialResult
from sweep.workloads.command.nodes import STOPPED, Team, Verdict, attempt_tag, first_cause, merged
from sweep.workloads.command.probed import recorded_by_every_rank
from sweep.workloads.command.template import fill, template_fields

PRESETS = Path(__file__).resolve().parents[1] / "sweeps"
GLOO = "rank 0: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:6292"


def own(status: Status = Status.OK, error: str = "", **fields) -> TrialResult:
    return trial_result(gbs=16, devices=4, status=status, error=error, log="/t/command-1.log", host="n0", **fields)


def verdict(node: int, status: str, error: str = "", at: float = 10.0, **fields) -> Verdict:
    return Verdict(node=node, host=f"n{node}", status=status, error=error, log=f"/t/command-job7-node{node}.log", ended_at=at, **fields)


# -- placeholders: each node's launch line ------------------------------------------------------------------------


def test_nproc_per_node_is_the_ranks_of_one_node_and_num_devices_of_all():
    assert "nproc_per_node" in template_fields("--nproc_per_node={nproc_per_node}")
    line = "--nproc_per_node={nproc_per_node} --nnodes={nodes} --world={num_devices}"
    assert fill(line, {"nproc_per_node": 2, "nodes": 2, "num_devices": 4}) == "--nproc_per_node=2 --nnodes=2 --world=4"


def test_no_shipped_preset_starts_every_nodes_ranks_on_each_node():
    """{num_devices} is the total: `--nproc_per_node={num_devices}` on two nodes starts twice the ranks (the issue's 4 for 2).
    The launchers' per-node counts: torchrun's --nproc_per_node, the deepspeed launcher's --num_gpus, Lightning's
    trainer.devices (caiman-asr's own --num_gpus is its world size: {num_devices})."""
    per_node = re.compile(r"(--nproc_per_node|trainer\.devices|deepspeed [^,]*?--num_gpus)=\{(\w+)\}")
    seen = {}
    for path in PRESETS.glob("*.yaml"):
        text = json.dumps(yaml.safe_load(path.read_text()))
        for flag, placeholder in per_node.findall(text):
            seen[f"{path.stem} {flag if not flag.startswith('deepspeed') else 'deepspeed ' + flag.split()[-1]}"] = placeholder
    assert {"hf --nproc_per_node", "torchtitan --nproc_per_node", "megatron --nproc_per_node", "timm --nproc_per_node",
            "nanochat --nproc_per_node", "fairseq --nproc_per_node", "rnnt_base --nproc_per_node", "rnnt_large --nproc_per_node",
            "deepspeed deepspeed --num_gpus", "lightning trainer.devices", "nemo_micro_batch trainer.devices"} <= set(seen)
    assert {k: v for k, v in seen.items() if v != "nproc_per_node"} == {}


# The shipped presets that start one process (one device, one rank): every other joins its nodes into one world.
ONE_PROCESS_PRESETS = {"nanogpt", "my_script", "builtin_command"}


@pytest.mark.e2e
@pytest.mark.parametrize("preset", sorted(p.stem for p in PRESETS.glob("*.yaml")))
def test_every_shipped_preset_that_starts_ranks_joins_its_nodes(tmp_path, preset):
    """trainers.md says each preset that starts ranks starts one world over every node: each such preset's dry run on
    two nodes fills a node rank and node 0's host into each node's line (or env) and draws no warning; the one-process
    presets, which a second node would run as a world of its own, get the start-up warning instead."""
    proc = run_sweep(["+machine=cpu2", "machine.num_devices=4", "machine.nodes=2", f"+sweep={preset}", "hydra/launcher=submitit_slurm",
                      "dry_run=true"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    warned = "name none of {nodes}, {node_rank}, {master_addr}: each node starts the command on its own" in proc.stderr
    assert warned == (preset in ONE_PROCESS_PRESETS), proc.stderr
    if preset in ONE_PROCESS_PRESETS:
        return
    node_lines = [line for line in proc.stdout.splitlines() if line.startswith("  node ")]
    assert len(node_lines) == 2, proc.stdout
    for node, line in enumerate(node_lines):
        assert "NODE0_HOST" in line and re.search(rf"(node_rank|NODE_RANK)\W+{node}\b", line), line


@pytest.mark.e2e
def test_accum_x_devices_counts_every_ranks_micro_batches_in_the_line_and_the_flags(tmp_path):
    """nanoGPT under torchrun divides its --gradient_accumulation_steps by the world size: {accum_x_devices} gives it
    accum x num_devices, in each node's line and in the flags to paste (the argv's own tokens)."""
    from sweep.core.ranking import SweepMeta
    from sweep.core.recommendation import recommended_flags
    from sweep.parsers.presets import flags_template

    argv = ["torchrun", "--nproc_per_node={nproc_per_node}", "--nnodes={nodes}", "--node_rank={node_rank}", "--master_addr={master_addr}",
            "--master_port={master_port}", "train.py", "--batch_size={per_device_batch}", "--gradient_accumulation_steps={accum_x_devices}"]
    (tmp_path / "train.py").write_text("")
    proc = run_sweep(["+machine=cpu2", "machine.num_devices=4", "machine.nodes=2", "workload=command", f"workload.argv={json.dumps(argv)}",
                      "global_batch_size=32", "accum=2", "hydra/launcher=submitit_slurm", "dry_run=true"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    node_lines = [line for line in proc.stdout.splitlines() if line.startswith("  node ")]
    assert len(node_lines) == 2 and all(line.endswith("--batch_size=4 --gradient_accumulation_steps=8") for line in node_lines), proc.stdout
    template = flags_template("myrtle", argv)
    assert template == "--batch_size={per_device_batch} --gradient_accumulation_steps={accum_x_devices}"
    meta = SweepMeta(sweep_id="s", machine="cpu2", workload="command", global_batch_size=32, num_devices=4, flags_template=template)
    best = replace(own(), accum=2, global_batch_size=32)
    assert recommended_flags(meta, best) == "--batch_size=4 --gradient_accumulation_steps=8"


def test_the_deepspeed_preset_starts_one_world_over_every_node_without_ssh():
    """deepspeed alone (no hostfile, no --no_ssh) runs one node with master 127.0.0.1 and refuses --num_nodes>1: each node
    formed a world of its own. The preset's line is DeepSpeed's launch without ssh: node rank, node 0's host, a hostfile
    naming every node, and its per-trial files in the trial's dir under this node's name (the nodes share that dir)."""
    pytest.importorskip("deepspeed", reason="the framework extras (pip install -e .[frameworks]) install DeepSpeed")
    line = yaml.safe_load((PRESETS / "deepspeed.yaml").read_text())["workload"]["argv"][2]
    for flag in ("--no_ssh", "--num_nodes={nodes}", "--node_rank={node_rank}", "--master_addr={master_addr}", "--master_port={master_port}",
                 '--hostfile="$SWEEP_TRIAL_DIR/hostfile-node{node_rank}"', '--deepspeed_config "$SWEEP_TRIAL_DIR/ds_config-node{node_rank}.json"'):
        assert flag in line, flag
    from deepspeed.launcher.runner import parse_args

    launched = line[line.index("exec deepspeed ") + len("exec deepspeed "):]
    filled = fill(launched, {"nodes": 2, "node_rank": 1, "nproc_per_node": 2, "master_addr": "mn1", "master_port": 29400})
    args = parse_args(filled.replace('"', "").split())  # DeepSpeed's own parser reads the line as each node runs it
    assert (args.no_ssh, args.num_nodes, args.node_rank, args.num_gpus, args.master_addr, args.user_script) == (True, 2, 1, 2, "mn1", "train.py")


@pytest.mark.filterwarnings("ignore:The `srun` command is available")  # Lightning's hint, for a job run without srun
def test_the_lightning_presets_opt_out_of_lightnings_slurm_detection(monkeypatch):
    """On Slurm a command trial is one task per node: Lightning, seeing SLURM_NTASKS, takes Slurm's layout (a task a rank)
    and refuses trainer.devices=2. A job named 'interactive' is its documented opt-out; the presets' env sets it, and
    Lightning's own launcher then starts the node's ranks from MASTER_ADDR, MASTER_PORT and NODE_RANK."""
    pytest.importorskip("lightning", reason="the framework extras (pip install -e .[frameworks]) install Lightning")
    from lightning.fabric.plugins.environments import SLURMEnvironment

    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.delenv("SLURM_JOB_NAME", raising=False)
    assert SLURMEnvironment.detect()  # the assumption the presets must break
    for preset in ("lightning", "nemo_micro_batch"):
        env = yaml.safe_load((PRESETS / f"{preset}.yaml").read_text())["workload"]["env"]
        assert {"MASTER_ADDR": "{master_addr}", "MASTER_PORT": "{master_port}", "NODE_RANK": "{node_rank}"}.items() <= env.items(), preset
        monkeypatch.setenv("SLURM_JOB_NAME", env["SLURM_JOB_NAME"])
        assert not SLURMEnvironment.detect(), preset


@pytest.mark.e2e
def test_dry_run_prints_the_line_each_node_runs(tmp_path):
    proc = run_sweep(["+machine=cpu2", "machine.num_devices=4", "machine.nodes=2", "+sweep=timm", "hydra/launcher=submitit_slurm",
                      "dry_run=true"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "2 node(s) x 2 rank(s) = 4, one launcher a node" in lines[1]
    for node in (0, 1):
        assert lines[2 + node].startswith(f"  node {node}: torchrun --nproc_per_node=2 --nnodes=2 --node_rank={node} "
                                          "--master_addr=NODE0_HOST --master_port=TRIAL_PORT train.py"), lines


def test_a_command_task_layout_error_names_the_per_node_placeholder():
    from sweep.errors import SweepError
    from sweep.launch.backend import check_task_layout

    with pytest.raises(SweepError, match=r"torchrun --nproc_per_node=\{nproc_per_node\}\); set hydra.launcher.tasks_per_node=1"):
        check_task_layout({"tasks_per_node": 3, "nodes": 2}, 8, 2, one_launcher_per_node=True)


# -- one decider ----------------------------------------------------------------------------------------------------


def test_node_0_decides_and_the_other_nodes_obey_and_report(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    tag = attempt_tag("7")
    assert tag == "7r1"  # a requeued job never reads the run before it
    zero, one = Team(tmp_path, tag, 0, 2), Team(tmp_path, tag, 1, 2)
    assert one.stop_reason() == "" and zero.verdicts() == {}
    zero.decide("measured enough")
    zero.decide("node 0's command ended (exit status -15)")  # once decided, the first reason stands
    assert one.stop_reason() == "measured enough"
    assert json.loads((tmp_path / "stop-job7r1.json").read_text())["at"] == zero.decided_at
    # Node 1's ranks died of node 0's stop before node 1 saw it: the failure followed the decision.
    reported = one.report(own(Status.FAILED, GLOO), "", time.time())
    assert (reported.status, reported.saw_stop) == (STOPPED, True)
    assert zero.wait_for_verdicts(timeout=1) == {1: reported}


def test_a_failure_before_node_0_decided_anything_is_evidence(tmp_path):
    zero, one = Team(tmp_path, "7", 0, 2), Team(tmp_path, "7", 1, 2)
    crashed_at = time.time() - 1.0
    # Node 0's ranks died of node 1's crash and its command ended first: it tells node 1 to stop, deciding nothing.
    zero.decide("node 0's command ended (exit status 1)", decided=False)
    assert zero.decided_at is None and one.stop_reason() == "node 0's command ended (exit status 1)"
    reported = one.report(own(Status.FAILED, "rank 3: RuntimeError: bad shard 7"), "", crashed_at)
    assert (reported.status, reported.saw_stop) == ("failed", False)


def test_a_decision_made_after_a_nodes_command_ended_did_not_end_it(tmp_path):
    zero, one = Team(tmp_path, "7", 0, 2), Team(tmp_path, "7", 1, 2)
    crashed_at = time.time() - 1.0
    zero.decide("measured enough")  # too late to have caused it (a shared file system showed it late)
    assert one.report(own(Status.FAILED, "rank 3: RuntimeError: bad shard 7"), "", crashed_at).status == "failed"


def test_an_oom_a_node_reports_after_the_stop_is_still_an_oom(tmp_path):
    zero, one = Team(tmp_path, "7", 0, 2), Team(tmp_path, "7", 1, 2)
    zero.decide("measured enough")
    reported = one.report(own(Status.OOM, "rank 2: DefaultCPUAllocator: can't allocate memory", oom_module="module.joint"), "", 1.0)
    assert (reported.status, reported.oom_module) == ("oom", "module.joint")


def test_a_failed_node_is_seen_by_node_0_while_its_command_runs(tmp_path):
    zero, one = Team(tmp_path, "7", 0, 3), Team(tmp_path, "7", 1, 3)
    one.report(own(Status.FAILED, "rank 2: RuntimeError: bad shard 7"), "", 1.0)
    peer = zero.failed_peer()
    assert (peer.node, peer.error) == (1, "rank 2: RuntimeError: bad shard 7")
    assert zero.failed_peer() is None  # read at most every PEER_READ_EVERY_S


# -- node 0 files the trial from every node's verdict --------------------------------------------------------------


def test_an_oom_on_node_1_is_the_trials_oom_with_node_1s_module_and_log():
    mine = own(Status.FAILED, GLOO)
    got = merged(mine, {1: verdict(1, "oom", "rank 2: DefaultCPUAllocator: can't allocate memory", oom_phase="joint", oom_module="module.joint")},
                 2, decided=False, own_ended_at=9.0, for_peer=None)
    assert (got.status, got.oom_phase, got.oom_module) == (Status.OOM, "joint", "module.joint")
    assert got.error == "node 1 (n1): rank 2: DefaultCPUAllocator: can't allocate memory" and got.log == "/t/command-job7-node1.log"


def test_an_oom_counts_even_after_node_0_decided():
    measured = own(Status.OK, throughput=100.0, step_times_s=[0.16] * 8, stopped_early="measured enough")
    got = merged(measured, {1: verdict(1, "oom", "rank 3: out of memory")}, 2, decided=True, own_ended_at=9.0, for_peer=None)
    assert got.status == Status.OOM and got.throughput is None and got.step_times_s == [] and got.stopped_early == ""


def test_a_crash_is_the_error_that_started_it_not_the_broken_connections_after():
    # Node 0's ranks ended first here (gloo noticed at once), node 1's launcher a little later: the cause still wins.
    got = merged(own(Status.FAILED, GLOO), {1: verdict(1, "failed", "rank 3: RuntimeError: bad shard 7", at=12.0)}, 2,
                 decided=False, own_ended_at=9.0, for_peer=None)
    assert (got.status, got.error, got.log) == (Status.FAILED, "node 1 (n1): rank 3: RuntimeError: bad shard 7", "/t/command-job7-node1.log")
    # Node 0's own crash stands over node 1's broken connection.
    mine = own(Status.FAILED, "rank 1: ValueError: bad config")
    assert merged(mine, {1: verdict(1, "failed", GLOO, at=8.0)}, 2, decided=False, own_ended_at=9.0, for_peer=None) is mine


def test_what_follows_node_0s_decision_is_not_evidence():
    mine = own(Status.OK, throughput=100.0, step_times_s=[0.16] * 8, stopped_early="cannot beat the leader")
    assert merged(mine, {1: verdict(1, "failed", GLOO)}, 2, decided=True, own_ended_at=9.0, for_peer=None) is mine
    assert merged(mine, {1: verdict(1, STOPPED, "cannot beat the leader")}, 2, decided=False, own_ended_at=9.0, for_peer=None) is mine


def test_ranks_that_lost_their_peers_when_node_0s_run_ended_are_no_failure():
    finished = own(Status.OK, throughput=100.0, step_times_s=[0.16] * 8)
    assert merged(finished, {1: verdict(1, "failed", GLOO)}, 2, decided=False, own_ended_at=9.0, for_peer=None) is finished
    crashed = merged(finished, {1: verdict(1, "failed", "rank 3: RuntimeError: bad shard 7")}, 2, decided=False, own_ended_at=9.0, for_peer=None)
    assert crashed.status == Status.FAILED and crashed.throughput is None


def test_node_0_stopped_for_a_failed_node_files_that_nodes_failure():
    peer = verdict(1, "failed", "rank 2: RuntimeError: bad shard 7")
    stopped = own(Status.CANCELLED, "stopped: killed by SIGTERM (exit status -15)")
    got = merged(stopped, {1: peer}, 2, decided=False, own_ended_at=9.0, for_peer=peer)
    assert got.status == Status.FAILED and got.error.startswith("node 1 (n1): rank 2: RuntimeError")


def test_a_crash_on_node_1_that_ended_before_node_0_decided_is_still_the_trials_crash(tmp_path):
    """Node 1's rank crashed; node 0 decided (measured enough) before it next looked for failed nodes: the decision did
    not cause that crash, which node 1 ended before it saw the decision. It is filed, not node 0's partial figure."""
    zero, one = Team(tmp_path, "7", 0, 2), Team(tmp_path, "7", 1, 2)
    crashed_at = time.time() - 0.5
    zero.decide("measured enough")
    node1_record = replace(own(Status.FAILED, "rank 3: RuntimeError: bad shard 7"), host="n1", log="/t/command-job7-node1.log")
    reported = one.report(node1_record, "", crashed_at)
    assert (reported.status, reported.saw_stop) == ("failed", False)
    measured = own(Status.OK, throughput=100.0, step_times_s=[0.16] * 8, stopped_early="measured enough")
    got = merged(measured, {1: reported}, 2, decided=True, own_ended_at=time.time(), for_peer=None)
    assert (got.status, got.error, got.log) == (Status.FAILED, "node 1 (n1): rank 3: RuntimeError: bad shard 7", "/t/command-job7-node1.log")
    assert got.throughput is None and got.stopped_early == ""
    # The time limit decided it: node 1's earlier crash is why node 0's ranks hung, not the timeout.
    timed_out = own(Status.TIMEOUT, "still running after trial.time_limit_s=60s; stopped")
    assert merged(timed_out, {1: reported}, 2, decided=True, own_ended_at=time.time(), for_peer=None).status == Status.FAILED
    # Broken connections node 1 did not see the stop for still follow a peer (node 0's stop): no evidence.
    assert merged(measured, {1: verdict(1, "failed", GLOO)}, 2, decided=True, own_ended_at=9.0, for_peer=None) is measured


def test_the_records_memory_is_the_largest_peak_and_smallest_headroom_of_any_node(tmp_path):
    """Node 0's sampler sees its own node's processes only: node 1's heavier ranks are in node 1's verdict."""
    zero, one = Team(tmp_path, "7", 0, 2), Team(tmp_path, "7", 1, 2)
    zero.decide("measured enough")
    one.report(own(Status.OK, peak_mem_gib=1.9, capacity_gib=23.5, headroom=1 - 1.9 / 23.5), "measured enough", time.time())
    node1 = zero.wait_for_verdicts(timeout=1)[1]  # through the verdict file, as on a cluster
    assert (node1.peak_mem_gib, node1.capacity_gib) == (1.9, 23.5)
    mine = own(Status.OK, throughput=100.0, step_times_s=[0.16] * 8, peak_mem_gib=0.8, capacity_gib=23.5, headroom=1 - 0.8 / 23.5)
    got = merged(mine, {1: node1}, 2, decided=True, own_ended_at=9.0, for_peer=None)
    assert (got.peak_mem_gib, got.capacity_gib, got.headroom) == (1.9, 23.5, pytest.approx(1 - 1.9 / 23.5))
    assert got.throughput == 100.0  # node 0's figure stands
    # Filed from node 1's OOM, node 0's larger peak still counts; a node with no reading changes nothing.
    oom = verdict(1, "oom", "rank 2: out of memory", peak_mem_gib=0.5, capacity_gib=23.5, headroom=1 - 0.5 / 23.5)
    got = merged(own(Status.FAILED, GLOO, peak_mem_gib=0.8, capacity_gib=23.5, headroom=0.9), {1: oom, 2: verdict(2, STOPPED)}, 3,
                 decided=False, own_ended_at=9.0, for_peer=None)
    assert (got.status, got.peak_mem_gib, got.headroom) == (Status.OOM, 0.8, 0.9)


def test_a_missing_verdict_is_said():
    got = merged(own(Status.FAILED, GLOO), {1: verdict(1, "failed", "rank 3: RuntimeError: bad shard 7")}, 3, decided=False,
                 own_ended_at=9.0, for_peer=None)
    assert got.error.endswith("(no verdict came from node(s) 2 within 20 s)")


def test_the_first_cause_in_a_nodes_log_is_found_past_its_other_ranks_consequences():
    tail = "\n".join([
        "[rank3]: Traceback (most recent call last):", "[rank3]:   File \"train.py\", line 9, in forward",
        "[rank3]: RuntimeError: bad shard 7",
        "[rank2]: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:6292",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    ])
    assert first_cause("rank 2: RuntimeError: [gloo] Connection closed by peer", tail) == "rank 3: RuntimeError: bad shard 7"
    assert first_cause("rank 1: ValueError: x", tail) == "rank 1: ValueError: x"  # a cause already: left as it is
    assert first_cause(GLOO, "[rank0]: " + GLOO.split(": ", 1)[1]) == GLOO  # nothing else to find


# -- the steps a figure rests on -------------------------------------------------------------------------------------


def _steps(per_rank: dict[int, list[float]]) -> dict[str, list[dict]]:
    return {f"rank{r}.jsonl": [{"kind": "start", "world_size": len(per_rank)}] + [
        {"kind": "step", "step": i, "seconds": s, "rank": r} for i, s in enumerate(times)] for r, times in per_rank.items()}


def test_steps_another_node_has_not_recorded_yet_are_not_timed():
    """Node 0's two ranks are 6 steps ahead of node 1's (records that land later): those steps are node 0's pace alone."""
    report = summarise(_steps({0: [0.02] * 10, 1: [0.02] * 10, 2: [0.1] * 4, 3: [0.1] * 4}))
    assert recorded_by_every_rank(report) == [0.1] * 4
    # A rank that armed late never records its first step: the steps before the last whole one stay.
    late = summarise(_steps({0: [0.05] * 5, 1: [0.05] * 5}) | {"rank1.jsonl": [{"kind": "step", "step": i, "seconds": 0.05, "rank": 1}
                                                                                 for i in range(1, 5)]})
    assert recorded_by_every_rank(late) == [0.05] * 5
