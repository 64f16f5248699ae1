"""Installs torchaudio_cpu_ext (beside this file) into this interpreter: a .pth file in site-packages that puts
this folder on sys.path and imports the module at start-up. Idempotent; `--uninstall` removes the file."""

import os
import sys
import sysconfig

PTH = os.path.join(sysconfig.get_paths()["purelib"], "sweep_tests_torchaudio_cpu.pth")

if __name__ == "__main__":
    if "--uninstall" in sys.argv:
        if os.path.exists(PTH):
            os.remove(PTH)
    else:
        here = os.path.dirname(os.path.abspath(__file__))
        with open(PTH, "w") as f:
            f.write(f"{here}\nimport torchaudio_cpu_ext\n")
        print(f"wrote {PTH}")
