"""bench_reliability's validity cases (issue 43): a figure counts only when it measured what was asked.

Each case breaks one assumption a figure rests on, on purpose, through the real thing (`python -m sweep` running
tests/attack_train.py, a real PyTorch script the probe measures; the pure checks on the records a workload
writes), and reports what the user now sees, one line, and whether the outcome is a wrong answer given with
confidence: a recommendation other than the true best at 80/100 or more, or a figure filed as `ok` for a pair
it did not measure. The promise is zero.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))
from attack_sweeps import ATTACK, CONFIDENT, GBS  # noqa: E402 - beside this file: the attack trainer's sweeps
from attack_sweeps import answer as _answer  # noqa: E402
from attack_sweeps import attack_sweep as _sweep  # noqa: E402
from attack_sweeps import run_sweep as _run_sweep  # noqa: E402
from attack_sweeps import wrong as _wrong  # noqa: E402
from reliability_evidence import Case, EvidenceTally, run_cases  # noqa: E402 - the bench's dir, beside this file


def cold_first_trial(root: Path):
    """Case 1: the staircase's first pair is the true best (256 samples/s) but its first 6 steps run 3x slow."""
    proc, rows, rec = _sweep(root, ',"--attack=cold_first","--oom-pairs=1:1","--rates=1:2=192,2:1=256,2:2=220"',
                             "search=staircase", "accum=1,2", "split=1,2", "search.drift_check=false")
    rerun = "running it again in full" in proc.stdout
    return rec.get("accum") == 2 and rec.get("split") == 1 and rerun, f"{_answer(rec)}; first pair run again in full: {rerun}", _wrong(rec, (2, 1))


def caught_oom_and_ignored_accum(root: Path):
    """Cases 3 and the accumulation check: accum=1 catches an OOM and goes on at half the batch (its figure the
    fastest); accum=2's command ignores --accum. The true best that trained what was asked: accum=4."""
    proc, rows, rec = _sweep(root, ',"--attacks=1:1=caught_oom,2:1=no_accum","--rates=1:1=2000,2:1=1500,4:1=1000"',
                             "search=grid", "accum=1,2,4", "split=1", "search.drift_check=false")
    one, two = rows.get((1, 1), {}), rows.get((2, 1), {})
    seen = f"accum=1: {one.get('status')} ({one.get('reason', '')[:90]}...); accum=2: {two.get('status')}; {_answer(rec)}"
    wrong = _wrong(rec, (4, 1)) or one.get("status") == "ok" or two.get("status") == "ok"
    return one.get("status") == "oom" and two.get("status") == "rejected" and rec.get("accum") == 4, seen, wrong


def more_ranks_than_devices(root: Path):
    """Case 4: torchrun starts 2 ranks where machine.num_devices=1: each step trains twice the global batch."""
    argv = (f'["{sys.executable}","-m","torch.distributed.run","--nproc_per_node=2","--master_port={{master_port}}","{ATTACK}",'
            f'"--batch={{per_device_batch}}","--accum={{accum}}","--global-batch={{global_batch_size}}","--steps=14"]')
    proc, rows, _ = _run_sweep(root, argv, "accum=1", "split=1", "search.drift_check=false")
    row = rows.get((1, 1), {})
    line = next((x for x in proc.stdout.splitlines() if "accum=1 split=1: rejected" in x or "accum=1 split=1: ok" in x), "")
    return row.get("status") == "rejected", line.split("] ", 1)[-1][:200], row.get("status") == "ok"


