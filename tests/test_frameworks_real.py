"""Every shipped framework preset, run as shipped against its real framework from PyPI, at test size on the CPU.

For each of HF Trainer, Lightning, timm's own train.py, nanoGPT's own train.py and DeepSpeed, a real sweep
through `+sweep=<preset>` (the shipped file, with only the script and the model/data flags swapped for the test
scripts under tests/frameworks/; the preset's launcher, batch flags, parser and settings unchanged), then:
- the probe's per-step times match the framework's own timing of the same optimizer steps (a callback of the
  framework's writing its own file, or the framework's own printed step time) within 2% (medians);
- the pairs rank the same by either;
- on +machine=cpu2 a torchrun command starts exactly 2 ranks per trial, counted from the probe's records and
  from the script's own files;
- with workload.probe=false the preset's log figures stand beside the probe's (`python -m sweep.logs`).

The frameworks are installed by .ci/run (`pip install -e .[frameworks]`; torchvision through
tests/frameworks/torchvision_cpu, see docs/trainers.md). Each module is skipped, with its reason, where its
framework is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.frameworks import (
    CASES,
    GLOBAL_BATCH,
    RANKING_NOISE,
    REPORT,
    TOLERANCE,
    TOTAL_TOLERANCE,
    compare,
    independent_from_files,
    independent_from_log,
    needs,
    own_step_time_over_the_figures_steps,
    probe_steps,
    run_preset,
    shipped,
    trials,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # slow: the real frameworks, a minute of CPU and more (--full)

# The presets at test size, the sweeps and how each side's figures are read: tests/support/frameworks.py.


@pytest.mark.parametrize("name", list(CASES))
def test_a_preset_swept_as_shipped_is_timed_by_the_probe_as_by_the_framework(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    for module in case.modules:
        pytest.importorskip(module, reason=f"{module} not installed (pip install -e .[frameworks])")
    sweep_dir, steps_dir, _ = run_preset(name, tmp_path)
    skip = max(3, int(shipped(name)["workload"]["parser"]["skip_first"]))  # the preset's warm-up, at least 3 steps
    own_step_times, sweep_figures = {}, {}
    for accum, trial_dir in sorted(trials(sweep_dir).items()):
        ranks, probe = probe_steps(trial_dir)
        if case.own_timing == "file":
            own = independent_from_files(trial_dir, steps_dir, case.extra_probe_steps)
        else:
            own = independent_from_log(trial_dir, name, GLOBAL_BATCH)
        assert ranks == [0] and list(own) == [0], (ranks, list(own))
        agreement = compare(probe, own[0], skip)
        record = json.loads((trial_dir / "result.json").read_text())
        assert record["measured_by"] == "probe", record
        sweep_figures[accum] = record["throughput"]
        own_step_times[accum] = own_step_time_over_the_figures_steps(record, probe, own[0])
        REPORT.append(f"{name:9s} accum={accum} micro-batch={GLOBAL_BATCH // accum:2d}: {agreement.line()}; "
                      f"the sweep recorded {record['throughput']:,.1f} {record['throughput_unit']}")
        assert agreement.median_ratio == pytest.approx(1, abs=TOLERANCE), REPORT[-1]
        # The sums share every boundary but the two ends, where one stall of this busy box (tens of ms against a
        # span of 1-3 s) can still fall between the two marks: a looser bound, the per-step ratio being the check.
        assert agreement.total_ratio == pytest.approx(1, abs=TOTAL_TOLERANCE), REPORT[-1]
        if name in CROSS_CHECKED:
            REPORT.append(log_beside_probe(name, trial_dir, accum))
    # The ranking: the sweep's figures (the probe's) order the pairs as the framework's own step times do, unless
    # those are too close for an order (run-to-run noise between two trial processes on this box is several %).
    by_sweep = sorted(sweep_figures, key=lambda a: -sweep_figures[a])
    by_own = sorted(own_step_times, key=lambda a: own_step_times[a])
    close = abs(own_step_times[1] / own_step_times[2] - 1) < RANKING_NOISE
    REPORT.append(f"{name:9s} fastest by the sweep: accum={by_sweep[0]}, by its own timing: accum={by_own[0]}"
                  + (" (within the noise: not ranked)" if close else ""))
    assert close or by_sweep == by_own, REPORT[-1]


@needs("transformers", "accelerate")
def test_torchrun_on_cpu2_starts_two_ranks_per_trial(tmp_path: Path) -> None:
    """The HF preset's `torchrun --nproc_per_node={nproc_per_node}` on +machine=cpu2 (gloo): one launcher per trial,
    2 ranks, as both the probe (the processes that stepped an optimizer) and the Trainer (its process_index) say."""
    # One pair: each trial is one torchrun of two HF ranks (the heaviest processes of the suite), and the second pair
    # repeated the same check; the per-trial ports of two trials side by side are test_command_workload's.
    sweep_dir, steps_dir, _ = run_preset("hf", tmp_path, machine="cpu2", accums="2")
    skip = int(shipped("hf")["workload"]["parser"]["skip_first"])
    for accum, trial_dir in sorted(trials(sweep_dir, (2,)).items()):
        ranks, probe = probe_steps(trial_dir)
        stepping = [p.name for p in trial_dir.glob("probe-*/*.jsonl") if '"kind":"step"' in p.read_text().replace(" ", "")]
        own = independent_from_files(trial_dir, steps_dir)
        slowest_rank = {i: max(own[r][i] for r in own) for i in set.intersection(*(set(times) for times in own.values()))}
        agreement = compare(probe, slowest_rank, skip)
        REPORT.append(f"hf on cpu2 accum={accum}: {len(stepping)} processes stepped an optimizer, the probe saw ranks {ranks}, "
                      f"the Trainer's own files came from ranks {sorted(own)}; slowest rank: {agreement.line()}")
        assert len(stepping) == 2 and ranks == [0, 1] and sorted(own) == [0, 1], REPORT[-1]
        assert agreement.median_ratio == pytest.approx(1, abs=TOLERANCE), REPORT[-1]


CROSS_CHECKED = ("hf", "lightning", "timm")


def log_beside_probe(name: str, trial_dir: Path, accum: int) -> str:
    """`python -m sweep.logs` on the trial's log with the preset's parser: the log's figures beside the probe's
    (its records of the same run, probe-N beside command-N.log)."""
    log = max(trial_dir.glob("command-*.log"), key=lambda p: int(p.stem.split("-")[1]))
    logs = subprocess.run(
        [sys.executable, "-m", "sweep.logs", str(log), "--parser", shipped(name)["workload"]["parser"]["type"],
         f"--global-batch-size={GLOBAL_BATCH}", f"--accum={accum}"],
        capture_output=True, text=True, timeout=120,
    )
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert "probe throughput:" in logs.stdout and "log vs probe:" in logs.stdout, logs.stdout
    tail = [line for line in logs.stdout.splitlines() if line.startswith(("throughput:", "from:", "probe", "log vs probe"))]
    return f"  python -m sweep.logs {log.relative_to(trial_dir.parent.parent)} --parser {name}:\n    " + "\n    ".join(tail)


@pytest.mark.parametrize("name", CROSS_CHECKED)
def test_with_the_probe_off_the_preset_reads_the_log(name: str, tmp_path: Path) -> None:
    """workload.probe=false: the log preset is what the sweep reads (the fallback, for non-PyTorch trainers too)."""
    for module in CASES[name].modules:
        pytest.importorskip(module, reason=f"{module} not installed (pip install -e .[frameworks])")
    sweep_dir, _, _ = run_preset(name, tmp_path, extra=("workload.probe=false",), accums="2")  # one pair: the log is what is tested
    for accum, trial_dir in sorted(trials(sweep_dir, (2,)).items()):
        record = json.loads((trial_dir / "result.json").read_text())
        assert record["measured_by"] == "log" and not list(trial_dir.glob("probe-*")), record
        assert record["throughput"] > 0, record
        REPORT.append(f"{name:9s} accum={accum} workload.probe=false: the sweep recorded {record['throughput']:.1f} {record['throughput_unit']} "
                      f"from the log ({record.get('steps_measured')} figures)")


def teardown_module() -> None:
    if REPORT:
        print("\n" + "\n".join(REPORT))
