"""Installs the CPU import hooks beside this file into this interpreter: torchvision_cpu/torchvision_cpu_ops.py and
torchaudio_cpu/torchaudio_cpu_ext.py, each by a .pth file in site-packages that puts its folder on sys.path and imports
the module at start-up (PyPI's torchvision and torchaudio are CUDA builds; docs/trainers.md). Idempotent; `--uninstall`
removes both files."""

import os
import sys
import sysconfig

HOOKS = {"torchvision_cpu": "torchvision_cpu_ops", "torchaudio_cpu": "torchaudio_cpu_ext"}  # folder: module


def pth(folder: str) -> str:
    return os.path.join(sysconfig.get_paths()["purelib"], f"sweep_tests_{folder}.pth")


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    for folder, module in HOOKS.items():
        if "--uninstall" in sys.argv:
            if os.path.exists(pth(folder)):
                os.remove(pth(folder))
            continue
        with open(pth(folder), "w") as f:
            # A .pth line that raises prints a traceback at every interpreter start; a moved or deleted clone must
            # leave the interpreter quiet, so the import runs only where the module is still there.
            f.write(f"{os.path.join(here, folder)}\n"
                    f"import importlib.util; importlib.util.find_spec({module!r}) and __import__({module!r})\n")
        print(f"wrote {pth(folder)}")