def per_micro_batch_log_figure(root: Path):
    """Case 5: its own update (no torch.optim, as Keras 3 on torch) and a Keras-like `ms/step` per micro-batch,
    read per step through a regex as docs/trainers.md once suggested; the truth: accum=1 fastest."""
    proc, rows, rec = _sweep(root, ',"--attack=own_optimizer","--rates=1:1=1000,2:1=900,4:1=800"', "search=grid", "accum=1,2,4",
                             "split=1", "search.drift_check=false", "search.measure_to_decision=false", "search.racing=false",
                             "workload.parser.type=regex",
                             "+workload.parser.pattern='s (?P<throughput>[0-9.]+)ms/step'", "+workload.parser.unit=ms/step")
    statuses = {a: rows.get((a, 1), {}).get("status") for a in (1, 2, 4)}
    reason = rows.get((4, 1), {}).get("reason", "")[:110]
    wrong = _wrong(rec, (1, 1)) or statuses[2] == "ok" or statuses[4] == "ok"
    return statuses == {1: "ok", 2: "rejected", 4: "rejected"} and rec.get("accum") == 1, f"{statuses}; accum=4: {reason}...; {_answer(rec)}", wrong


def own_update_ignoring_accum(root: Path):
    """Issue 45's weaker signal under the same checks: its own update (no torch.optim step to count) after every
    micro-batch, whatever --accum says; its figures grow with the accumulation asked (the truth: accum=1 is the one
    pair that trained what was asked)."""
    proc, rows, rec = _sweep(root, ',"--attack=own_update_no_accum","--rates=1:1=800,2:1=900,4:1=1000"', "search=grid", "accum=1,2,4",
                             "split=1", "search.drift_check=false", "search.measure_to_decision=false", "search.racing=false")
    statuses = {a: rows.get((a, 1), {}).get("status") for a in (1, 2, 4)}
    reason = rows.get((4, 1), {}).get("reason", "")[:130]
    wrong = _wrong(rec, (1, 1)) or statuses[2] == "ok" or statuses[4] == "ok"
    return statuses == {1: "ok", 2: "rejected", 4: "rejected"} and rec.get("accum") == 1, f"{statuses}; accum=4: {reason}...; {_answer(rec)}", wrong


def one_step_confidence(_: Path):
    """Issue 43's point 2, on the records: a provisional pair measured on one cold step is not scored as measured."""
    from sweep.core.confidence import confidence_score
    from sweep.core.schema import OK, OOM, OomPhase, TrialResult
    from sweep.core.space import enumerate_candidates
    from sweep.core.stats import throughput_summary

    def ok(accum: int, split: int, times: list[float], **kw) -> TrialResult:
        mid, low, high = throughput_summary(times, GBS)
        pdb = GBS // accum
        return TrialResult(accum=accum, split=split, per_device_batch=pdb, joint_batch=pdb // split, global_batch_size=GBS, num_devices=1,
                           status=OK, step_times_s=times, steps_measured=len(times), throughput=mid, throughput_low=low, throughput_high=high, **kw)

    leader = ok(1, 2, [GBS / 96.0 * (1 + 0.002 * (i % 3)) for i in range(8)])
    cold = ok(2, 1, [GBS / 42.6], stopped_early="provisional: the search's first pair")
    oom = replace(leader, accum=1, split=1, per_device_batch=64, joint_batch=64, status=OOM, oom_phase=OomPhase.JOINT, throughput=None)
    score = confidence_score(enumerate_candidates(GBS, 1, [1, 2], [1, 2]), {r.key: r for r in (leader, cold, oom)})
    return score is not None and score < CONFIDENT, f"accum=1 split=2 leads at {score}/100 while accum=2 split=1 rests on one step", (score or 0) >= CONFIDENT


def growth_late_creep(_: Path):
    """Also found: an early rise plus a 0.09 MiB creep in the final third (tolerance 1 MiB) flagged the demo's answer."""
    from sweep.core.growth import still_growing

    mib = 1 / 1024
    peaks = [10 * mib, 12 * mib, 12 * mib, 12 * mib, 12 * mib, 12 * mib, 12.05 * mib, 12.09 * mib, 12.09 * mib]
    why = still_growing(peaks, capacity_gib=0.02)
    return why == "", f"still_growing: {why or 'not growing'}", bool(why)


