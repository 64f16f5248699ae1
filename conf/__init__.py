"""Here so that conf/ is the package sweep.conf (pyproject.toml maps it): the configs ship in the wheel and load alike when editable."""
