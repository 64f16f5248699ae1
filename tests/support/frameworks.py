"""The shipped framework presets run at test size against the real frameworks (tests/frameworks/), and how the
probe's step times are checked against each framework's own (tests/test_frameworks_real.py, test_frameworks_more.py,
test_busy_box.py). The frameworks come from `pip install -e ".[frameworks]"`; docs/trainers.md."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from support.sweep_run import run_sweep

ROOT = Path(__file__).resolve().parents[2]


FRAMEWORKS = Path(__file__).resolve().parents[1] / "frameworks"


PRESETS = ROOT / "sweeps"


TOLERANCE = 0.02  # the probe against the framework's own timing of the same steps


TOTAL_TOLERANCE = 0.05  # their sums over the same steps


RANKING_NOISE = 0.05  # two pairs whose own median step times differ by less are not ranked


def needs(*modules: str) -> pytest.MarkDecorator:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed (pip install -e .[frameworks])")


def shipped(name: str) -> dict:
    return yaml.safe_load((PRESETS / f"{name}.yaml").read_text())


def swap(argv: list[str], script: str, replacement: str, drop: tuple[str, ...] = (), add: tuple[str, ...] = ()) -> list[str]:
    """The preset's argv with its script replaced, the flags starting with `drop` removed and `add` appended."""
    assert script in argv, f"the preset no longer runs {script}: {argv}"
    out = [replacement if a == script else a for a in argv if not a.startswith(drop or ("\0",))]
    return out + list(add)


def hf_argv(argv: list[str], data: Path) -> list[str]:
    # run_clm.py's hub model and data set cannot be fetched here: the test script builds a tiny GPT-2 itself.
    # --use_cpu: without it, on a host without GPUs, accelerate initialises the process group under torchrun but the
    # Trainer runs undistributed (each rank trains alone as process 0); HF's users on CPUs pass it.
    return swap(argv, "run_clm.py", str(FRAMEWORKS / "hf" / "train_hf.py"),
                drop=("--model_name_or_path", "--dataset_name", "--dataset_config_name", "--max_steps"),
                add=("--max_steps=24", "--use_cpu", "--eval_strategy=steps", "--eval_steps=100000", "--eval_on_start", "--seq_len=64", "--n_embd=128"))


def lightning_argv(argv: list[str], data: Path) -> list[str]:
    return swap(argv, "train.py", str(FRAMEWORKS / "lightning" / "train_lightning.py"), drop=("trainer.max_steps",),
                add=("trainer.max_steps=30", "model.hidden=2048"))


def timm_argv(argv: list[str], data: Path) -> list[str]:
    # --amp: float16 autocast is the GPU recipe's; the CPU runs float32. --log-interval=1: timm prints every update's time.
    return swap(argv, "train.py", str(FRAMEWORKS / "timm" / "train.py"), drop=("--data-dir", "--model", "--amp", "--log-interval"),
                add=(f"--data-dir={data}", "--model=test_resnet", "--input-size", "3", "64", "64", "--num-classes=2", "--device=cpu",
                     "--workers=1", "--warmup-epochs=0", "--log-interval=1", f"--output={data.parent / 'timm_out'}"))


def nanogpt_argv(argv: list[str], data: Path) -> list[str]:
    # nanoGPT's configurator applies its arguments in order: config/tiny_cpu.py shrinks the model after the preset's flags.
    return [*argv, "config/tiny_cpu.py"]


def deepspeed_argv(argv: list[str], data: Path) -> list[str]:
    assert argv[:2] == ["bash", "-c"] and " train.py " in argv[2], argv
    return ["bash", "-c", argv[2].replace(" train.py ", f" {FRAMEWORKS / 'deepspeed' / 'train.py'} ") + " --steps=30 --features=1024 --hidden=2048"]


def prepare_timm(work: Path) -> Path:
    subprocess.run([sys.executable, str(FRAMEWORKS / "timm" / "prepare_data.py"), str(work / "images")], check=True)
    return work / "images"


def prepare_nanogpt(work: Path) -> Path:
    checkout = work / "nanoGPT"  # nanoGPT runs from its checkout (data/<dataset>/, configurator.py)
    shutil.copytree(FRAMEWORKS / "nanogpt", checkout)
    subprocess.run([sys.executable, "data/tiny/prepare.py"], cwd=checkout, check=True)
    return checkout


