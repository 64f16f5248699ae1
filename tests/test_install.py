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


@pytest.mark.e2e
@pytest.mark.parametrize("args", [["dry_run=true"], ["+sweep=rnnt_base", "dry_run=true"], ["+machine=a100x8", "dry_run=true"]])
def test_shipped_configs_are_found_from_any_directory(tmp_path, args):
    # rnnt_base's command runs where sweep starts, which must hold its script (checked before launch).
    (tmp_path / "caiman_asr_train").mkdir()
    (tmp_path / "caiman_asr_train" / "train.py").write_text("")
    proc = run(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("dry run: ") and "nothing launched" in proc.stdout


@pytest.mark.e2e
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


# Python as on the GPU machines (../shared/gpu/prepare.sh): src/ on PYTHONPATH, sweep not installed at all. Here it is
# installed editable, so its import hook (setuptools' __editable__ finder, which maps sweep.conf onto conf/) is taken
# out first; what is left finds sweep in src/ alone.
NOT_INSTALLED = (
    "import runpy, sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, '__module__', '').startswith('__editable__')]\n"
    "import sweep.resources as r\n"
    "print('configs', r.CONF_DIR, r.SWEEPS_DIR)\n"
    "sys.argv = ['sweep', *sys.argv[1:]]\n"
    "runpy.run_module('sweep', run_name='__main__', alter_sys=True)\n"
)


def test_a_checkout_run_from_src_without_installing_finds_its_own_configs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run([sys.executable, "-c", NOT_INSTALLED, "+sweep=nanogpt", "dry_run=true"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    top = SRC.parent
    assert proc.stdout.splitlines()[0] == f"configs {top / 'conf'} {top / 'sweeps'}"
    assert "nothing launched" in proc.stdout and "python train.py config/train_gpt2.py" in proc.stdout
    # nanoGPT's train.py is not here: a dry run shows the plan and says what a run from here would stop on.
    assert proc.stderr.startswith("sweep: warning: workload.argv names 'train.py', which is not a file in")


@pytest.mark.e2e
def test_a_fresh_checkouts_shipped_sweep_dry_runs_from_its_root():
    """The README's first look: `python -m sweep +sweep=nanogpt dry_run=true` in a fresh clone (./sweeps is the shipped
    folder itself there, on the search path once)."""
    proc = run(["+sweep=nanogpt", "dry_run=true"], SRC.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("dry run: ") and "global_batch_size=480" in proc.stdout.splitlines()[0]
