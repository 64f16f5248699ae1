"""A command trial over several nodes: one decider, and every node's verdict.

Each node's launcher runs the command on its own node (launching.py). Had each decided for itself when to
stop, a node that had measured enough would end its ranks while the others' were mid-step, and theirs would
die of the broken connections. So node 0's launcher alone decides (measured enough, racing's or the
decision's stop.json, the time limit, another node's failure) and writes its decision here before it stops
its own ranks; the other nodes' launchers obey it, and no node ends another's ranks first.

Each node k > 0 writes its verdict: how its command ended, classified from its own log and its own probe
records (an OOM with its module and message), that log's path, and the memory its launcher saw on its node.
Node 0 waits briefly for them and files the trial from the worst evidence over every node (merged): an OOM on
any node is the trial's OOM, with that node's phase, module, message and log; a crash is the node's whose error
started it, not the broken peer connections on the nodes it took down with it; the record's log is the one that
holds that error; its memory is the largest peak and the smallest headroom of any node.

Files, beside the attempt's logs in the trial dir (the tag is the job id, and Slurm's restart count once
requeued, so a requeued job never reads the run before it):
  stop-job<tag>.json             node 0's word to stop: {"reason", "at", "decided"} (decided: false where node 0's
                                 command ended by itself, which decides nothing about the others' failures)
  verdict-job<tag>-node<k>.json  node k's verdict (Verdict)
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from sweep.core.schema import OK, OOM, OomPhase, Status, TrialResult
from sweep.records import atomic_write_text

VERDICT_WAIT_S = 20.0  # node 0's wait for the others' verdicts once its own command ended (theirs: a stop, up to 3 s, then a drain)
BACKSTOP_S = 60.0  # a node k > 0 stops on its own only this long past trial.time_limit_s: node 0 is gone
PEER_READ_EVERY_S = 1.0  # node 0 looks for a failed node's verdict this often while its command runs
STOPPED = "stopped"  # a node's verdict when node 0's decision ended its command
# What follows another node's failure rather than causing it: a collective or the rendezvous store finding its
# peer gone (gloo, NCCL, c10d), a broken connection, the launcher's signal. The classifier's list of what follows
# a rank's OOM (parsers/classify.py) says the same of any failure.
_PEER_CONSEQUENCE = re.compile(
    r"DistBackendError|DistNetworkError|DistStoreError|NCCL (?:error|communicator)|\bnccl\w*Error"
    r"|Watchdog caught collective|ProcessGroup(?:NCCL|Gloo)|\bgloo\b|\[c10d\]|Rendezvous\w*Error"
    r"|Connection (?:closed|reset|refused)|ConnectionResetError|BrokenPipeError|SignalException|killed by SIGTERM"
)


@dataclass(frozen=True)
class Verdict:
    """How one node's command ended, in that node's own words."""

    node: int
    host: str
    status: str  # ok, "stopped" (node 0's decision ended it), oom, failed, timeout, cancelled
    error: str  # one line; "" for ok
    log: str  # that node's command log
    ended_at: float  # time.time() when its command ended
    oom_phase: str | None = None
    oom_module: str = ""
    saw_stop: bool = False  # node 0 had decided to stop before this command ended: what failed then followed it
    # This node's memory as its own record has it (the sampled tree on CPU; on CUDA the probe's per-device peak):
    # node 0 alone sees only its own node's processes and allocators.
    peak_mem_gib: float | None = None
    capacity_gib: float | None = None
    headroom: float | None = None

    @property
    def failed(self) -> bool:
        return self.status not in (OK, STOPPED)

    @property
    def follows_a_peer(self) -> bool:
        return bool(_PEER_CONSEQUENCE.search(self.error))


def attempt_tag(job_id: str) -> str:
    """The job id, with Slurm's restart count once requeued (the nodes of one attempt agree on it)."""
    restarts = os.environ.get("SLURM_RESTART_COUNT", "")
    return f"{job_id}r{restarts}" if restarts.isdigit() and int(restarts) > 0 else job_id


