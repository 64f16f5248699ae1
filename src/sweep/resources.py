"""Where the shipped Hydra configs live: inside the package, so an installed sweep runs from any directory."""

from pathlib import Path

CONF_DIR = str(Path(__file__).resolve().parent / "conf")


def config_options(group: str) -> list[str]:
    """The names a config group offers (machine, workload, search, sweep), sorted; for `sweep`, a
    user's own ./sweeps/NAME.yaml too. The typed *_schema entries are not options."""
    names = {p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml")}
    if group == "sweep" and Path("sweeps").is_dir():
        names |= {p.stem for p in Path("sweeps").glob("*.yaml")}
    return sorted(n for n in names if not n.endswith("_schema"))
