"""Sweep any training script: run an argv template as one trial and read its log.

The command runs as an argv list, never through a shell, and its placeholders take
only the validated integers of the candidate, so no config value can inject a
command. Throughput comes from the log as it grows (sweep.parsers); failures are
classified from the log tail and the exit status.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep.core.config import memory_margin
from sweep.core.schema import Status, TrialResult, now_iso
from sweep.core.spec import TrialSpec
from sweep.launch.memory import TreeMemorySampler, is_tight
from sweep.launch.tree import PROCESSES_FILE, TreeTracker, become_subreaper, end_processes
from sweep.records import write_result
from sweep.workloads.command.follow import Enough, Obey, follow, live_throughput, measured_step_times, timed_so_far  # noqa: F401 (live_throughput: re-exported)
from sweep.workloads.command.launching import attempt_log, command_env, launch_values, nproc_per_node
from sweep.workloads.command.launching import job_id as _job_id
from sweep.workloads.command.nodes import BACKSTOP_S, Team, attempt_tag, describe, first_cause, merged
from sweep.workloads.command.template import PLACEHOLDERS, check_template, fill, missing_paths, pair_values, template_fields  # noqa: F401 (re-exported)


def run_command_trial(spec: TrialSpec) -> TrialResult:
    """Run the user's command for one candidate (one launcher on each node) and write the trial's result record."""
    from sweep.launch import evidence
    from sweep.parsers import LogTail, parser_settings

    wl = spec.workload
    trial_dir = Path(spec.trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    launch = launch_values(spec)
    node, nodes = int(launch["node_rank"]), int(launch["nodes"])
    writes = node == 0
    # Several nodes: node 0 decides when the trial stops and files it from every node's verdict (nodes.py).
    team = Team(trial_dir, attempt_tag(_job_id() or str(os.getpid())), node, nodes) if nodes > 1 else None
    values = {**pair_values(spec.numbers()), **launch}
    argv = [fill(a, values) for a in wl.argv]
    env = command_env(spec, {k: fill(str(v), values) for k, v in (wl.env or {}).items()})
    cwd = wl.cwd or os.getcwd()
    log_path = attempt_log(trial_dir, node, team.tag if team is not None else "")
    settings = parser_settings(wl.parser)  # the preset's warm-up, unit and scope; checked before launch
    parser = settings.make_parser()
    gbs = values["global_batch_size"]
    context = settings.context(global_batch_size=gbs, num_devices=values["num_devices"], accum=values["accum"])
    summarize = functools.partial(settings.summarize, global_batch_size=gbs, num_devices=values["num_devices"], accum=values["accum"])
    probe = _probe_follower(spec, trial_dir, log_path, settings, team) if getattr(wl, "probe", False) else None
    if probe is not None:
        from sweep.probe import probe_env

        env.update(probe_env(probe.record_dir, base_env=env, accum=int(spec.accum)))
    limit = float(spec.trial.time_limit_s)
    started_at, t0 = now_iso(), time.monotonic()
    base: dict[str, Any] = dict(**spec.numbers(), log=str(log_path), job_id=_job_id(), host=socket.gethostname(), device="command", started_at=started_at, fingerprint=spec.fingerprint)
    missing = missing_paths(argv, cwd)  # checked before launch where trials run here; on a cluster, here on the node
    if missing:
        result = TrialResult(status=Status.FAILED, error=missing, finished_at=now_iso(), **base)
        if team is not None and node > 0:
            team.report(result, "", time.time())  # node 0 sees it and stops its own command, which waits for this node's
            return result
        if team is not None:
            team.decide(missing)  # the other nodes' commands would wait for this one's ranks until the time limit
        return _finish(spec, trial_dir, result, writes=writes)
    print(f"accum={values['accum']} split={values['split']}: running {argv} in {cwd}; log {log_path}", flush=True)

    # Orphans of the command (a `setsid` child, a double fork) come back to this process, which
    # records every descendant as it appears and ends them all when the trial ends, however it ends.
    become_subreaper()
    tracker = TreeTracker(trial_dir / PROCESSES_FILE if writes else None).start()
    oom_kills_before = evidence.oom_kill_count()
    enough: Enough | Obey = Enough(spec.trial, settings.skip_first, settings.stop_after, functools.partial(timed_so_far, summarize=summarize, global_batch_size=gbs), probe,
                     team)
    if team is not None and node > 0:
        # Obeys node 0's decision alone; stops on its own only well past the time limit (node 0 gone).
        enough, limit = Obey(team), limit + BACKSTOP_S
    live_rate = functools.partial(live_throughput, context=context, unit=settings.throughput_unit)
    with open(log_path, "ab") as log:
        # A new session, so a stop reaches the whole process group (dataloader workers, ranks) at once.
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        tracker.poll()
        tail = LogTail(log_path)
        sampler = _memory_sampler(proc.pid, spec, nodes).start()
        try:
            measurements, timed_out, stopped_early = follow(proc, tail, parser, trial_dir, enough, limit, t0, live_rate,
                                                             functools.partial(_stop_trial, proc, tracker, team))
        except BaseException:
            # Interrupted (the sweep cancelled this job): never leave the training command behind.
            _stop_trial(proc, tracker, team, "the job was cancelled")
            sampler.stop()
            raise
        for chunk in tail.drain():  # to the end of the file: the last figures are often the ones that count
            measurements += parser.feed(chunk)
        measurements += parser.close()
    code = proc.wait()
    ended_at = time.time()
    memory = sampler.stop()
    # Whatever the command left behind (forked or setsid children); node 0's command ended by itself: so do the others'.
    _stop_trial(proc, tracker, team, f"node 0's command ended (exit status {code})", decided=False)
    if probe is not None:
        report = probe.poll(force=True, running=False)
        for why in getattr(report, "left_out", None) or []:  # steps that were not the training's (core/training_window.py)
            print(f"accum={values['accum']} split={values['split']}: not timed as the training: {why}", flush=True)

    base.update(
        finished_at=now_iso(), wall_s=round(time.monotonic() - t0, 3),
        peak_mem_gib=memory.peak_gib, capacity_gib=memory.capacity_gib, headroom=memory.headroom,
    )
    if probe is not None:
        base.update(probe.memory_fields(spec.machine.device, float(spec.machine.memory_gib) if spec.machine.device == "cuda" and spec.machine.memory_gib is not None else None))
        base.update(probe.provenance_fields())
    peer = team.peer if team is not None and node == 0 else None  # node 0's Enough holds this team
    ended = _Ended(code, timed_out, "" if peer is not None else stopped_early, memory, set(tracker.seen) | {proc.pid}, oom_kills_before)
    if team is not None and node > 0:
        return _report(spec, settings, probe, ended, base, log_path, team, stopped_early, ended_at)
    result = _result(spec, settings, _summary(summarize, measurements), probe, ended, base, log_path)
    if team is not None:
        verdicts = team.wait_for_verdicts()
        print(f"accum={values['accum']} split={values['split']}: the other nodes: {describe(verdicts) or 'no verdict'}", flush=True)
        result = merged(result, verdicts, nodes, decided=timed_out or (bool(stopped_early) and peer is None), own_ended_at=ended_at, for_peer=peer)
    return _finish(spec, trial_dir, result, writes=writes)


def _report(spec: TrialSpec, settings: Any, probe: Any, ended: _Ended, base: dict[str, Any], log_path: Path, team: Team, stopped: str,
            ended_at: float) -> TrialResult:
    """Node k > 0: its verdict for node 0 (nodes.py), not the trial's record. Only a failure is classified: the
    figures, and the checks they must pass, are node 0's, which reads every node's probe records."""
    if ended.code != 0 and not stopped and not ended.timed_out:
        result = _result(spec, settings, (None, ""), probe, ended, base, log_path)
    elif ended.timed_out:
        result = TrialResult(status=Status.TIMEOUT, error=f"no word from node 0 for {BACKSTOP_S:g} s past trial.time_limit_s; stopped", **base)
    else:
        result = TrialResult(status=Status.OK, **base)
    verdict = team.report(result, stopped, ended_at)
    print(f"accum={spec.accum} split={spec.split}: node {team.node}: {verdict.status} {verdict.error}", flush=True)
    return result


@dataclass
class _Ended:
    """How the command ended, and what is known about its memory if it was killed."""

    code: int
    timed_out: bool
    stopped_early: str  # "" (ended by itself), Enough.REASON, or racing's reason
    memory: Any  # the sampler's MemoryReading
    pids: set[int]  # every process of the trial's tree
    oom_kills_before: int | None


def _summary(summarize: Any, measurements: list[Any]) -> tuple[Any, str]:
    """(the log's summary, or None, and why not: ": <reason>" or "")."""
    from sweep.errors import ThroughputError

    if not measurements:
        return None, ""
    try:
        return summarize(measurements), ""
    except ThroughputError as e:
        return None, f": {e}"


def _result(spec: TrialSpec, settings: Any, log_summary: tuple[Any, str], probe: Any, ended: _Ended, base: dict[str, Any], log_path: Path) -> TrialResult:
    """The trial's record: measured by the probe where it timed steps, else from the log; failures classified."""
    from sweep.launch import evidence
    from sweep.parsers import KillEvidence, classify_failure, read_tail

    limit = float(spec.trial.time_limit_s)
    summary_or_none, why_not = log_summary
    probe_times = probe.timed() if probe is not None else []
    if ended.timed_out:
        return TrialResult(status=Status.TIMEOUT, error=f"still running after trial.time_limit_s={limit:g}s; stopped", **base)
    if ended.code == 0 or ended.stopped_early:
        if probe_times:
            result = TrialResult(status=Status.OK, measured_by="probe", **probe.ok_fields(), **base)
            summary = summary_or_none
            if summary is not None and summary.unit == result.throughput_unit:
                result.log_throughput = summary.value  # the cross-check core/validity.py makes
                from sweep.core.validity import agreement_note

                note = agreement_note(result)  # a gap no unit explains: the probe's figure stands, and the log says so
                if note:
                    print(f"accum={spec.accum} split={spec.split}: {note}", flush=True)
        elif summary_or_none is not None:
            result = _ok_result(base, summary_or_none)
            result.measured_by = "log"
        else:
            from sweep.parsers.formats import DEFAULT_PARSER_TYPE

            note = "" if probe is None else f"; {probe.no_figure_note()}"
            # The default parser is not the user's choice: name it only where they chose it.
            reader = "its log parser (workload.parser)" if settings.type == DEFAULT_PARSER_TYPE else f"the {settings.type} parser"
            return TrialResult(
                status=Status.FAILED, error=f"exited 0 but printed no throughput {reader} recognises{why_not}{note}; see {log_path}", **base
            )
        if ended.stopped_early not in ("", Enough.REASON):
            result.stopped_early = ended.stopped_early  # racing: the orchestrator's reason
        return result
    kill = None
    if ended.code in (-9, 137):
        kill = KillEvidence(
            oom_kills=_rise(ended.oom_kills_before, evidence.oom_kill_count()),
            kernel_oom=evidence.kernel_log_names_oom(ended.pids),
            peak_fraction=_peak_fraction(ended.memory),
        )
    tail = read_tail(log_path)
    verdict = classify_failure(tail, exit_code=ended.code, phase_patterns=spec.workload.phase_patterns, kill_evidence=kill)
    status = verdict.status if verdict.status != Status.OK else Status.FAILED
    # A crash is the error that started it, not the broken connections of the ranks it took down (nodes.py).
    reason = first_cause(verdict.reason, tail) if status == Status.FAILED else verdict.reason
    result = TrialResult(status=status, oom_phase=verdict.oom_phase, error=reason, **base)
    oom = probe.oom() if probe is not None else None
    if oom is not None:
        from sweep.probe import oom_phase_of

        if status == Status.OOM:
            # The probe saw where: the module that was running, whatever the traceback's frames say.
            result.oom_phase = oom_phase_of(oom.module) or result.oom_phase
            result.error = f"{verdict.reason} (probe: in {oom.module or 'no module'} during {oom.where}, step {oom.step}, rank {oom.rank})"
    return result


def _probe_follower(spec: TrialSpec, trial_dir: Path, log_path: Path, settings: Any, team: Team | None) -> Any:
    from sweep.parsers.throughput import SAMPLES_PER_S, BatchContext, output_unit
    from sweep.workloads.command.probed import ProbeFollower, other_nodes_glob, probe_dir

    figure = settings.prefer[0] if settings.prefer else settings.parser_spec.get("unit", SAMPLES_PER_S)
    unit = output_unit(figure, BatchContext(tokens_per_sample=settings.tokens_per_sample), settings.throughput_unit)
    return ProbeFollower(
        probe_dir(trial_dir, log_path), int(spec.trial.warmup_steps), int(spec.global_batch_size), settings.tokens_per_sample, unit,
        accum=int(spec.accum), other_nodes_glob=other_nodes_glob(team.tag) if team is not None and team.node == 0 else "",
    )


def _finish(spec: TrialSpec, trial_dir: Path, result: TrialResult, writes: bool) -> TrialResult:
    """Check the figure (core/validity.py) and write the trial's record (node 0's launcher alone: the trial
    dir is shared by every node)."""
    from sweep.core.validity import validated

    validated(result)
    result.tight = is_tight(result.status == Status.OK, result.headroom, memory_margin(spec.trial, spec.machine))
    if writes:
        write_result(result, trial_dir)
    print(f"accum={spec.accum} split={spec.split}: {result.status} {result.error}", flush=True)
    return result


def _rise(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else max(0, after - before)


def _peak_fraction(memory: Any) -> float | None:
    """Sampled peak over the capacity it is held to (on CPU, the host's memory)."""
    import psutil

    if memory.peak_gib is None:
        return None
    capacity = memory.capacity_gib or psutil.virtual_memory().total / 1024**3
    return float(memory.peak_gib) / capacity if capacity else None


def _memory_sampler(pid: int, spec: TrialSpec, nodes: int) -> TreeMemorySampler:
    """GPU profile: NVML, else the emulated cards. CPU profile: resident memory against the host's, even
    on a host with GPUs, since nothing holds a user's command to machine.memory_gib there.

    It sees this node's processes only, so on CUDA it is held to this node's devices (node 0 takes the tightest
    node's reading: nodes.merged)."""
    if spec.machine.device == "cuda":
        emulated = spec.machine.memory_gib  # None: the card's own (NVML), no budget being set
        return TreeMemorySampler(pid, capacity_gib=float(emulated) * nproc_per_node(spec.num_devices, nodes) if emulated else None)
    return TreeMemorySampler(pid, capacity_gib=None, nvml_factory=lambda: None)


def _ok_result(base: dict[str, Any], summary: Any) -> TrialResult:
    """The median of the post-warm-up figures, its 95% interval and unit, as sweep.parsers summarised them."""
    return TrialResult(
        status=Status.OK, step_times_s=measured_step_times(summary, base["global_batch_size"]), throughput=summary.value,
        throughput_low=summary.low, throughput_high=summary.high, throughput_unit=summary.unit,
        steps_measured=summary.measured, warmup_steps=summary.warmup, **base,
    )


def _stop_trial(proc: subprocess.Popen, tracker: TreeTracker, team: Team | None, why: str, decided: bool = True) -> None:
    """End this node's command; on node 0 of several, the trial's decision first, so that no node ends another's ranks first."""
    if team is not None:
        team.decide(why, decided)
    _stop(proc, tracker)


def _stop(proc: subprocess.Popen, tracker: TreeTracker) -> None:
    """End the command and everything it started: its process group, then every descendant ever seen."""
    import signal

    if proc.poll() is None:  # once it is reaped, its pid (and group id) may be another's: the tracker has its group
        try:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=3.0)
        except subprocess.TimeoutExpired:
            pass
    tracker.stop()
    end_processes(tracker.seen.items())
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass
