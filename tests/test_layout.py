"""The layout docs/development.md draws: a pure core, no import cycles, errors in one module."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "sweep"
EDGE_LIBRARIES = ("torch", "hydra", "omegaconf", "submitit", "pandas", "rich")

# Exception classes allowed outside sweep/errors.py, and why each must stay where it is.
ALLOWED_EXCEPTIONS = {
    # Not an error: the orchestrator's own signal (SIGINT/SIGTERM arrived), raised and caught in one module.
    ("sweep/orchestration/signals.py", "Interrupted"),
    # The built-in workload's device OOM: raised alike on every rank inside the trial, carries the phase and
    # the original traceback; it is the trial's data (Status.OOM), never shown to a user as an error.
    ("sweep/workloads/rnnt/memory.py", "DeviceOOM"),
}


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def core_modules() -> list[str]:
    return [m for m in modules() if m == "sweep.core" or m.startswith("sweep.core.")]


def test_the_core_imports_no_edge_library_in_a_fresh_interpreter() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for name in {core_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {EDGE_LIBRARIES!r})))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
    assert len(core_modules()) >= 10  # the walk found the core (space, strategies, confidence, ranking, ...)


def imports_of(module: str, path: Path, known: set[str], type_checking_too: bool = False) -> set[str]:
    """The sweep modules `module` imports at import time or inside functions (TYPE_CHECKING blocks excluded unless
    type_checking_too)."""
    tree = ast.parse(path.read_text())
    type_checking = set() if type_checking_too else {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for body in node.body for n in ast.walk(body)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            submodules = [f"{base}.{a.name}" for a in node.names]
            # `from sweep import workloads` needs sweep.workloads, not what sweep/__init__ defines; `from x import f` needs x.
            names = submodules + ([base] if any(m not in known for m in submodules) else [])
        for name in names:
            # `from sweep.core import space` names the module sweep.core.space; `from x import f` names x.
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports_of(m, p, set(mods)) for m, p in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            # A package's __init__ importing its own submodules is not a cycle through the package.
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles_among_sweep_modules() -> None:
    graph = import_graph()
    assert graph["sweep.core.ranking"] >= {"sweep.core.schema"}  # the walk sees real edges
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_no_import_cycles_even_for_type_checkers() -> None:
    """A TYPE_CHECKING import is a dependency a reader follows too: orchestrator.py drove remeasure.py and retime.py,
    which imported Orchestrator back for their annotations (a circle the picture of the house showed); they are now
    handed what they use (the trial pool, the plan, the results), never the orchestrator."""
    mods = modules()
    graph = {m: imports_of(m, p, set(mods), type_checking_too=True) for m, p in mods.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


# The floors docs/development.md draws, bottom up: a module imports only from its own floor or below. The name is a
# module's first part under sweep (sweep.launch.worker is on launch's floor); sweep itself, the package's face, is on top.
FLOORS = (
    ("errors", "startup", "resources"),
    ("core",),
    ("records", "probe", "parsers"),
    ("launch", "logs"),
    ("workloads",),
    ("orchestration",),
    ("analysis", "cli"),
    ("", "__main__", "report", "status", "cancel"),
)


def floor_of(module: str) -> int:
    first = module.removeprefix("sweep").removeprefix(".").split(".")[0]
    return next(i for i, names in enumerate(FLOORS) if first in names)


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {n}" for m, targets in graph.items() for n in targets if floor_of(n) > floor_of(m))


def test_no_module_imports_from_a_floor_above_its_own() -> None:
    """launch/ ran the workloads it launches by importing them (workloads.get in the job, the built-in runner in the warm
    worker): an arrow up. Now workloads/ hands launch/ the function to run (TrialJob(run), Workload.warm_runner)."""
    mods = modules()
    graph = {m: imports_of(m, p, set(mods), type_checking_too=True) for m, p in mods.items()}
    assert all(floor_of(m) >= 0 for m in mods)  # every module has a floor (a new package must be given one)
    assert "sweep.launch.job" in graph["sweep.workloads"]  # the walk sees the arrow down that replaced the one up
    assert arrows_up(graph) == []


def test_the_floor_check_itself() -> None:
    assert arrows_up({"sweep.launch.job": {"sweep.workloads"}}) == ["sweep.launch.job -> sweep.workloads"]
    assert arrows_up({"sweep.workloads": {"sweep.launch.job", "sweep.core.spec"}, "sweep.cli.main": {"sweep"}}) == ["sweep.cli.main -> sweep"]


@pytest.mark.slow
def test_the_source_type_checks() -> None:
    """mypy over all of src/sweep, the pure core with every --strict flag ([tool.mypy] in pyproject.toml): the core is
    typed end to end, and nothing else has a type error."""
    pytest.importorskip("mypy", reason="mypy not installed (pip install -e .[test])")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--config-file", str(SRC.parent / "pyproject.toml")],
                          capture_output=True, text=True, timeout=300, cwd=SRC.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "graph, has_cycle",
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, False),
        ({"a": {"b"}, "b": {"a"}}, True),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True),
        ({"p": {"p.x"}, "p.x": {"p"}}, False),  # a package and its own module
    ],
)
def test_the_cycle_finder_itself(graph: dict[str, set[str]], has_cycle: bool) -> None:
    assert (find_cycle(graph) is not None) == has_cycle


def test_the_core_imports_only_the_core_and_errors() -> None:
    graph = import_graph()
    for module in core_modules():
        outside = {m for m in graph[module] if not m.startswith("sweep.core") and m not in ("sweep", "sweep.errors")}
        assert not outside, f"{module} imports {sorted(outside)}"


# What the core may not touch: the file system and other processes (sweep/records.py reads and writes the records).
IO_MODULES = {"os", "tempfile", "shutil", "subprocess", "socket", "glob", "stat"}
PATH_IO = {"read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink", "rmdir", "iterdir", "glob", "rglob",
           "exists", "is_file", "is_dir", "symlink_to", "touch", "open"}


def file_system_uses(path: Path) -> list[str]:
    """Imports of I/O modules, open() calls and pathlib I/O calls in a module, as `line: what`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] in IO_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in IO_MODULES:
            found.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "open" or isinstance(func, ast.Attribute) and func.attr in PATH_IO:
                found.append(f"{node.lineno}: {ast.unparse(func)}()")
    return found


