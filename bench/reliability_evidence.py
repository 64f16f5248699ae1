"""bench_reliability's evidence cases: what a status rests on (wrong answers, odd logs, bad figures, paths).

Each case runs the real thing (python -m sweep, the real parsers and classifier on real-format logs,
tqdm rendering its own bars) and reports what the user now sees, one line, and whether that is what
sweep promises. Kept apart from bench_reliability.py so other blocks merge beside it.

A case counts as a "wrong answer given with confidence" when its outcome would steer the search:
an OOM that is not one (it prunes bigger pairs), a figure that is not the training throughput, or
a non-finite figure reaching the score. Each such outcome seen is counted; the promise is zero.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))


@dataclass
class EvidenceTally:
    faults: int = 0  # injected faults and odd logs
    bad_inputs: int = 0  # refusals expected in one line, exit 2
    lost: int = 0  # results that disappeared
    wrong_confident: int = 0  # outcomes that would steer the search wrongly (see the module docstring)
    problems: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "fault" or "bad_input"
    run: Callable[[Path], tuple[bool, str, bool]]  # -> (as promised, what the user sees, a confident wrong answer)


# -- classification: the cause of a trial's end ------------------------------------------------------

def _classify(tail: str, code: int | None, sig: int | None = None, **kw):
    from sweep.parsers import classify_failure

    return classify_failure(tail, code, sig, **kw)


def sigkill_without_evidence(_: Path):
    from support import failure_logs as C

    from sweep.parsers import KillEvidence

    got = _classify(C.PROGRESS, 137, kill_evidence=KillEvidence(oom_kills=0, kernel_oom=False, peak_fraction=0.014))
    return got.status == "failed", f"{got.status}: {got.reason}", got.status == "oom"


def sigkill_with_cgroup_oom(_: Path):
    from support import failure_logs as C

    from sweep.parsers import KillEvidence

    got = _classify(C.PROGRESS, 137, kill_evidence=KillEvidence(oom_kills=1, peak_fraction=0.6))
    return got.status == "oom", f"{got.status}: {got.reason}", False


def oom_line_then_missing_file(_: Path):
    from support import failure_logs as C

    got = _classify(C.CAUGHT_OOM_THEN_MISSING_FILE, 1)
    return got.status == "failed" and "FileNotFoundError" in got.reason, f"{got.status}: {got.reason}", got.status == "oom"


def rank_oom_then_collective_errors(_: Path):
    from support import failure_logs as C

    got = _classify(C.RANK1_OOM_THEN_OTHERS_FAIL, 1)
    return (got.status, got.oom_phase) == ("oom", "joint"), f"{got.status} ({got.oom_phase}): {got.reason[:90]}", False


def nccl_cuda_failure_2(_: Path):
    from support import failure_logs as C

    got = _classify(C.NCCL_CUDA_FAILURE_2, 1)
    return got.status == "oom", f"{got.status}: {got.reason}", False


# -- log parsing: the figure that is recorded ----------------------------------------------------------

def _summary(kind: str, log: bytes, **ctx):
    from sweep.parsers import make_parser, parser_settings

    parser = make_parser({"type": kind})
    found = parser.feed(log) + parser.close()
    return found, (parser_settings({"type": kind}).summarize(found, **ctx) if found else None)


def nemo_asr_bar(_: Path):
    from support import parser_lines as P
    from tqdm import tqdm

    times = [0.9 + (i % 5) / 100 for i in range(37)]
    lines = [tqdm.format_meter(i + 1, 300, sum(times[: i + 1]), prefix="Epoch 0",
                               postfix=f"v_num=0, train_step_timing in s={P.lightning_postfix(t)}") for i, t in enumerate(times)]
    found, s = _summary("lightning", ("\r".join(lines) + "\n").encode(), global_batch_size=64, accum=2)
    good = s is not None and s.measured + s.warmup == 37
    return good, f"{len(found)} figures read, {s.measured if s else 0} measured: {s.note if s else '-'}", not good


def hf_eval_on_start(root: Path):
    from tqdm import tqdm

    log = root / "hf.log"
    with log.open("w") as f:
        args = dict(file=f, dynamic_ncols=True, mininterval=0)
        train = tqdm(total=20, **args)
        ev = tqdm(total=20, leave=False, **args)
        for _ in range(20):
            time.sleep(0.001)
            ev.update(1)
        ev.close()
        for _ in range(20):
            time.sleep(0.02)
            train.update(1)
        train.close()
    found, s = _summary("hf", log.read_bytes(), global_batch_size=64)
    eval_read = any(m.value > 60 for m in found if m.unit == "steps/s")
    return not eval_read, f"{len(found)} training figures, median {s.value:.0f} samples/s" if s else "no figure", eval_read


def tqdm_without_width(_: Path):
    from tqdm import tqdm

    line = tqdm.format_meter(60, 1230545, 13.1, ncols=0, rate=4.58)
    found, _ = _summary("hf", (line + "\n").encode(), global_batch_size=64)
    good = [m.value for m in found] == [4.58]
    return good, f"{line.strip()!r} -> {[m.value for m in found]} steps/s", False


def deepspeed_pipeline_engine(_: Path):
    line = f"steps: {10} loss: {2.3456:0.4f} iter time (s): {0.468:0.3f} samples/sec: {273.344:0.3f}"
    found, _ = _summary("deepspeed", (line + "\n").encode())
    return [m.value for m in found] == [273.344], f"-> {[m.value for m in found]} samples/s", False


def caiman_two_step_lines(_: Path):
    from support import parser_lines as P

    log = "\n".join([P.caiman_step(1, 1, 1, 900.0), P.caiman_step(1, 2, 2, 1000.0),
                     "DLL 2024-01-02 10:11:12.123456 - epoch    1 | train_avg_throughput-audio-samples-per-sec :  700.00 | train_avg_took :  1",
                     P.caiman_step(2, 1, 3, 1400.0), P.caiman_step(2, 2, 4, 1420.0),
                     "DLL 2024-01-02 10:11:30.123456 - epoch    2 | train_avg_throughput-audio-samples-per-sec :  1100.00 | train_avg_took :  1"])
    _, s = _summary("myrtle", (log + "\n").encode(), global_batch_size=64)
    good = s is not None and abs(s.value - 1410.0) < 1e-6
    return good, f"{s.value:.0f} samples/s: {s.note}" if s else "no figure", not good


# -- bad figures: real sweeps ----------------------------------------------------------------------------

def _sweep(cwd: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    from support import sweep_dirs as D

    return D.sweep(cwd, *args, timeout=timeout)


def zero_throughput_trial(root: Path):
    script = root / "zero.py"
    script.write_text("import sys\nfor e in (1, 2, 3):\n    print(f'epoch {e} -> {0 if sys.argv[1] == \"2\" else 1000} samples/s', flush=True)\n")
    proc = _sweep(root, "hydra.sweep.dir=z", "workload=command", f'workload.argv=["{sys.executable}","{script}","{{accum}}"]',
                  "workload.parser.type=regex", "+workload.parser.pattern='-> (?P<throughput>[0-9.]+) samples/s'",
                  "global_batch_size=16", "accum=1,2", "split=1", "search=grid")
    rows = {r["accum"]: r for r in _csv(root / "z" / "trials.csv")}
    status = rows.get("2", {}).get("status")
    return status == "failed" and proc.returncode == 0, f"accum=2: {status} {rows.get('2', {}).get('reason', '')[:100]}", status == "ok"


def _csv(path: Path) -> list[dict]:
    import csv

    return list(csv.DictReader(path.open())) if path.exists() else []


def impossible_figure_in_result_json(root: Path):
    from support import fingerprints as TF

    outcomes = []
    for bad in (float("inf"), -550.0):
        d = root / f"r{bad}"
        d.mkdir()
        first = _sweep(d, "hydra.sweep.dir=D", *TF.COMMAND, "global_batch_size=16")
        path = d / "D" / "trials" / "accum2_split1" / "result.json"
        data = json.loads(path.read_text())
        data["throughput"] = bad
        path.write_text(json.dumps(data))
        proc = _sweep(d, "resume=D")
        again = json.loads(path.read_text()).get("throughput")
        outcomes.append((first.returncode == 0 and proc.returncode == 0 and "ignoring" in proc.stdout and isinstance(again, float)
                         and again > 0, "infx" in proc.stdout or "Traceback" in proc.stderr))
    good = all(o[0] for o in outcomes)
    return good, "Infinity and -550 in result.json: ignored, named, that trial rerun" if good else "not ignored", any(o[1] for o in outcomes)


def fifo_result_json(root: Path):
    from support import sweep_dirs as D

    first = _sweep(root, "hydra.sweep.dir=F", *D.COMMAND)
    path = root / "F" / "trials" / "accum1_split1" / "result.json"
    path.unlink()
    os.mkfifo(path)
    try:
        proc = _sweep(root, "resume=F", timeout=120)
    except subprocess.TimeoutExpired:
        return False, "resume hung on the FIFO", False
    good = first.returncode == 0 and proc.returncode == 0 and "not a regular file" in proc.stdout
    return good, "resume: " + next((x for x in proc.stdout.splitlines() if "not a regular file" in x), proc.stdout[-100:]), False


# -- data and paths ----------------------------------------------------------------------------------------

def _refused(proc: subprocess.CompletedProcess, *texts: str) -> tuple[bool, str]:
    line = proc.stderr.strip()
    return (proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
            and all(t in line for t in texts)), line


def latest_is_a_users_file(root: Path):
    from support import sweep_dirs as D

    (root / "out").mkdir()
    (root / "out" / "latest").write_text("my notes\n")
    proc = _sweep(root, "hydra.sweep.dir=out/run1", *D.COMMAND)
    kept = (root / "out" / "latest").read_text() == "my notes\n"
    seen = next((x for x in proc.stdout.splitlines() if "latest" in x), "")
    return kept and proc.returncode == 0, seen.strip() or "no line", False


def not_a_sweep_dir(root: Path):
    from support import sweep_dirs as D

    (root / "mine").mkdir()
    (root / "mine" / "trials.csv").write_text("mine\n")
    good, line = _refused(_sweep(root, "hydra.sweep.dir=mine", *D.COMMAND), "holds other files")
    return good and (root / "mine" / "trials.csv").read_text() == "mine\n", line, False


def sweep_dir_is_the_latest_link(root: Path):
    from support import sweep_dirs as D

    _sweep(root, "hydra.sweep.dir=o/run1", *D.COMMAND)
    proc = _sweep(root, "hydra.sweep.dir=o/latest", *D.COMMAND)
    good = proc.returncode == 0 and os.readlink(root / "o" / "latest") == "run1" and "reusing 1" in proc.stdout
    return good, f"exit {proc.returncode}; latest -> {os.readlink(root / 'o' / 'latest')}; reused the finished trial", False


def sweep_dir_root(root: Path):
    from support import sweep_dirs as D

    good, line = _refused(_sweep(root, "hydra.sweep.dir=/", *D.COMMAND), "filesystem root")
    return good, line, False


def refused_gpu_profile_writes_nothing(root: Path):
    from support import sweep_dirs as D

    good, line = _refused(_sweep(root, "+machine=a100x8", *D.COMMAND), "needs 8 CUDA device(s)")
    left = sorted(p.name for p in root.iterdir())
    return good and not left, f"{line}; left behind: {left or 'nothing'}", False


def damaged_sweep_json(root: Path):
    from support import sweep_dirs as D

    _sweep(root, "hydra.sweep.dir=S", *D.COMMAND)
    (root / "S" / "sweep.json").write_text('{"argv": [')
    good, line = _refused(_sweep(root, "resume=S"), "are intact", "hydra.sweep.dir=")
    return good, line, False


def ctrl_c_while_starting(root: Path):
    from support import sweep_dirs as D

    seen = []
    for delay in (0.0, 0.1, 0.2, 0.3):
        proc = D.interrupt_while_starting(root, delay)
        seen.append("Traceback" not in proc.stdout + proc.stderr)
    return all(seen), f"{sum(seen)} of {len(seen)} Ctrl-Cs in sweep's first 0.3 s ended in one line, no traceback", False


def report_on_zero_throughput_rows(root: Path):
    from support import results as A  # the CSV edit below is the one tests/test_report.py makes

    sweep = A.make_sweep(root, "zero")
    rows = _csv(sweep / "trials.csv")
    zero = next(r for r in rows if r["status"] == "ok" and r["rank"] not in ("", "1"))
    zero.update(rank="", throughput_samples_per_s="0", throughput_low_samples_per_s="0", throughput_high_samples_per_s="0", speedup="")
    import csv

    with (sweep / "trials.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    proc = subprocess.run([sys.executable, "-m", "sweep.report", str(sweep)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=120)
    return proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout.strip().splitlines()[-1] if proc.stdout else proc.stderr[-120:], False


CASES = [
    Case("sigkill_without_memory_evidence", "fault", sigkill_without_evidence),
    Case("sigkill_with_cgroup_oom_kill", "fault", sigkill_with_cgroup_oom),
    Case("oom_line_then_filenotfounderror", "fault", oom_line_then_missing_file),
    Case("rank1_oom_then_collective_errors", "fault", rank_oom_then_collective_errors),
    Case("nccl_cuda_failure_2_out_of_memory", "fault", nccl_cuda_failure_2),
    Case("nemo_asr_bar_without_step_numbers", "fault", nemo_asr_bar),
    Case("hf_eval_on_start_same_total", "fault", hf_eval_on_start),
    Case("tqdm_bar_without_width", "fault", tqdm_without_width),
    Case("deepspeed_pipeline_engine_line", "fault", deepspeed_pipeline_engine),
    Case("caiman_asr_two_step_lines", "fault", caiman_two_step_lines),
    Case("zero_throughput_trial", "fault", zero_throughput_trial),
    Case("infinity_and_negative_in_result_json", "fault", impossible_figure_in_result_json),
    Case("fifo_named_result_json", "fault", fifo_result_json),
    Case("users_file_named_latest", "fault", latest_is_a_users_file),
    Case("sweep_dir_is_a_dir_of_other_files", "bad_input", not_a_sweep_dir),
    Case("sweep_dir_is_outputs_latest", "fault", sweep_dir_is_the_latest_link),
    Case("sweep_dir_is_root", "bad_input", sweep_dir_root),
    Case("refused_gpu_profile_leaves_no_dir", "bad_input", refused_gpu_profile_writes_nothing),
    Case("damaged_sweep_json_on_resume", "fault", damaged_sweep_json),
    Case("ctrl_c_in_the_first_0.3s", "fault", ctrl_c_while_starting),
    Case("report_on_zero_throughput_rows", "fault", report_on_zero_throughput_rows),
]
# Also counted by bench_reliability's bad-input table (tests/test_bad_input.py): time_limit_inf, time_limit_nan,
# parser_tokens_per_sample_inf, launcher_newline, launcher_key_newline.


def run_evidence(root: Path, log: Callable[[str], None] = print) -> EvidenceTally:
    return run_cases(CASES, root, lambda line: log(line[:240]))


def run_cases(cases: list[Case], root: Path, log: Callable[[str], None] = print) -> EvidenceTally:
    """Each case in its own dir under root, tallied by kind; a line of what the user sees for each (bench_reliability's
    evidence and validity groups)."""
    t = EvidenceTally()
    for case in cases:
        where = root / case.name
        where.mkdir(parents=True)
        try:
            good, seen, wrong = case.run(where)
        except Exception as e:  # noqa: BLE001 - a case that breaks is reported, and the rest still run
            good, seen, wrong = False, f"{type(e).__name__}: {e}", False
        if case.kind == "bad_input":
            t.bad_inputs += 1
        else:
            t.faults += 1
        t.wrong_confident += wrong
        if not good:
            t.problems.append(f"{case.name}: {seen}")
        line = f"  {case.name}: {'ok' if good else 'NOT AS PROMISED'}: {seen}"
        t.lines.append(line)
        log(line)
    return t


if __name__ == "__main__":
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="bench_evidence_"))
    try:
        tally = run_evidence(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"evidence cases: faults {tally.faults}, bad inputs {tally.bad_inputs}, results lost {tally.lost}, "
          f"wrong answers given with confidence {tally.wrong_confident}, not as promised {len(tally.problems)}")
    sys.exit(1 if tally.problems or tally.wrong_confident or tally.lost else 0)
