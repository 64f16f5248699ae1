"""`python tests/fault_runner.py ARGS` is `python -m sweep ARGS` on a slow disk, for the kill tests.

With SWEEP_FAULT_SLOW_FSYNC=NAME:SECONDS (e.g. trials.csv:0.3), the orchestrator's atomic
writes of files called NAME wait SECONDS between writing the temp file and renaming it into
place (as on a slow disk), so a test can SIGKILL it while that file is being written: its
temp file, .NAME.*.tmp, exists exactly then. Nothing else changes: the real
sweep.records.atomic_write_text runs, only its os.fsync is slowed. Trial jobs are unaffected.
"""

import os
import sys
import time


def _slow_fsync(name: str, delay_s: float) -> None:
    import sweep.records as results

    real = results.os

    class SlowDisk:
        def __getattr__(self, attr):
            return getattr(real, attr)

        def fsync(self, fd):
            try:
                base = real.path.basename(real.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                base = ""
            if base.startswith(f".{name}."):
                time.sleep(delay_s)
            real.fsync(fd)

    results.os = SlowDisk()


if __name__ == "__main__":
    spec = os.environ.get("SWEEP_FAULT_SLOW_FSYNC")
    if spec:
        name, _, delay = spec.rpartition(":")
        _slow_fsync(name, float(delay))
    from sweep.cli.main import main

    sys.exit(main())