def test_the_core_does_no_io() -> None:
    """docs/development.md: the core is plain functions on typed data, no I/O."""
    uses = {m: file_system_uses(modules()[m]) for m in core_modules()}
    assert {m: u for m, u in uses.items() if u} == {}
    # The check itself finds what it looks for (the records module is all I/O).
    assert any("os.replace()" in u or "import os" in u for u in file_system_uses(PACKAGE / "records.py"))


def exception_classes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any(ast.unparse(b).endswith(("Exception", "Error", "Warning", "OOM")) for b in node.bases)]


def test_errors_are_defined_only_in_errors_py() -> None:
    assert {"SweepError", "SpaceError", "LoadError", "ResultError"} <= set(exception_classes(PACKAGE / "errors.py"))
    elsewhere = {(str(p.relative_to(SRC)), name) for p in PACKAGE.rglob("*.py") if p.name != "errors.py"
                 for name in exception_classes(p)}
    assert elsewhere == ALLOWED_EXCEPTIONS


def test_errors_are_imported_from_errors_py() -> None:
    """One path for each: the old ones (`sweep.core.space.SpaceError`, `sweep.analysis.api.LoadError`, ...) are gone."""
    from sweep import errors

    names = set(exception_classes(PACKAGE / "errors.py"))
    assert issubclass(errors.SpaceError, ValueError) and issubclass(errors.LoadError, ValueError)
    elsewhere = sorted(f"{p.relative_to(SRC)}:{node.lineno} imports {alias.name} from {node.module}"
                       for p in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
                       if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sweep") and node.module != "sweep.errors"
                       for alias in node.names if alias.name in names)
    assert elsewhere == []


ROOT = SRC.parent


def _setuptools_config() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_pyproject_lists_every_package():
    """pyproject.toml names the packages one by one (the top-level conf/ and sweeps/ are mapped in as sweep.conf and
    sweep.sweeps): a subpackage left off the list is left out of the wheel, while the tests, run from the checkout,
    still pass. So every dir with an __init__.py under src/, conf/ and sweeps/ must be listed."""
    tool = _setuptools_config()
    listed = set(tool["packages"])
    mapped = {name: ROOT / path for name, path in tool["package-dir"].items() if name}
    assert mapped == {"sweep.conf": ROOT / "conf", "sweep.sweeps": ROOT / "sweeps"}
    assert tool["package-dir"][""] == "src"
    roots = [("", SRC), *((name + ".", path) for name, path in mapped.items())]
    on_disk = {prefix + ".".join(init.parent.relative_to(root).parts) for prefix, root in roots for init in root.rglob("__init__.py")}
    on_disk = {name.rstrip(".") for name in on_disk}
    assert {"sweep", "sweep.core", "sweep.conf", "sweep.sweeps", "hydra_plugins.sweep_sweeper"} <= on_disk  # the walk found them
    assert sorted(on_disk - listed) == [], "add these to [tool.setuptools] packages in pyproject.toml"
    where = {name: mapped.get(name, SRC.joinpath(*name.split("."))) for name in listed}
    assert sorted(name for name, path in where.items() if not path.is_dir()) == [], "listed, but no such dir"
    # The one listed dir without an __init__.py: Hydra's namespace package, shared with the other Hydra plugins.
    assert {name for name, path in where.items() if not (path / "__init__.py").is_file()} == {"hydra_plugins"}


def test_the_top_level_holds_the_configs_and_the_shipped_sweeps():
    """Issue 46: conf/ holds the machine, search and workload configs (and the primary sweep.yaml), sweeps/ the shipped
    sweep definitions, one YAML per preset; src/, tests/ and outputs/.gitkeep beside them (anything else may be too)."""
    for name in ("pyproject.toml", "src", "tests", "conf", "sweeps", "outputs/.gitkeep"):
        assert (ROOT / name).exists(), f"{name} is missing from the top of the repository"
    assert (ROOT / "conf" / "sweep.yaml").is_file()
    assert {p.name for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name != "__pycache__"} == {"machine", "search", "workload"}
    shipped = {p.stem for p in (ROOT / "sweeps").glob("*.yaml")}
    assert {"nanogpt", "rnnt_base", "rnnt_large"} <= shipped
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        lines = path.read_text().splitlines()
        assert lines[0] == "# @package _global_" and lines[1].startswith("# "), f"{path.name}: starts with its package line, then says what it is"
        assert any(line.startswith("# Use:  python -m sweep ") and f"+sweep={path.stem}" in line for line in lines), f"{path.name}: no `# Use:` line"
        assert f"# Ready to copy: ./sweeps/{path.stem}.yaml " in path.read_text(), f"{path.name}: does not say how to copy it"
    # Nothing is left in the package's old config dir: even empty, src/sweep/conf would be imported as sweep.conf
    # (a namespace package) ahead of the mapped conf/ in an editable install.
    assert not (PACKAGE / "conf").exists(), "src/sweep/conf is gone: configs live in conf/ and sweeps/"
