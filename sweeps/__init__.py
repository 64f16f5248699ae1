"""Here so that sweeps/ is the package sweep.sweeps (pyproject.toml maps it): the presets ship in the wheel and load alike when editable."""
