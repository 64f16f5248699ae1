"""The sbatch script `python -m sweep` submits for each trial, for the golden files.

The text is built the way a sweep builds it: conf/ composed by Hydra with the same
overrides, sweep.orchestration.settings.read_settings and plan.make_plan, sweep.launch.backend.make_executor, then submitit's own
SlurmExecutor._make_submission_file_text. Only what differs between hosts and runs
is normalised: the sweep dir becomes /SWEEP and the interpreter becomes `python`.

Regenerate the goldens after a deliberate change:

    SWEEP_UPDATE_GOLDEN=1 python -m pytest tests/test_slurm_sweep.py -k golden
    python tests/support/sbatch_golden.py          # the same, without pytest
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden" / "sbatch"
SWEEP_DIR = "/SWEEP"
UPDATE_ENV = "SWEEP_UPDATE_GOLDEN"
SLURM = ["hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu"]

# golden file stem -> the overrides after `python -m sweep`
CASES: dict[str, list[str]] = {
    "local": [*SLURM],
    "cpu2": ["+machine=cpu2", *SLURM],
    "rtx4090x2": ["+machine=rtx4090x2", *SLURM],
    "a5000x8": ["+machine=a5000x8", *SLURM],
    "a100x8": ["+machine=a100x8", *SLURM],
    "h100x8": ["+machine=h100x8", *SLURM],
    # Two nodes of eight GPUs: one trial is one job of 2 x 8 tasks.
    "a100x8_2nodes": ["+machine=a100x8", "machine.nodes=2", "machine.num_devices=16", *SLURM],
    # A command trial (here HF's torchrun preset): one launcher per node, which starts the node's ranks
    # itself; the task gets the CPUs the per-device tasks had between them.
    "hf_a100x8": ["+machine=a100x8", "+sweep=hf", *SLURM],
    "hf_a100x8_2nodes": ["+machine=a100x8", "+sweep=hf", "machine.nodes=2", "machine.num_devices=16", *SLURM],
    # The README's "Running on Slurm" example, flag for flag.
    "readme_example": [
        "+machine=a100x8",
        *SLURM,
        "hydra.launcher.account=speech",
        "hydra.launcher.qos=normal",
        "hydra.launcher.timeout_min=30",
        "hydra.launcher.constraint=a100_80g",
        "+hydra.launcher.additional_parameters.exclusive=true",
        "+hydra.launcher.additional_parameters.mail-type=FAIL",
        'hydra.launcher.setup=["module load cuda/12.4","source ~/venvs/sweep/bin/activate"]',
    ],
}


def compose_plan(overrides: list[str], sweep_dir: str = SWEEP_DIR):
    """The SweepPlan `python -m sweep OVERRIDES hydra.sweep.dir=SWEEP_DIR` would run."""
    from hydra import compose, initialize_config_dir

    from sweep.cli.config import register_configs
    from sweep.orchestration.plan import make_plan
    from sweep.orchestration.settings import read_settings
    from sweep.resources import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("sweep", overrides=[*overrides, f"hydra.sweep.dir={sweep_dir}"], return_hydra_config=True)
    return make_plan(read_settings(cfg, []), Path(sweep_dir))


@contextlib.contextmanager
def _srun_not_required() -> Iterator[None]:
    """SlurmExecutor refuses to exist without `srun` on PATH; writing a script needs no Slurm."""
    import submitit

    if shutil.which("srun"):
        yield
        return
    saved = submitit.SlurmExecutor.__dict__["affinity"]
    submitit.SlurmExecutor.affinity = classmethod(lambda cls: 2)  # type: ignore[assignment]
    try:
        yield
    finally:
        submitit.SlurmExecutor.affinity = saved  # type: ignore[assignment]


def sbatch_text(overrides: list[str], sweep_dir: str = SWEEP_DIR) -> str:
    """The submission script of one trial of that sweep, normalised."""
    from sweep.launch import backend as backends

    plan = compose_plan(overrides, sweep_dir)
    # make_plan has laid the tasks out already; checked again so that a golden never holds a layout it refuses.
    backends.check_task_layout(plan.launcher, plan.machine.num_devices, plan.machine.nodes, one_launcher_per_node=plan.meta.workload == "command")
    with _srun_not_required():
        executor = backends.make_executor(plan.launcher, plan.time_limit_s)
        text = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    return normalise(text, sweep_dir)


def normalise(text: str, sweep_dir: str) -> str:
    """Host- and run-specific parts of a submission script replaced by fixed names."""
    text = text.replace(shlex.quote(sys.executable), "python").replace(sys.executable, "python")
    return text.replace(str(sweep_dir), SWEEP_DIR)


def golden_path(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.sh"


def update_requested() -> bool:
    return os.environ.get(UPDATE_ENV, "") not in ("", "0", "false")


def write_all() -> list[Path]:
    """Rewrite every golden script, and the index saying which command each one pins."""
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    written, index = [], ["# Golden sbatch scripts", "", f"Written by tests/support/sbatch_golden.py ({UPDATE_ENV}=1); do not edit by hand.", ""]
    for name, overrides in CASES.items():
        path = golden_path(name)
        path.write_text(sbatch_text(overrides))
        written.append(path)
        index.append(f"- `{path.name}`: `python -m sweep {' '.join(shlex.quote(o) for o in overrides)}`")
    (GOLDEN_DIR / "README.md").write_text("\n".join(index) + "\n")
    return written


if __name__ == "__main__":
    for p in write_all():
        print(p)
