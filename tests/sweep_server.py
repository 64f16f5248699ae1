"""A fork server for `python -m sweep` (tests/support/sweep_run.py starts it; `python sweep_server.py SOCKET [MODULE...]`).

It imports what `python -m sweep` imports before reading its arguments (or the MODULEs named: torch for
the probe's test scripts, tests/test_probe.py), once, then serves each
request (one JSON line on a Unix socket connection: args, cwd, env, stdout and stderr paths, and
optionally a script) in a forked handler process. The handler forks the run itself, which becomes
`python -m sweep ARGS`, or `python SCRIPT ARGS` for a script that wraps sweep's main (the fault
tests' tests/fault_runner.py), with its working dir, environment, stdin from /dev/null, stdout and
stderr to the files and argv, and ends as the interpreter would; the handler sends back the run's
pid, then its exit status (negative: the signal that ended it, as subprocess reports it).
Each run first does what an interpreter's start does with its environment (PYTHONPATH,
sitecustomize): how sweep's probe starts in a command's processes.

The server is single-threaded (a process that forks should not have other threads), reaps its
handlers between connections, and exits when the process that started it is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import site
import socket
import sys
import threading
import traceback

PRELOAD = ("sweep.cli.main", "sweep.orchestration.entry", "hydra.main", "submitit")


def become_sweep(request: dict) -> int:
    """In the forked run: `python -m sweep ARGS` (or `python SCRIPT ARGS`) as a fresh interpreter would run it; its exit status."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path in ((0, os.devnull), (1, request["stdout"]), (2, request["stderr"])):
        if fd == 2 and path == request["stdout"]:
            os.dup2(1, 2)  # both to one file, as `2>&1` puts them (two opens would write over each other)
            continue
        target = os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    script = request.get("script")
    if script:  # `python SCRIPT ARGS`: the script's dir first on sys.path, as the interpreter puts it
        sys.argv = [script, *request["args"]]
        sys.orig_argv = [sys.executable, script, *request["args"]]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    else:
        sys.argv = ["-m", *request["args"]]  # runpy puts the module's path first, as `python -m` does
        sys.orig_argv = [sys.executable, "-m", "sweep", *request["args"]]
    start_up()
    code = 0
    try:
        if script:
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module("sweep", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())  # as the interpreter reports it (a probe's hook records an OOM there)
        code = 1
    # What the interpreter does at exit: wait for non-daemon threads, run atexit, flush.
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code


def start_up() -> None:
    """What the interpreter's start does with the run's environment: PYTHONPATH's entries after the script's
    dir on sys.path, then `import sitecustomize` from there (sweep's probe, when the env puts its boot dir
    first). What this server preloaded is imported already, as if the site file had imported it first."""
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[1:1] = [p for p in entries if p not in sys.path]
    sys.modules.pop("sitecustomize", None)
    site.execsitecustomize()


def handle(connection: socket.socket) -> None:
    """In the forked handler: run one request and report its pid and exit status."""
    connection.settimeout(None)
    request = json.loads(connection.makefile("r").readline())
    pid = os.fork()
    if pid == 0:
        connection.close()
        code = 1
        try:
            code = become_sweep(request)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    connection.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())


def serve(path: str, preload: tuple[str, ...] = PRELOAD) -> None:
    for module in preload:
        importlib.import_module(module)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    listener.settimeout(1.0)
    print("ready", flush=True)
    while os.getppid() == parent:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            continue
        if os.fork() == 0:
            listener.close()
            try:
                handle(connection)
            finally:
                os._exit(0)
        connection.close()


if __name__ == "__main__":
    serve(sys.argv[1], tuple(sys.argv[2:]) or PRELOAD)