def _default_sweep(root: Path, *args: str, busy: int = 0) -> tuple[subprocess.CompletedProcess, dict]:
    """`python -m sweep` (the CPU demo) in root, with `busy` spinning loops beside it; (process, recommendation.yaml)."""
    root.mkdir(parents=True, exist_ok=True)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        proc = subprocess.run([sys.executable, "-m", "sweep", f"hydra.sweep.dir={root / 'sweep'}", *args], cwd=root, capture_output=True,
                              text=True, timeout=900, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    rec_path = root / "sweep" / "recommendation.yaml"
    return proc, (yaml.safe_load(rec_path.read_text()) or {}) if rec_path.exists() else {}


def warm_worker_killed_after_an_oom(root: Path):
    """Case 2: the demo's worker runs accum=2 split=1 (an encoder OOM in its log), then accum=4 split=2 is SIGKILLed with
    its worker: read from the worker's whole log it was an OOM (accum=2's), which pruned every smaller accum."""
    import signal
    import time

    from support.warm_workers import running_worker

    root.mkdir(parents=True, exist_ok=True)
    sweep_dir = root / "sweep"
    with (root / "out.txt").open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sweep", f"hydra.sweep.dir={sweep_dir}", "search.drift_check=false", "search.racing=false",
                                 "search.max_trials=4", "trial.measure_steps=12", "trial.max_measure_steps=12"], cwd=root, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    deadline = time.monotonic() + 300
    state = None
    while time.monotonic() < deadline and proc.poll() is None and state is None:
        found = running_worker(sweep_dir)
        state = found if found and found["trial_dir"].endswith("accum4_split2") else None
        time.sleep(0.1)
    if state is None:
        proc.kill()
        return False, "accum=4 split=2 never ran in a warm worker", False
    os.kill(state["pid"], signal.SIGKILL)
    proc.wait(timeout=300)
    rows = {(int(r["accum"]), int(r["split"])): r for r in csv.DictReader((sweep_dir / "trials.csv").open())}
    killed = rows.get((4, 2), {})
    rec_path = sweep_dir / "recommendation.yaml"
    rec = (yaml.safe_load(rec_path.read_text()) or {}) if rec_path.exists() else {}
    # accum=4 split=2 is the demo's answer when it runs (README): with it killed unmeasured, any other pair recommended
    # at 80 or more is an answer the kill made, as is a killed pair recommended or filed as an OOM.
    wrong = killed.get("status") == "oom" or (rec.get("accum"), rec.get("split")) == (4, 2) or _wrong(rec, (4, 2))
    line = next((x.split("] ", 1)[-1] for x in (root / "out.txt").read_text().splitlines() if "accum=4 split=2: failed" in x), "")
    return killed.get("status") == "failed" and "no sign of running out of memory" in killed.get("reason", ""), f"{line[:200]}; {_answer(rec)}", wrong


def ctrl_c_in_the_drift_check(root: Path):
    """Also found: Ctrl-C during the drift check exited 0 and wrote `done`; a resume never finished the check. Two
    close pairs, then a drift check whose re-timing waits (tests/test_drift.py's script) while Ctrl-C reaches the group."""
    import json
    import signal
    import time

    from support.drift import retiming_sweep

    root.mkdir(parents=True, exist_ok=True)
    args, env, sweep_dir = retiming_sweep(root)
    with (root / "out.txt").open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sweep", *args], cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not (root / "retiming").exists():
        time.sleep(0.05)
    if proc.poll() is not None:
        return False, f"the sweep ended (exit {proc.poll()}) before its drift check's re-timing started", False
    os.killpg(proc.pid, signal.SIGINT)
    code = proc.wait(timeout=120)
    last = (root / "out.txt").read_text().strip().splitlines()[-1]
    state = json.loads((sweep_dir / "sweep.json").read_text())["state"]
    (root / "go").touch()
    resumed = subprocess.run([sys.executable, "-m", "sweep", f"resume={sweep_dir}"], cwd=root, capture_output=True, text=True, timeout=600,
                             stdin=subprocess.DEVNULL, env=env)
    finished = any(x.startswith(("drift check: re-timed", "drift: re-timed")) for x in resumed.stdout.splitlines())
    promised = code == 130 and state == "interrupted" and "drift check was cut short" in last and resumed.returncode == 0 and finished
    return promised, f"exit {code}, sweep.json {state!r}: {last[:150]}...; the resume finished the check: {finished}", False


