"""Where the shipped configs live: the repository's conf/ and sweeps/, which ship inside the package as
sweep.conf and sweep.sweeps (pyproject.toml), so an installed sweep runs from any directory.

importlib.resources finds both the same way in a wheel install and an editable one. A checkout run with src/ on
PYTHONPATH and no install at all (the GPU machines' way: no network there to install from) has no sweep.conf to
import: its configs are the checkout's own conf/ and sweeps/, next to src/."""

from importlib.resources import files
from pathlib import Path


def _shipped(package: str, in_checkout: str) -> str:
    try:
        return str(files(package))
    except ModuleNotFoundError:  # not installed: src/sweep/resources.py is in a checkout, two levels below its top
        return str(Path(__file__).resolve().parents[2] / in_checkout)


# The primary config (sweep.yaml) and the groups machine/, search/, workload/.
CONF_DIR = _shipped("sweep.conf", "conf")
# The shipped sweeps, one NAME.yaml per preset: the group `sweep` (+sweep=NAME), after a user's own ./sweeps/.
SWEEPS_DIR = _shipped("sweep.sweeps", "sweeps")
# A user's own sweeps, relative to the directory sweep runs in; a NAME.yaml there wins over a shipped one.
USER_SWEEPS_DIR = "sweeps"


def config_options(group: str) -> list[str]:
    """The names a config group offers (machine, workload, search, sweep), sorted; for `sweep`, the shipped
    sweeps and a user's own ./sweeps/NAME.yaml. The typed *_schema entries are not options."""
    dirs = [Path(SWEEPS_DIR), Path(USER_SWEEPS_DIR)] if group == "sweep" else [Path(CONF_DIR) / group]
    names = {p.stem for d in dirs if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(n for n in names if not n.endswith("_schema"))