def independent_from_files(trial_dir: Path, steps_dir: Path, extra_probe_steps: int = 0) -> dict[int, dict[int, float]]:
    """{rank: {probe step index: seconds}} from tests/frameworks/step_times.py's files of this trial."""
    out: dict[int, dict[int, float]] = {}
    for path in sorted(steps_dir.glob(f"{trial_dir.name}.rank*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            out.setdefault(record["rank"], {})[record["step"] - 1 + extra_probe_steps] = record["seconds"]  # steps count from 1, the probe's from 0
    return out


_TIMM = re.compile(r"Train: \d+ \[\s*(\d+)/\d+.*?Time: [\d.]+s,\s*([\d.]+)/s")


_NANOGPT = re.compile(r"^iter (\d+): loss \S+, time ([\d.]+)ms", re.MULTILINE)


def independent_from_log(trial_dir: Path, framework: str, global_batch: int) -> dict[int, dict[int, float]]:
    """{0: {probe step index: seconds}} from the framework's own printed step times (rank 0 prints them)."""
    text = "\n".join(p.read_text(errors="replace") for p in sorted(trial_dir.rglob("*.log")))
    if framework == "timm":  # update i's samples/s over its time (2 decimals of samples/s: finer than its 3 of seconds)
        return {0: {int(i): global_batch / float(rate) for i, rate in _TIMM.findall(text)}}
    return {0: {int(i): float(ms) / 1000.0 for i, ms in _NANOGPT.findall(text)}}  # nanoGPT's dt of iter i


def probe_steps(trial_dir: Path) -> tuple[list[int], dict[int, float]]:
    """The ranks the probe saw stepping, and {step index: seconds of the slowest rank}."""
    from sweep.probe import read_probe

    dirs = sorted({p.parent for p in trial_dir.rglob("*.jsonl") if '"kind"' in p.read_text()[:200]})
    assert len(dirs) == 1, f"probe records expected in one dir of {trial_dir}, found {dirs}"
    report = read_probe(dirs[0])
    return report.ranks, {s.index: s.seconds for s in report.steps}


@dataclass(frozen=True)
class Agreement:
    """The probe against the framework's own timing, over the optimizer steps both timed (past the warm-up)."""

    steps: int
    probe_median: float  # seconds
    own_median: float
    median_ratio: float  # median over those steps of probe / own, step by step
    total_ratio: float  # their sums' ratio: the same wall time, whatever falls between the two marks

    def line(self) -> str:
        return (f"probe {self.probe_median * 1000:7.2f} ms/step, own {self.own_median * 1000:7.2f} ms/step (medians of {self.steps} "
                f"steps); step by step probe/own: median {self.median_ratio:.4f}, in total {self.total_ratio:.4f}")


def compare(probe: dict[int, float], own: dict[int, float], skip: int) -> Agreement:
    """Step by step: each of the two marks an optimizer step's end, one in torch's step hook, the other in the framework's
    callback a little later, so a stall of this busy box between them moves time from one step to the next on one side
    only. The per-step ratios' median and the sums are immune to that; the two medians of step times are not, and are
    reported beside them."""
    common = sorted(i for i in set(probe) & set(own) if i >= skip)
    assert len(common) >= 5, f"too few common steps: probe {sorted(probe)}, own {sorted(own)}"
    return Agreement(
        steps=len(common),
        probe_median=statistics.median(probe[i] for i in common),
        own_median=statistics.median(own[i] for i in common),
        median_ratio=statistics.median(probe[i] / own[i] for i in common),
        total_ratio=sum(probe[i] for i in common) / sum(own[i] for i in common),
    )


@dataclass(frozen=True)
class Case:
    make_argv: Callable[[list[str], Path], list[str]]  # the test-size argv from the shipped preset's
    modules: tuple[str, ...]  # what must be installed
    own_timing: str = "file"  # "file": its callback's step_times file; "log": the step times it prints itself
    prepare: Callable[[Path], Path] | None = None  # writes its data under the work dir, returns where it is
    # Probe steps before the framework's own step 1: DeepSpeed's fp16/bf16 optimizer steps once in
    # initialize_optimizer_states (zero gradients, to create the optimizer state), which the probe counts.
    extra_probe_steps: int = 0
    overrides: tuple[str, ...] = ()  # Hydra overrides of the sweep for the test


CASES = {
    "hf": Case(hf_argv, ("transformers", "accelerate")),
    "lightning": Case(lightning_argv, ("lightning", "rich")),
    # The preset stops a timm trial after 5 figures (timm's train.py has no step limit); the test-size epoch ends itself.
    "timm": Case(timm_argv, ("timm", "torchvision"), own_timing="log", prepare=prepare_timm, overrides=("workload.parser.stop_after=null",)),
    "nanogpt": Case(nanogpt_argv, ("numpy",), own_timing="log", prepare=prepare_nanogpt),
    "deepspeed": Case(deepspeed_argv, ("deepspeed",), extra_probe_steps=1),
}


GLOBAL_BATCH = 16


REPORT: list[str] = []  # printed at the end of the session (the figures for the note)


def run_preset(name: str, tmp_path: Path, machine: str = "local", extra: tuple[str, ...] = (), accums: str = "1,2") -> tuple[Path, Path, subprocess.CompletedProcess]:
    """A real sweep through the shipped preset at test size; returns (sweep dir, step-times dir, process)."""
    case = CASES[name]
    work = tmp_path / "work"
    work.mkdir()
    data = case.prepare(work) if case.prepare else work
    cwd = data if name == "nanogpt" else work
    preset = shipped(name)
    preset["workload"]["argv"] = case.make_argv(preset["workload"]["argv"], data)
    steps_dir = tmp_path / "step_times"
    # Each trial's own timing file, named after the pair (the script reads STEP_TIMES_FILE).
    preset["workload"]["env"] = {**preset["workload"].get("env", {}), "STEP_TIMES_FILE": f"{steps_dir}/accum{{accum}}_split1"}
    confdir = tmp_path / "conf" / "sweep"
    confdir.mkdir(parents=True)
    (confdir / f"{name}_test.yaml").write_text("# @package _global_\n" + yaml.safe_dump(preset))
    sweep_dir = tmp_path / "s"
    proc = run_sweep(
        [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"+sweep={name}_test", f"+machine={machine}", f"hydra.sweep.dir={sweep_dir}",
         f"global_batch_size={GLOBAL_BATCH}", f"accum={accums}", "search=grid", "trial.time_limit_s=300",
         # One thread per rank: the probe and the framework's own callback time the same steps a moment apart, and
         # on a 2-core host shared with other tests a descheduled thread pool would shift time between neighbouring
         # steps on one side only. No end-of-sweep re-timing, and each trial measured to its own end rather than to
         # the sweep's decision or racing's (a pair racing stopped once had 4 steps past the preset's warm-up to compare):
         # these tests compare each trial's steps with the framework's own.
         "machine.cpu_threads=1", "search.drift_check=false", "search.measure_to_decision=false", "search.racing=false",
         *case.overrides, *extra],
        cwd=cwd, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sweep_dir, steps_dir, proc


def trials(sweep_dir: Path, accums: tuple[int, ...] = (1, 2)) -> dict[int, Path]:
    out = {}
    for result in sweep_dir.glob("trials/*/result.json"):
        record = json.loads(result.read_text())
        assert record["status"] == "ok", record
        out[record["accum"]] = result.parent
    assert sorted(out) == list(accums), out
    return out


def own_step_time_over_the_figures_steps(record: dict, probe: dict[int, float], own: dict[int, float]) -> float:
    """For the ranking, the framework's own mean step time over the very steps the sweep's figure rests on (after the
    warm-up and any leading steps core/steady.py left out: warmup_steps counts both), whose probe times are the
    record's. The figure is samples over those steps' wall time (issue 50), so like is compared with like: their own
    mean, every slow step counted, not their median. On a busy box the steps before and after that window can be
    slower or faster as a whole, and another window could order two pairs differently without either side having
    mistimed a step."""
    window = range(record["warmup_steps"], record["warmup_steps"] + len(record["step_times_s"]))
    assert record["step_times_s"] == pytest.approx([probe[i] for i in window], rel=1e-3), (record["step_times_s"], probe)
    return statistics.fmean(own[i] for i in window if i in own)