def killed_in_the_drift_check(root: Path):
    """Also found: after kill -9 during a re-timing, `resume=` printed no drift line and left the re-timing's job
    running after it returned. Now the resume re-attaches to it, waits for it, re-times the other pair and ends clean."""
    import json
    import time

    import psutil
    from support.drift import retiming_sweep

    root.mkdir(parents=True, exist_ok=True)
    args, env, sweep_dir = retiming_sweep(root)
    with (root / "out.txt").open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sweep", *args], cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not (root / "retiming").exists():
        time.sleep(0.05)
    if proc.poll() is not None:
        return False, f"the sweep ended (exit {proc.poll()}) before its drift check's re-timing started", False
    proc.kill()
    proc.wait(timeout=60)
    left = int((root / "retiming").read_text())
    with (root / "resume.txt").open("w") as out:  # the re-timing still waits: the resume finds it running
        resumed = subprocess.Popen([sys.executable, "-m", "sweep", f"resume={sweep_dir}"], cwd=root, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and resumed.poll() is None and "re-attached" not in (root / "resume.txt").read_text():
        time.sleep(0.05)
    (root / "go").touch()
    code = resumed.wait(timeout=600)
    text = (root / "resume.txt").read_text()
    drift = next((x for x in text.splitlines() if x.startswith(("drift check: re-timed", "drift: re-timed"))), "")
    reattached = "re-attached to running re-timing job" in text
    still = psutil.pid_exists(left) and psutil.Process(left).status() != psutil.STATUS_ZOMBIE
    state = json.loads((sweep_dir / "sweep.json").read_text())["state"]
    promised = code == 0 and reattached and bool(drift) and not still and state == "done"
    return promised, (f"resume exit {code}, re-attached: {reattached}, the left re-timing still running after it: {still}, "
                      f"sweep.json {state!r}; {drift[:120]}..."), False


def second_sweep_while_screening(root: Path):
    """Also found: the sweep dir was not locked while screening (a second sweep ran its trials beside the first's and
    overwrote sweep.json), and the screening phase printed a final answer of its own before the real one."""
    import json
    import re
    import time

    from support.scripts import GATED

    root.mkdir(parents=True, exist_ok=True)
    script, sweep_dir = root / "train.py", root / "sweep"
    script.write_text(GATED)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT / "src")}
    args = [f"hydra.sweep.dir={sweep_dir}", "workload=command", f"workload.argv=[{sys.executable},{script},'{{accum}}','{{num_devices}}']",
            "global_batch_size=16", "search=grid", "accum=1,2,4", "split=1", "trial.time_limit_s=60", "search.drift_check=false",
            "machine.num_devices=2", "hydra.launcher.tasks_per_node=2", "live=false"]
    with (root / "out.txt").open("w") as out:
        first = subprocess.Popen([sys.executable, "-m", "sweep", *args, "search.screen=on"], cwd=root, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and first.poll() is None and not (root / "screening").exists():
        time.sleep(0.05)
    second = subprocess.run([sys.executable, "-m", "sweep", *args, "search.screen=off"], cwd=root, env=env, capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL)
    kept = "search.screen=on" in json.loads((sweep_dir / "sweep.json").read_text()).get("argv", "")
    ran_beside = (sweep_dir / "trials").exists()  # the second's full trials (the first's come after its screening)
    (root / "go").touch()
    code = first.wait(timeout=300)
    out = (root / "out.txt").read_text()
    main_start = re.search(rf"^(\[ *[\d.]+s\] )?sweep \S+: .* dir {re.escape(str(sweep_dir))}$", out, re.M)
    screening = out[: main_start.start()] if main_start else out
    answers = len(re.findall(r"^flags: ", out, re.M))
    named = bool(re.search(r"recommended|confidence|flags:", screening))
    promised = second.returncode == 2 and kept and not ran_beside and code == 0 and main_start is not None and not named and answers == 1
    wrong = second.returncode == 0 or ran_beside or named
    return promised, (f"second sweep: exit {second.returncode}: {second.stderr.strip()[:140]}; the first's sweep.json kept: {kept}; "
                      f"screening named an answer: {named}; flags lines in the whole run: {answers}"), wrong


def _busy_box_default_sweeps(root: Path, busy: int):
    """Case 6: three default sweeps beside `busy` spinning loops either agree or all stay at 80 or below."""
    answers = []
    for i in range(3):
        proc, rec = _default_sweep(root / f"s{i}", busy=busy)
        answers.append((rec.get("accum"), rec.get("split"), int(rec.get("confidence") or 0)))
    agree = len({(a, s) for a, s, _ in answers}) == 1
    honest = agree or all(c <= CONFIDENT for _, _, c in answers)
    seen = ", ".join(f"accum={a} split={s} at {c}" for a, s, c in answers)
    return honest and all(a for a, _, _ in answers), f"{seen}: {'the same answer' if agree else 'different answers'}", not honest


def busy_box_two_loops(root: Path):
    return _busy_box_default_sweeps(root, busy=2)


def busy_box_four_loops(root: Path):
    return _busy_box_default_sweeps(root, busy=4)


CASES = [
    Case("cold_first_trial", "fault", cold_first_trial),
    Case("caught_oom_and_ignored_accumulation", "fault", caught_oom_and_ignored_accum),
    Case("more_ranks_than_devices", "fault", more_ranks_than_devices),
    Case("per_micro_batch_log_figure", "fault", per_micro_batch_log_figure),
    Case("own_update_ignoring_accumulation", "fault", own_update_ignoring_accum),
    Case("one_step_scored_as_measured", "fault", one_step_confidence),
    Case("growth_early_rise_late_creep", "fault", growth_late_creep),
    Case("warm_worker_killed_after_an_oom", "fault", warm_worker_killed_after_an_oom),
    Case("ctrl_c_in_the_drift_check", "fault", ctrl_c_in_the_drift_check),
    Case("kill_9_in_the_drift_check", "fault", killed_in_the_drift_check),
    Case("second_sweep_while_screening", "fault", second_sweep_while_screening),
    Case("busy_box_three_default_sweeps_two_loops", "fault", busy_box_two_loops),
    Case("busy_box_three_default_sweeps_four_loops", "fault", busy_box_four_loops),
]


# Issue 50's cases (only training counts, accumulation across pairs, the wall-time figure, the ordering as a prior).
from reliability_assumptions import ASSUMPTION_CASES  # noqa: E402 - beside this file

CASES += ASSUMPTION_CASES


def run_validity(root: Path) -> EvidenceTally:
    return run_cases(CASES, root, lambda line: print(line, flush=True))


if __name__ == "__main__":
    from support.faultlib import foreground_sigint

    foreground_sigint()  # ctrl_c_in_the_drift_check sends SIGINT to the sweeps it starts
    tally = run_validity(Path(tempfile.mkdtemp(prefix="validity_")))
    print(f"validity: {len(CASES)} cases, {len(tally.problems)} not as promised, {tally.wrong_confident} wrong answers given with confidence")
    sys.exit(1 if tally.problems or tally.wrong_confident else 0)
