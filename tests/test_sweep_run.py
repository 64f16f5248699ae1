"""tests/sweep_run.py's forked `python -m sweep` gives what a fresh interpreter gives: exit status, stdout,
stderr, working dir and environment, and a timeout like subprocess.run's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sweep_run import sweep_process

FAKE = Path(__file__).with_name("fake_train.py")
COMMAND = ["workload=command", f'workload.argv=["{sys.executable}","{FAKE}","--accum={{accum}}","--split={{split}}",'
           '"--global_batch_size={global_batch_size}"]', "global_batch_size=16", "search=grid", "accum=1", "split=1"]
CASES = {
    "refused": ["global_batch_size=0"],
    "dry_run": ["dry_run=true", "+machine=cpu2"],
    "help": ["--help"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_forked_and_fresh_runs_agree(case, tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    runs = {}
    for fresh in (False, True):
        cwd = tmp_path / f"fresh{fresh}"
        cwd.mkdir()
        runs[fresh] = sweep_process(CASES[case], cwd, env, timeout=120, fresh=fresh)
        assert sorted(p.name for p in cwd.iterdir()) == []  # neither writes in its working dir
    forked, fresh = runs[False], runs[True]
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_the_forked_run_has_the_cwd_and_environment_it_was_given(tmp_path):
    # The sweep dir, relative to the given cwd, named from a variable of the given environment.
    env = {**os.environ, "SWEEP_RUN_TEST_DIR": "from_env"}
    proc = sweep_process([*COMMAND, "hydra.sweep.dir=${oc.env:SWEEP_RUN_TEST_DIR}"], tmp_path, env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "from_env" / "trials" / "accum1_split1" / "result.json").is_file(), proc.stdout


def test_a_forked_run_past_its_timeout_is_killed_and_raises(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(60)\n")
    args = ["workload=command", f'workload.argv=["python","{script}","--b={{accum}}"]', "accum=1", "split=1",
            "global_batch_size=8", f"hydra.sweep.dir={tmp_path / 's'}"]
    with pytest.raises(subprocess.TimeoutExpired):
        sweep_process(args, tmp_path, dict(os.environ), timeout=3)