class Team:
    """One node's view of the trial's nodes: node 0 decides and merges, the others obey and report."""

    def __init__(self, trial_dir: Path, tag: str, node: int, nodes: int) -> None:
        self.trial_dir, self.tag, self.node, self.nodes = Path(trial_dir), tag, int(node), int(nodes)
        self.decided_at: float | None = None
        self.peer: Verdict | None = None  # the failed node node 0 stopped the trial for
        self._peer_read_at = 0.0

    @property
    def stop_path(self) -> Path:
        return self.trial_dir / f"stop-job{self.tag}.json"

    def verdict_path(self, node: int) -> Path:
        return self.trial_dir / f"verdict-job{self.tag}-node{node}.json"

    # -- node 0

    def decide(self, reason: str, decided: bool = True) -> None:
        """Node 0: the trial stops, for every node. Written before node 0 stops its own ranks, so a node whose
        ranks die of that stop finds the decision there, made before its command ended. decided=False: node 0's
        command ended by itself, and the others are only told to end theirs."""
        if self.node != 0 or self.stop_path.exists():
            return
        at = time.time()
        if decided:
            self.decided_at = at
        atomic_write_text(self.stop_path, json.dumps({"reason": reason, "at": at, "decided": decided}) + "\n")

    def failed_peer(self) -> Verdict | None:
        """Node 0, while its command runs: a node whose command ended in failure (its ranks may hang on it)."""
        now = time.monotonic()
        if now - self._peer_read_at < PEER_READ_EVERY_S:
            return None
        self._peer_read_at = now
        return next((v for v in self.verdicts().values() if v.failed and not v.saw_stop), None)

    def verdicts(self) -> dict[int, Verdict]:
        found: dict[int, Verdict] = {}
        for node in range(1, self.nodes):
            try:
                data = json.loads(self.verdict_path(node).read_text())
                found[node] = Verdict(**{k: data[k] for k in Verdict.__dataclass_fields__ if k in data})
            except (OSError, ValueError, TypeError, KeyError):
                continue  # not there yet (written atomically: unreadable means not yet)
        return found

    def wait_for_verdicts(self, timeout: float = VERDICT_WAIT_S) -> dict[int, Verdict]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.verdicts()
            if len(found) >= self.nodes - 1 or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    # -- nodes k > 0

    def stop_reason(self) -> str:
        """Node 0's word to stop, or "" while there is none."""
        stop = self._stop()
        return "" if stop is None else str(stop.get("reason") or "stopped by node 0")

    def _stop(self) -> dict[str, Any] | None:
        try:
            stop = json.loads(self.stop_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # written atomically: unreadable means a foreign file, still a word to stop
        return stop if isinstance(stop, dict) else {}

    def report(self, result: TrialResult, stopped: str, ended_at: float) -> Verdict:
        """Node k: its verdict from its own record of its command, written for node 0. stopped: node 0's word, which
        this node's launcher obeyed (its command's end is then no evidence)."""
        stop = self._stop()
        at = stop.get("at") if stop else None
        saw_stop = bool(stop is not None and stop.get("decided", True) and (not isinstance(at, (int, float)) or at <= ended_at))
        status, error = str(result.status), result.error
        if stopped or (saw_stop and result.status != OOM):
            # Ended by node 0's decision (or its ranks died of it): no evidence against the trial. An OOM stays one.
            status, error = STOPPED, stopped or f"ended after node 0 stopped the trial ({result.error})"
        elif result.status == Status.OK:
            status, error = OK, ""
        verdict = Verdict(node=self.node, host=result.host, status=status, error=error, log=result.log, ended_at=ended_at,
                          oom_phase=str(result.oom_phase) if result.oom_phase else None, oom_module=result.oom_module, saw_stop=saw_stop,
                          peak_mem_gib=result.peak_mem_gib, capacity_gib=result.capacity_gib, headroom=result.headroom)
        atomic_write_text(self.verdict_path(self.node), json.dumps(asdict(verdict)) + "\n")
        return verdict


def merged(own: TrialResult, verdicts: dict[int, Verdict], nodes: int, *, decided: bool, own_ended_at: float, for_peer: Verdict | None) -> TrialResult:
    """Node 0's record of the trial from its own record and every other node's verdict: the worst evidence, and the
    memory over every node.

    decided: node 0 stopped the trial itself (measured enough, racing, the time limit): what the other nodes'
    ranks did after that is its doing, an OOM aside. for_peer: the failed node node 0 stopped its own ranks for
    (its own record is then of that stop, not evidence)."""
    others = [verdicts[k] for k in sorted(verdicts) if 0 < k < nodes]
    filed = _worst_evidence(own, others, nodes, decided=decided, own_ended_at=own_ended_at, for_peer=for_peer)
    return _memory_over_nodes(filed, own, others)


def _worst_evidence(own: TrialResult, others: list[Verdict], nodes: int, *, decided: bool, own_ended_at: float,
                    for_peer: Verdict | None) -> TrialResult:
    mine = [] if for_peer is not None else [Verdict(
        node=0, host=own.host, status=str(own.status), error=own.error, log=own.log, ended_at=own_ended_at,
        oom_phase=str(own.oom_phase) if own.oom_phase else None, oom_module=own.oom_module,
    )]
    everyone = mine + others
    ooms = [v for v in everyone if v.status == OOM]
    if ooms:
        return _filed_as(own, min(ooms, key=lambda v: v.ended_at))
    failures = [v for v in everyone if v.failed and not v.saw_stop]
    if decided:
        # Node 0 stopped the trial itself: node 0's own end (a time limit, its stopped ranks) and the broken connections
        # that stop caused are its doing. Another node's own failure, ended before it saw the decision, is not: a crash
        # node 0 had not read yet when it decided (it looks every PEER_READ_EVERY_S) is still the trial's crash.
        failures = [v for v in failures if v.node != 0 and not v.follows_a_peer]
        if not failures:
            return own
    elif own.status == OK and for_peer is None:
        # Node 0's command finished its run: a node whose ranks only lost their peers lost them to that end.
        failures = [v for v in failures if not v.follows_a_peer]
    if not failures:
        return own if for_peer is None else _filed_as(own, for_peer)
    # The error that started it: one that does not follow a peer's end, the earliest of those.
    first = min(failures, key=lambda v: (v.follows_a_peer, v.ended_at))
    result = _filed_as(own, first)
    missing = [str(k) for k in range(1, nodes) if k not in {v.node for v in others}]
    if missing and result.status != OK:
        result.error += f" (no verdict came from node(s) {', '.join(missing)} within {VERDICT_WAIT_S:g} s)"
    return result


def _memory_over_nodes(filed: TrialResult, own: TrialResult, others: list[Verdict]) -> TrialResult:
    """The record's memory over every node: the largest peak any node saw, and the smallest headroom with the
    capacity it was held to (the tightest node decides whether the pair is tight). Node 0's own reading counts
    whichever node the record is filed from."""
    readings = [(own.peak_mem_gib, own.capacity_gib, own.headroom)] + [(v.peak_mem_gib, v.capacity_gib, v.headroom) for v in others]
    peaks = [peak for peak, _, _ in readings if peak is not None]
    if not peaks:
        return filed
    roomy = [(peak, capacity, room) for peak, capacity, room in readings if room is not None]
    tightest = min(roomy, key=lambda r: r[2], default=None)
    capacity, headroom = (tightest[1], tightest[2]) if tightest is not None else (filed.capacity_gib, filed.headroom)
    return replace(filed, peak_mem_gib=max(peaks), capacity_gib=capacity, headroom=headroom)


def _filed_as(own: TrialResult, v: Verdict) -> TrialResult:
    """Node 0's record, filed as node v's verdict says: its status, error (naming the node) and log."""
    if v.node == 0:
        return own
    return replace(
        own, status=Status(v.status), oom_phase=OomPhase(v.oom_phase) if v.status == OOM and v.oom_phase else None,
        oom_module=v.oom_module if v.status == OOM else own.oom_module, error=f"node {v.node} ({v.host}): {v.error}", log=v.log,
        throughput=None, throughput_low=None, throughput_high=None, step_times_s=[], steps_measured=None, stopped_early="",
        log_throughput=None,
    )


def first_cause(reason: str, log_tail: str) -> str:
    """The error that started a crash, where the classifier's line (the last exception) only follows a peer's end.

    Ranks fail in turn: the one that crashed first, then the others in their next collective (gloo's
    "Connection closed by peer"), so the last exception in a log is often a consequence. The first exception
    line that neither follows a peer nor only reports a child (a launcher's ChildFailedError) is the cause; the
    classifier's reason stands where there is none."""
    from sweep.parsers.classify import _EXCEPTION, _WRAPPER, one_line
    from sweep.parsers.lines import clean_line

    if not _PEER_CONSEQUENCE.search(reason):
        return reason
    for raw in re.split(r"\r\n|\r|\n", log_tail):
        rank, line = clean_line(raw)
        line = line.rstrip()
        if _EXCEPTION.match(line) and not _WRAPPER.search(line) and not _PEER_CONSEQUENCE.search(line):
            return one_line(line if rank is None else f"rank {rank}: {line}")
    return reason


def describe(verdicts: dict[int, Any]) -> str:
    """One line per node's verdict, for node 0's log."""
    return "; ".join(f"node {k} ({v.host}): {v.status}{' ' + v.error if v.error else ''}" for k, v in sorted(verdicts.items()))
