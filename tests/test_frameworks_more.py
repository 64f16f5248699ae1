"""Five more trainers, each real from PyPI, swept as a user sweeps their own script, at test size on the CPU.

pytorch-ignite, skorch, SpeechBrain, fastai (its default optimizer, and `OptimWrapper(torch.optim.AdamW)`) and
Keras 3 on torch (`KERAS_BACKEND=torch`): a small script in each framework's own idiom under tests/frameworks/<name>/,
with the framework's own gradient accumulation and its own per-step timing written to a side file
(tests/frameworks/step_times.py). No log preset: each is swept as docs/trainers.md's "Sweeping your own training
script" says, the shipped sweeps/my_script.yaml as it is (ignite, skorch, fastai, Keras: `python train.py
--batch-size={per_device_batch} --accum={accum}` in the script's dir), or `workload=command` and an argv with
`{per_device_batch}` and `{accum}` (SpeechBrain's recipe flags, fastai with AdamW), nothing else about the framework. Then,
as tests/test_frameworks_real.py checks the shipped presets (its helpers are used here):
- the probe's per-step times match the framework's own timing of the same steps within 2% (step by step), and
  the record names the signal the probe timed them by: "optimizer steps" where the trainer steps a torch.optim
  optimizer, "backward passes" (`accum` of them a step) where it does not (fastai's own Adam, Keras 3's Adam);
- where the probe counts backward passes, as many as the framework's own steps times `accum`;
- the pairs rank the same by either timing.

The frameworks are installed by .ci/run (`pip install -e .[frameworks]`; SpeechBrain's torchaudio through
tests/frameworks/torchaudio_cpu, see docs/trainers.md). Each case is skipped, with its reason, where its framework
is not installed.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.frameworks import (
    RANKING_NOISE,
    TOLERANCE,
    TOTAL_TOLERANCE,
    compare,
    independent_from_files,
    own_step_time_over_the_figures_steps,
    trials,
)
from support.sweep_run import run_sweep

FRAMEWORKS = Path(__file__).with_name("frameworks")
GLOBAL_BATCH = 1024
ACCUMS = (1, 8)  # far enough apart that the framework's own timing usually ranks them (8 micro-batches' overhead a step)
BATCH_FLAGS = ("--batch-size={per_device_batch}", "--accum={accum}")
OPTIMIZER_STEPS, BACKWARD_PASSES = "optimizer steps", "backward passes"

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # slow: the real frameworks, a minute of CPU and more (--full)


@dataclass(frozen=True)
class Case:
    # The sweep's workload.argv, placeholders and all; empty: the shipped sweeps/my_script.yaml as it is (`python
    # train.py --batch-size={per_device_batch} --accum={accum}`), run in the framework's dir.
    argv: tuple[str, ...]
    modules: tuple[str, ...]  # what must be installed
    signal: str  # what the probe times a step by (the record's probe_signal)
    env: tuple[tuple[str, str], ...] = ()  # the environment the user runs `python -m sweep` in


def script(name: str) -> str:
    return str(FRAMEWORKS / name / "train.py")


CASES = {
    "ignite": Case((), ("ignite",), OPTIMIZER_STEPS),
    "skorch": Case((), ("skorch",), OPTIMIZER_STEPS),
    # SpeechBrain's recipes: the hparams file, then overrides of it and SpeechBrain's own run options.
    "speechbrain": Case(("python", script("speechbrain"), str(FRAMEWORKS / "speechbrain" / "hparams.yaml"), "--device=cpu",
                         "--batch_size={per_device_batch}", "--grad_accumulation_factor={accum}"), ("speechbrain",), OPTIMIZER_STEPS),
    "fastai": Case((), ("fastai",), BACKWARD_PASSES),
    "fastai_adamw": Case(("python", script("fastai"), *BATCH_FLAGS, "--opt=adamw"), ("fastai",), OPTIMIZER_STEPS),
    "keras": Case((), ("keras",), BACKWARD_PASSES, env=(("KERAS_BACKEND", "torch"),)),
}
REPORT: list[str] = []  # printed at the end of the module (the figures for the note)


def hydra_list(items: tuple[str, ...]) -> str:
    return "[" + ",".join(json.dumps(item) for item in items) + "]"  # quoted: `{` opens a dict in Hydra's grammar


def sweep_command(name: str, tmp_path: Path) -> tuple[Path, Path]:
    """The user's sweep of the case's script (and the test's own settings); returns (sweep dir, step-times dir)."""
    case = CASES[name]
    work, steps_dir, sweep_dir = tmp_path / "work", tmp_path / "step_times", tmp_path / "s"
    work.mkdir()
    how = ["workload=command", f"workload.argv={hydra_list(case.argv)}"] if case.argv else ["+sweep=my_script", f"workload.cwd={FRAMEWORKS / name}"]
    proc = run_sweep(
        [*how,
         # Each trial's own timing file, named after the pair (the script reads STEP_TIMES_FILE).
         f"+workload.env.STEP_TIMES_FILE={json.dumps(f'{steps_dir}/accum{{accum}}_split1')}",
         f"hydra.sweep.dir={sweep_dir}", f"global_batch_size={GLOBAL_BATCH}", f"accum={','.join(map(str, ACCUMS))}", "search=grid", "trial.time_limit_s=300",
         # As tests/test_frameworks_real.py runs them: one thread, no end-of-sweep re-timing, each trial measured to
         # its own end (trial.target_precision, else the script's end, at 30 steps) rather than to
         # racing's or the decision's.
         "machine.cpu_threads=1", "search.drift_check=false", "search.measure_to_decision=false", "search.racing=false"],
        cwd=work, timeout=900, env=dict(case.env),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sweep_dir, steps_dir


def probe_times(trial_dir: Path, accum: int) -> tuple[str, list[int], dict[int, float], int]:
    """What the probe timed in this trial: (signal, ranks, {step index: seconds of the slowest rank}, backward passes).

    By optimizer steps the index is the probe's step's; by backward passes step i of backward_step_times is the
    trainer's step i+1 (the first has no start the backward passes show), so that is its index here."""
    from sweep.core.probe_report import backward_step_times
    from sweep.probe import read_probe

    dirs = sorted({p.parent for p in trial_dir.rglob("*.jsonl") if '"kind"' in p.read_text()[:200]})
    assert len(dirs) == 1, f"probe records expected in one dir of {trial_dir}, found {dirs}"
    report = read_probe(dirs[0])
    # Where a torch.optim step exists the probe writes no record per backward pass (issue 50): its steps count them.
    backwards = sum(len(ats) for _, ats in report.backward_ats.values()) or sum(s.backwards or 0 for s in report.steps)
    if report.step_times_s:
        return OPTIMIZER_STEPS, report.ranks, {s.index: s.seconds for s in report.steps}, backwards
    ranks = sorted({rank for rank, _ in report.backward_ats.values()})
    return BACKWARD_PASSES, ranks, {i + 1: t for i, t in enumerate(backward_step_times(report, accum))}, backwards


@pytest.mark.parametrize("name", list(CASES))
def test_a_framework_swept_as_a_users_command_is_timed_by_the_probe_as_by_itself(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    for module in case.modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} not installed (pip install -e .[frameworks])")
    sweep_dir, steps_dir = sweep_command(name, tmp_path)
    skip = 3  # past the trial's warm-up (2 steps), as tests/test_frameworks_real.py compares
    own_step_times, sweep_figures = {}, {}
    for accum, trial_dir in sorted(trials(sweep_dir, ACCUMS).items()):
        record = json.loads((trial_dir / "result.json").read_text())
        signal, ranks, probe, backwards = probe_times(trial_dir, accum)
        own = independent_from_files(trial_dir, steps_dir)
        assert record["measured_by"] == "probe" and record["probe_signal"] == signal == case.signal, (record, signal)
        assert ranks == [0] and list(own) == [0], (ranks, list(own))
        # The accumulation the framework ran is the one asked for: accum backward passes to each of its own steps
        # (its file marks steps 2..n; the command is stopped once measured, possibly inside a step).
        own_steps = max(own[0]) + 1
        assert own_steps * accum <= backwards < (own_steps + 2) * accum, (own_steps, accum, backwards)
        if signal == OPTIMIZER_STEPS:
            assert record["backward_per_step"] == accum, record
        else:  # its own optimizer: the probe saw its parameters change once every accum backward passes
            assert record["backward_per_update"] == accum and record["status"] == "ok", record
        agreement = compare(probe, own[0], skip)
        sweep_figures[accum] = record["throughput"]
        own_step_times[accum] = own_step_time_over_the_figures_steps(record, probe, own[0])
        REPORT.append(f"{name:12s} accum={accum} micro-batch={GLOBAL_BATCH // accum:4d} by {signal}: {agreement.line()}; "
                      f"the sweep recorded {record['throughput']:,.1f} {record['throughput_unit']}")
        assert agreement.median_ratio == pytest.approx(1, abs=TOLERANCE), REPORT[-1]
        assert agreement.total_ratio == pytest.approx(1, abs=TOTAL_TOLERANCE), REPORT[-1]
    by_sweep = sorted(sweep_figures, key=lambda a: -sweep_figures[a])
    by_own = sorted(own_step_times, key=lambda a: own_step_times[a])
    close = abs(own_step_times[ACCUMS[0]] / own_step_times[ACCUMS[1]] - 1) < RANKING_NOISE
    REPORT.append(f"{name:12s} fastest by the sweep: accum={by_sweep[0]}, by its own timing: accum={by_own[0]}"
                  + (" (within the noise: not ranked)" if close else ""))
    assert close or by_sweep == by_own, REPORT[-1]


def teardown_module() -> None:
    if REPORT:
        print("\n" + "\n".join(REPORT))
