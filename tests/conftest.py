"""Shared fixtures and the suite's selection. Helpers the tests share live in tests/support/ (no test imports another).

`python -m pytest` runs the default selection, a few minutes on 2 cores; `python -m pytest --full` runs
everything CI runs: besides those, the tests marked `slurm` (a real Slurm cluster on this machine,
tests/support/slurm_cluster.py) and `slow` (the real frameworks, the fault campaigns, the slowest end-to-end
sweeps: every test function that took 7 CPU-seconds or more, by `--cpu-report`; docs/development.md). Without --full they are
deselected, and the summary's last line says how many.

The suite runs on every core with pytest-xdist (`-n logical --dist loadgroup` in pyproject.toml), each
test where a worker is free, except tests that share something costly, which one worker runs together
(an xdist group): the Slurm tests share one cluster (a session fixture, started once per run whatever
worker asks: tests/support/slurm_cluster.py), and a module whose tests share a module fixture that runs
sweeps or trials would otherwise run it on every worker.

A test that starts `python -m sweep` (a fresh interpreter, or one forked by tests/support/sweep_run.py) must
carry the `e2e` marker: such a start from a test without it fails, naming the marker."""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from support import slurm_cluster as cluster_support
from support import sweep_run
from support.cpu_report import CpuReport
from support.slurm_cluster import slurm_cluster, slurm_nodes  # noqa: F401  (fixtures of the Slurm tests: the cluster, its two-node partition)

# Markers whose tests only `--full` runs (pyproject.toml registers them).
FULL_ONLY = ("slurm", "slow")
FULL_HINT = "python -m pytest --full"

# Modules whose module-scoped fixture runs real sweeps or trials (tens of seconds of CPU): the fixture's name.
SHARED_MODULE_FIXTURES = {
    "test_bad_input.py": "outcomes",  # every bad-input case as its own `python -m sweep`, all at once
    "test_faults.py": "reference",  # the kill campaigns' uninterrupted reference sweep
    "test_fingerprint.py": "finished",  # one finished sweep the refusals are tried against
    "test_memory.py": "real_ooms",  # real OOMs in one subprocess
}
# Modules that fork scripts from the torch fork server (sweep_run.forked_python): on one worker, one server imports
# torch and torch._dynamo (3.3 s of CPU) for all of them, rather than one on every worker.
TORCH_SERVER_MODULES = ("test_probe.py", "test_probe_compile.py", "test_probe_inprocess.py", "test_sweep_run.py", "test_trial.py")

_LEFT_OUT = pytest.StashKey[int]()
_RUN_DIR = pytest.StashKey[Path]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full", action="store_true", default=False,
        help="also run the tests marked slurm or slow: real Slurm clusters (`bash tests/slurm/cluster.sh install` first, "
             "as root), the real frameworks (pip install -e '.[frameworks]'), the fault campaigns, the slowest sweeps. CI runs this.",
    )
    parser.addoption(
        "--cpu-report", metavar="FILE", default=None,
        help="append each test's CPU (its process tree's) to FILE as JSON lines; "
             "`python tests/support/cpu_report.py FILE` lists the test functions over 7 CPU-seconds (tests/support/cpu_report.py)",
    )


def _is_session_process(config: pytest.Config) -> bool:
    """pytest itself (the xdist controller, or the only process with -n 0), not an xdist worker."""
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """Children get the SIGINT a terminal's foreground job has, however pytest itself was started.

    A pytest started as a background job of a script (`python -m pytest &`) inherits SIGINT ignored,
    and an ignored signal passes through exec: every sweep a test starts would then ignore the
    Ctrl-C the test sends, as sweep must (tests/test_sweep_dir.py). A Python handler here becomes
    SIG_DFL in an exec'd child. Each xdist worker runs this too, and arms the e2e check."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not config.pluginmanager.has_plugin("sweep_full_selection"):
        config.pluginmanager.register(_FullSelection(), "sweep_full_selection")
    report = config.getoption("cpu_report")
    if report and not config.pluginmanager.has_plugin("sweep_cpu_report"):
        config.pluginmanager.register(CpuReport(os.path.abspath(report)), "sweep_cpu_report")
    _arm_e2e_check()


# -- one run dir; nothing left running when the run ends, however it ends -----------------------------------

def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_sessionstart(session: pytest.Session) -> None:
    """In pytest's own process, before xdist starts its workers (its hook runs last): the run's dir, which the
    workers inherit (the Slurm cluster is started once per run, under a lock there). A SIGTERM (a CI timeout, a
    `kill`) then ends the run as Ctrl-C does: with its teardown, the cluster's stop included, where by default
    Python would die on the spot."""
    config = session.config
    if not _is_session_process(config):
        return
    config.stash[_RUN_DIR] = cluster_support.begin_run()
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)


def pytest_unconfigure(config: pytest.Config) -> None:
    run_dir = config.stash.get(_RUN_DIR, None)
    if run_dir is not None:
        cluster_support.end_run(run_dir)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n logical` (pyproject.toml): two workers more than the cores. Many tests wait more than they compute: on
    Slurm's scheduling (the slurm group, about 2 minutes of waiting on one worker), on trials they kill, stop or
    time out, on sleeps in fake trainers. With a worker per core, a core sat idle through each of those waits;
    on a 2-core box a third worker filled most of them and a fourth a little more (docs/development.md has
    the timings). PYTEST_XDIST_AUTO_NUM_WORKERS still decides where it is set."""
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if given:
        return int(given)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + 2


