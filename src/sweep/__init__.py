"""sweep: find the fastest (grad_accumulation_batches, batch_split_factor) at a fixed global batch.

    import sweep
    df = sweep.load("outputs/latest")        # one sweep's table as a pandas DataFrame
    sweep.compare(["outputs/a", "outputs/b"])  # several sweeps side by side
    sweep.run_to_run("outputs/*")             # each machine's run-to-run noise, from repeated pairs
"""

from __future__ import annotations

import sys
from typing import Any

__version__ = "0.1.0"

if sys.argv[:1] == ["-m"]:
    # `python -m sweep...` while runpy still locates __main__ (argv[0] is "-m" only then): from here
    # until sweep first writes, a Ctrl-C ends the process with one line (sweep/startup.py).
    from sweep import startup

    startup.install()

__all__ = ["load", "compare", "run_to_run", "__version__"]


def __getattr__(name: str) -> Any:
    # pandas is imported only when the API is used, so `python -m sweep` starts fast.
    if name == "load":
        from sweep.analysis import api

        return api.load
    if name in ("compare", "run_to_run"):
        from sweep.analysis import compare

        return getattr(compare, name)
    raise AttributeError(f"module 'sweep' has no attribute {name!r}")
