"""tests/support/sweep_run.py's forked `python -m sweep` gives what a fresh interpreter gives: exit status, stdout,
stderr, working dir and environment, and a timeout like subprocess.run's; and so does its forked `python SCRIPT`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.sweep_run import background_sweep, forked_python, sweep_process

FAKE = Path(__file__).with_name("fake_train.py")
COMMAND = ["workload=command", f'workload.argv=["{sys.executable}","{FAKE}","--accum={{accum}}","--split={{split}}",'
           '"--global_batch_size={global_batch_size}"]', "global_batch_size=16", "search=grid", "accum=1", "split=1"]
CASES = {
    "refused": ["global_batch_size=0"],
    "dry_run": ["dry_run=true", "+machine=cpu2"],
    "help": ["--help"],
}


@pytest.mark.e2e
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


@pytest.mark.e2e
@pytest.mark.parametrize("case", ["refused", "dry_run"])
def test_a_background_sweep_writes_stdout_and_stderr_to_one_file_as_a_fresh_one_does(case, tmp_path):
    """background_sweep (tests that signal a running sweep): both streams in one file, as `2>&1` puts them."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    forked = background_sweep(CASES[case], tmp_path, env, tmp_path / "forked.out")
    with (tmp_path / "fresh.out").open("w") as stream:
        fresh = subprocess.Popen([sys.executable, "-m", "sweep", *CASES[case]], cwd=tmp_path, env=env, stdout=stream,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    assert forked.wait(timeout=120) == fresh.wait(timeout=120)
    assert (tmp_path / "forked.out").read_text() == (tmp_path / "fresh.out").read_text() != ""


@pytest.mark.e2e
def test_the_forked_run_has_the_cwd_and_environment_it_was_given(tmp_path):
    # The sweep dir, relative to the given cwd, named from a variable of the given environment.
    env = {**os.environ, "SWEEP_RUN_TEST_DIR": "from_env"}
    proc = sweep_process([*COMMAND, "hydra.sweep.dir=${oc.env:SWEEP_RUN_TEST_DIR}"], tmp_path, env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "from_env" / "trials" / "accum1_split1" / "result.json").is_file(), proc.stdout


@pytest.mark.e2e
def test_a_forked_run_past_its_timeout_is_killed_and_raises(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(60)\n")
    args = ["workload=command", f'workload.argv=["python","{script}","--b={{accum}}"]', "accum=1", "split=1",
            "global_batch_size=8", f"hydra.sweep.dir={tmp_path / 's'}"]
    with pytest.raises(subprocess.TimeoutExpired):
        sweep_process(args, tmp_path, dict(os.environ), timeout=3)


SCRIPT = """import json, os, sys
import sitecustomize
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0], "site": sitecustomize.__file__,
                  "mark": os.environ["MARK"], "torch": "torch" in sys.modules}))
if sys.argv[1] == "raise":
    raise ValueError("from the script")
"""


@pytest.mark.parametrize("how", ["ok", "raise"])
def test_a_forked_script_starts_and_ends_as_a_fresh_interpreter_would(how, tmp_path):
    """forked_python (the probe tests' scripts): argv, working dir, the script's dir first on sys.path, the
    sitecustomize PYTHONPATH names, and an uncaught exception's traceback and exit status 1, as `python SCRIPT`."""
    site_dir, run_dir = tmp_path / "site", tmp_path / "run"
    site_dir.mkdir()
    run_dir.mkdir()
    (site_dir / "sitecustomize.py").write_text("import os\nos.environ['MARK'] = 'ran'\n")
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(site_dir), "OMP_NUM_THREADS": "1", "MARK": "not run"}
    forked = forked_python(str(script), [how, "x"], run_dir, env, timeout=120)
    fresh = subprocess.run([sys.executable, str(script), how, "x"], cwd=run_dir, env=env, capture_output=True, text=True, timeout=120)
    seen = [json.loads(p.stdout) for p in (forked, fresh)]
    assert seen[0] == {**seen[1], "torch": True}  # the one difference: the server imported torch
    assert seen[1] == {"argv": [how, "x"], "cwd": str(run_dir), "path0": str(tmp_path), "site": str(site_dir / "sitecustomize.py"),
                       "mark": "ran", "torch": False}
    assert forked.returncode == fresh.returncode == (1 if how == "raise" else 0)
    if how == "raise":
        assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1] == "ValueError: from the script"
    else:
        assert forked.stderr == fresh.stderr == ""
