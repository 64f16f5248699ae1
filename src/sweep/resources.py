"""Where the shipped Hydra configs live: inside the package, so an installed sweep runs from any directory."""

from pathlib import Path

CONF_DIR = str(Path(__file__).resolve().parent / "conf")
