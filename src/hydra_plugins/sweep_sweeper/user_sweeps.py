"""The `sweep` config group (`+sweep=NAME`): a user's own `./sweeps/NAME.yaml` first, then the shipped sweeps.

The shipped sweeps are the repository's top-level `sweeps/`, one NAME.yaml per preset, which ships inside the
package as sweep.sweeps (sweep/resources.py's SWEEPS_DIR), so an installed sweep runs from any directory. Sweep
definitions a team keeps in its own repo are found in the working directory's `sweeps/` folder, searched before
the shipped ones so that a local file of the same name wins. Hydra's search path holds config roots whose group
folders match the group names; a `sweeps/` folder holds the files themselves, named for people, not for the
`sweep` group, so a small config source maps the one onto the other for both.
Kept import-light: Hydra imports every module under hydra_plugins at plugin discovery.
"""

from __future__ import annotations

import os
from typing import List, Optional

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

GROUP = "sweep"


class UserSweepsConfigSource(ConfigSource):
    """`sweeps://DIR`: DIR/NAME.yaml is the config `sweep/NAME`; nothing else in DIR is a config."""

    @staticmethod
    def scheme() -> str:
        return "sweeps"

    def _file(self, config_path: str) -> Optional[str]:
        group, _, name = self._normalize_file_name(config_path).partition("/")
        if group != GROUP or not name or "/" in name:
            return None
        return os.path.join(self.path, name)

    def load_config(self, config_path: str) -> ConfigResult:
        path = self._file(config_path)
        if path is None or not os.path.isfile(path):
            raise ConfigLoadError(f"Config not found : {path or config_path}")
        with open(path, encoding="utf-8") as f:
            header = ConfigSource._get_header_dict(f.read(512))
            f.seek(0)
            return ConfigResult(config=OmegaConf.load(f), path=f"{self.scheme()}://{self.path}", provider=self.provider, header=header)

    def available(self) -> bool:
        return os.path.isdir(self.path)

    def is_group(self, config_path: str) -> bool:
        return config_path in ("", GROUP) and self.available()

    def is_config(self, config_path: str) -> bool:
        path = self._file(config_path)
        return path is not None and os.path.isfile(path)

    def list(self, config_path: str, results_filter: Optional[ObjectType]) -> List[str]:
        if not self.is_group(config_path):
            return []
        files: List[str] = []
        names = [GROUP] if config_path == "" else sorted(os.listdir(self.path))
        for name in names:
            self._list_add_result(files=files, file_path=os.path.join(config_path, name), file_name=name, results_filter=results_filter)
        return sorted(set(files))

    # _list_add_result asks is_group/is_config with the joined path; a folder under sweeps/ is no group.


class UserSweepsSearchPath(SearchPathPlugin):
    """The shipped sweeps appended to the search path; a user's ./sweeps, where there is one, put before everything."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        # Deferred so that plugin discovery imports nothing of sweep's.
        from sweep.resources import CONF_DIR, SWEEPS_DIR, USER_SWEEPS_DIR

        # Sweep's own app only (its primary config dir is on the path): other Hydra apps here get no `sweep` group.
        if not any(os.path.abspath(entry.path.removeprefix("file://")) == os.path.abspath(CONF_DIR) for entry in search_path.get_path()):
            return
        search_path.append(provider="sweep", path=f"sweeps://{SWEEPS_DIR}")
        user_dir = os.path.abspath(USER_SWEEPS_DIR)
        # Run from a checkout's root, ./sweeps is the shipped dir itself: once on the path is enough.
        if os.path.isdir(user_dir) and not os.path.samefile(user_dir, SWEEPS_DIR):
            search_path.prepend(provider="sweep-user", path=f"sweeps://{user_dir}")
