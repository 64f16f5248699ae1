"""The configs ship inside the package: a sweep runs from any directory, and a user's own sweeps/ is found."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def run(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "sweep", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [["dry_run=true"], ["+sweep=rnnt_base", "dry_run=true"], ["+machine=a100x8", "dry_run=true"]])
def test_shipped_configs_are_found_from_any_directory(tmp_path, args):
    # rnnt_base's command runs where sweep starts, which must hold its script (checked before launch).
    (tmp_path / "caiman_asr_train").mkdir()
    (tmp_path / "caiman_asr_train" / "train.py").write_text("")
    proc = run(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("dry run: ") and "nothing launched" in proc.stdout


def test_a_users_own_sweeps_folder_is_searched_first(tmp_path):
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "mine.yaml").write_text("# @package _global_\nglobal_batch_size: 32\n")
    # Same name as a shipped sweep: the user's file wins.
    (tmp_path / "sweeps" / "rnnt_base.yaml").write_text("# @package _global_\nglobal_batch_size: 64\n")
    mine = run(["+sweep=mine", "dry_run=true"], tmp_path)
    assert mine.returncode == 0, mine.stderr
    assert "global_batch_size=32" in mine.stdout.splitlines()[0]
    own = run(["+sweep=rnnt_base", "dry_run=true"], tmp_path)
    assert "global_batch_size=64" in own.stdout.splitlines()[0]
    unknown = run(["+sweep=nope", "dry_run=true"], tmp_path)
    assert unknown.returncode == 2, unknown.stderr
    assert "mine" in unknown.stderr and "rnnt_large" in unknown.stderr