# -- the selection ------------------------------------------------------------------------------------------

# tryfirst: pytest-xdist's own hook reads the xdist_group marks to name each test's group; they must be there by then.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "slurm_cluster" in fixtures or "slurm_nodes" in fixtures or item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif SHARED_MODULE_FIXTURES.get(item.path.name) in fixtures:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
        elif item.path.name in TORCH_SERVER_MODULES:
            item.add_marker(pytest.mark.xdist_group("torch_fork_server"))


def full_only(item: pytest.Item) -> bool:
    """Only `--full` runs it: marked slurm or slow, or using the Slurm cluster."""
    fixtures = getattr(item, "fixturenames", ())
    return any(item.get_closest_marker(name) for name in FULL_ONLY) or "slurm_cluster" in fixtures


def _deselect_full_only(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("full"):
        return
    kept = [item for item in items if not full_only(item)]
    left_out = [item for item in items if full_only(item)]
    config.stash[_LEFT_OUT] = len(left_out)
    if hasattr(config, "workeroutput"):
        config.workeroutput["sweep_left_out"] = len(left_out)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


class _FullSelection:
    """The deselection, a plugin of its own (registered in pytest_configure) so that its collection hook can run
    last: after `-m` and `-k` have deselected theirs, so the count is of what --full would add."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        _deselect_full_only(config, items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist's controller: each worker's count (all the same: each collects the whole selection)."""
        left = getattr(node, "workeroutput", {}).get("sweep_left_out")
        if left is not None:
            node.config.stash[_LEFT_OUT] = max(left, node.config.stash.get(_LEFT_OUT, 0))

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        left = config.stash.get(_LEFT_OUT, 0)
        if left and _is_session_process(config):
            terminalreporter.write_line(
                f"{left} slow or Slurm tests left out (real Slurm clusters, real frameworks, fault campaigns, the slowest "
                f"sweeps): {FULL_HINT} runs them, as CI does (docs/development.md)", yellow=True)


# -- every test that starts `python -m sweep` is marked e2e ------------------------------------------------

_running: dict[str, pytest.Item] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _running["item"] = item  # its setup (module fixtures included), call and teardown
    try:
        yield
    finally:
        _running.pop("item", None)


def starts_cli(args: Any) -> bool:
    """args start `python -m sweep` (a list, or a shell command line)."""
    if isinstance(args, (str, bytes)):
        try:
            words = shlex.split(os.fsdecode(args))
        except ValueError:
            return False
    elif isinstance(args, (list, tuple)):
        words = [os.fsdecode(a) if isinstance(a, (str, bytes, os.PathLike)) else "" for a in args]
    else:
        return False
    return any(a == "-m" and b == "sweep" for a, b in zip(words, words[1:]))


def _check_e2e(args: Any) -> None:
    item = _running.get("item")
    if item is not None and starts_cli(args) and not item.get_closest_marker("e2e"):
        raise AssertionError(f"{item.nodeid} starts `python -m sweep` but is not marked e2e: add @pytest.mark.e2e "
                             "(or pytestmark = pytest.mark.e2e for the module)")


def _audit(event: str, args: tuple) -> None:
    if event == "subprocess.Popen" and _running:
        _check_e2e(args[1])


def _arm_e2e_check() -> None:
    """Every fresh `python -m sweep` goes through subprocess.Popen (its audit event), every forked one through
    sweep_run's start hooks. Armed once per process: an audit hook cannot be removed, and checks nothing between tests."""
    if getattr(sys, "_sweep_e2e_check", False):
        return
    sys._sweep_e2e_check = True  # type: ignore[attr-defined]
    sys.addaudithook(_audit)
    sweep_run.START_HOOKS.append(_check_e2e)
