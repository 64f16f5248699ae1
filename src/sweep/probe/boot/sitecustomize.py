"""sweep's probe, started in every Python process of a trial (the way coverage.py measures subprocesses).

`sweep.probe.probe_env` puts this directory first on PYTHONPATH and sets SWEEP_PROBE_DIR, so every
interpreter a command starts (python, torchrun's ranks, deepspeed, accelerate launch, srun's tasks)
runs this file at start-up. With SWEEP_PROBE_DIR unset it does nothing at all. With it set, it only
arms an import hook: nothing more happens until the process imports torch (_sweep_probe.py).

It never raises: a broken probe must not break the user's training. It then runs the sitecustomize
this one shadows, if there is one further along sys.path.
"""


def _arm_probe() -> None:
    import os
    import sys

    if not os.environ.get("SWEEP_PROBE_DIR"):
        return
    try:
        if "torch" in sys.modules:  # imported already (this file was run late): arm now
            _arm_now()
            return
        from _sweep_probe_import import AfterImport  # beside this file: the probe's boot dir

        # Arms right after `torch` finishes importing; nothing else is imported or run before that (a process that
        # never imports torch only carries this object).
        if not any(isinstance(f, AfterImport) and f.name == "torch" for f in sys.meta_path):
            sys.meta_path.insert(0, AfterImport("torch", lambda module: _arm_now()))
    except Exception as exc:  # noqa: BLE001 - record, never break the user's process
        _note_failure(f"the probe could not arm: {type(exc).__name__}: {exc}")


def _arm_now() -> None:
    import os

    try:
        import _sweep_probe

        _sweep_probe.arm_quietly(os.environ["SWEEP_PROBE_DIR"])
    except Exception as exc:  # noqa: BLE001
        _note_failure(f"the probe could not arm: {type(exc).__name__}: {exc}")


def _note_failure(message: str) -> None:
    """Say why in the record dir, the one place sweep reads; never on the user's terminal."""
    try:
        import json
        import os
        import time

        path = os.path.join(os.environ["SWEEP_PROBE_DIR"], f"problem-pid{os.getpid()}.jsonl")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps({"kind": "problem", "pid": os.getpid(), "t": time.time(), "message": message}) + "\n")
    except Exception:  # noqa: BLE001
        pass


def _run_shadowed_sitecustomize() -> None:
    """Exec the next `sitecustomize` on sys.path after this directory (the one we shadow)."""
    import importlib.machinery
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    later = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", later)
        if spec is None or spec.loader is None or spec.origin in (None, os.path.abspath(__file__)):
            return
        # PathFinder's loaders are file loaders, which have get_code; typeshed's Loader does not say so.
        code = spec.loader.get_code("sitecustomize")  # type: ignore[attr-defined]
        if code is None:
            return
        # Its own globals, as if it had been imported itself; it sees __file__ as its own.
        namespace = {"__name__": "sitecustomize", "__file__": spec.origin, "__spec__": spec, "__builtins__": __builtins__}
        exec(code, namespace)
    except Exception as exc:  # noqa: BLE001 - the shadowed file's own failure, reported like site.py does
        if os.environ.get("SWEEP_PROBE_DIR"):
            _note_failure(f"the shadowed sitecustomize failed: {type(exc).__name__}: {exc}")
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)


try:
    _arm_probe()
finally:
    _run_shadowed_sitecustomize()
