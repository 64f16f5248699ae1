"""docs/tutorial.md runs as written: its scripts are the shipped files under examples/, and each of its sweeps,
run on this CPU exactly as the page spells it (the bash block, from a copy of examples/), recommends a pair in the
script's own flags, prints what the page shows it printing, and the real run takes those flags."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.doc_pages import ROOT, fenced_blocks

TUTORIAL = ROOT / "docs" / "tutorial.md"
EXAMPLES = ROOT / "examples"
GLOBAL_BATCH = 256  # sweeps/my_script.yaml's
FLAGS = re.compile(r"^flags: --batch-size=(\d+) --accum=(\d+)$", re.M)
# Lines of the sweep's end that the page shows and every run prints (the figures differ from run to run).
SHOWN = ("rank  accum  per_dev  status", "trials: ", "recommended --batch-size=", "flags: --batch-size=", "results: ")


def _sweep_blocks() -> dict[str, str]:
    """The page's runnable sweeps: each bash block that enters a directory of examples/ and sweeps there, by that dir."""
    blocks = [b for b in fenced_blocks(TUTORIAL.read_text(), "bash") if b.startswith("cd examples")]
    return {b.split("\n", 1)[0].removeprefix("cd "): b for b in blocks}


def _paste_block() -> str:
    (block,) = [b for b in fenced_blocks(TUTORIAL.read_text(), "bash") if "--export flags" in b]
    return block


def _shown_outputs() -> list[str]:
    return [b for b in fenced_blocks(TUTORIAL.read_text(), "text") if b.startswith("rank  accum")]


def test_the_scripts_on_the_page_are_the_shipped_files():
    scripts = fenced_blocks(TUTORIAL.read_text(), "python")
    assert scripts == [(EXAMPLES / "train.py").read_text(), (EXAMPLES / "lightning" / "train.py").read_text()]
    assert len((EXAMPLES / "train.py").read_text().splitlines()) <= 30


def test_the_page_shows_a_sweep_of_each_script_and_what_it_printed():
    assert set(_sweep_blocks()) == {"examples", "examples/lightning"}
    assert all(block.splitlines()[1] == "python -m sweep +sweep=my_script" for block in _sweep_blocks().values())
    shown = _shown_outputs()
    assert len(shown) == 2
    for output in shown:
        assert all(any(line.startswith(prefix) for line in output.splitlines()) for prefix in SHOWN), output
        ((batch, accum),) = FLAGS.findall(output)
        assert int(batch) * int(accum) == GLOBAL_BATCH


def _run(block: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """A bash block as the page spells it, with this interpreter first on PATH as `python`."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-euc", block], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _sweep_and_paste(tmp_path: Path, where: str) -> None:
    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("outputs", "__pycache__"))
    proc = _run(_sweep_blocks()[where], tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for prefix in SHOWN:
        assert any(line.startswith(prefix) for line in proc.stdout.splitlines()), f"no `{prefix}...` line:\n{proc.stdout[-3000:]}"
    ((batch, accum),) = FLAGS.findall(proc.stdout)
    assert int(batch) * int(accum) == GLOBAL_BATCH
    # Step 4: the real run, from the same dir, takes the recommended flags.
    run = _run(_paste_block(), tmp_path / where, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"trained 50 steps of {GLOBAL_BATCH} samples" in run.stdout


@pytest.mark.slow
@pytest.mark.e2e
def test_the_plain_pytorch_sweep_runs_as_written(tmp_path):
    _sweep_and_paste(tmp_path, "examples")


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="Lightning is not installed (pip install -e '.[frameworks]')")
def test_the_lightning_sweep_runs_as_written(tmp_path):
    _sweep_and_paste(tmp_path, "examples/lightning")
