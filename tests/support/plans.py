"""What `python -m sweep ARGUMENTS` would run, planned without launching anything (tests/test_readme.py,
test_screening.py, test_settings.py)."""

from __future__ import annotations

from pathlib import Path


def plan(arguments: list[str], sweep_dir: Path):
    """What `python -m sweep ARGUMENTS` would run: Hydra composes the fixed overrides, the sweeper plans the swept knobs."""
    from hydra import compose, initialize_config_dir

    from sweep.cli.config import register_configs
    from sweep.orchestration.plan import make_plan
    from sweep.orchestration.settings import SWEEPABLE, read_settings
    from sweep.resources import CONF_DIR

    swept = [a for a in arguments if a.split("=", 1)[0] in SWEEPABLE]
    fixed = [a for a in arguments if a not in swept and not a.startswith("hydra.sweep.dir=")]
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("sweep", overrides=[*fixed, f"hydra.sweep.dir={sweep_dir}"], return_hydra_config=True)
        moved = _in_a_checkout(cfg, sweep_dir.parent / "checkout")
        if moved:
            cfg = compose("sweep", overrides=[*fixed, *moved, f"hydra.sweep.dir={sweep_dir}"], return_hydra_config=True)
    return make_plan(read_settings(cfg, swept), sweep_dir)


def _in_a_checkout(cfg, checkout: Path) -> list[str]:
    """The docs' command sweeps run from the trainer's checkout (the command runs where sweep starts, and
    its script is checked there before launch): the scripts its argv names, as empty files where it runs.
    A workload.cwd that is not on this host (the docs' /tmp/nanogpt) becomes checkout: the override."""
    from sweep.workloads.command.template import script_arguments

    workload = cfg.workload
    if workload.get("name") != "command":
        return []
    cwd, moved = workload.get("cwd"), []
    if cwd and not Path(cwd).is_dir():
        checkout.mkdir(parents=True, exist_ok=True)
        cwd, moved = str(checkout), [f"workload.cwd={checkout}"]
    for script in script_arguments([str(a) for a in workload.argv]):
        path = Path(cwd or ".") / script
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    return moved
