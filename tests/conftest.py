"""Shared fixtures. The Slurm fixture starts a real cluster on this machine (tests/slurm): a node on localhost, two in namespaces.

The suite runs on every core with pytest-xdist (`-n logical --dist loadgroup` in pyproject.toml), each
test where a worker is free, except tests that share something costly, which one worker runs together
(an xdist group): the Slurm tests share one cluster (a session fixture), so one cluster is started, once;
a module whose tests share a module fixture that runs sweeps or trials would otherwise run it on every worker."""

import os
import signal

import pytest
from slurm_cluster import slurm_cluster, slurm_nodes  # noqa: F401  (fixtures of the Slurm tests: the cluster, its two-node partition)

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


def pytest_configure(config: pytest.Config) -> None:
    """Children get the SIGINT a terminal's foreground job has, however pytest itself was started.

    A pytest started as a background job of a script (`python -m pytest &`) inherits SIGINT ignored,
    and an ignored signal passes through exec: every sweep a test starts would then ignore the
    Ctrl-C the test sends, as sweep must (tests/test_sweep_dir.py). A Python handler here becomes
    SIG_DFL in an exec'd child. Each xdist worker runs this too."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
