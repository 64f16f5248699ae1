"""The probe reaches every Python process a command starts, or the failure says exactly why not (issue 45).

Real command trials (run_command_trial, as a trial job runs it): an empty PYTHONPATH entry keeps meaning the
start dir under the probe; `python -I`, `-E`, `-S`, a wrapper that replaces PYTHONPATH or clears the
environment keep the probe out, and the trial's failure names the process and the reason, not "never armed"."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sweep.core.config import MachineConfig, TrialConfig
from sweep.core.schema import Status
from sweep.core.spec import TrialSpec
from sweep.probe import BOOT_DIR, probe_env
from sweep.workloads.command.config import CommandWorkloadConfig
from sweep.workloads.command.reach import interpreter_flags, why_unreached
from sweep.workloads.command.runner import run_command_trial

REC = "/trial/probe-1"


@pytest.mark.parametrize(
    "cmdline,flags",
    [
        (["python", "train.py", "-I"], set()),  # the script's own argument, not the interpreter's
        (["python", "-I", "train.py"], {"I"}),
        (["python3.11", "-uES", "-m", "torch.distributed.run", "-I"], {"E", "S"}),
        (["python", "-X", "dev", "-W", "ignore", "-S", "t.py"], {"S"}),
        (["python", "-Xfrozen_modules=off", "-I", "t.py"], {"I"}),
        (["python", "-c", "import x", "-I"], set()),
        (["python", "-Ic", "pass"], {"I"}),
        (["python", "--check-hash-based-pycs", "always", "-E", "t.py"], {"E"}),
        (["python", "-", "-I"], set()),
    ],
)
def test_the_interpreters_own_flags_are_told_from_the_programs(cmdline, flags):
    assert interpreter_flags(cmdline) == flags


def test_why_unreached_names_each_way_the_probe_is_kept_out(tmp_path):
    boot = str(BOOT_DIR)
    env = {"SWEEP_PROBE_DIR": REC, "PYTHONPATH": f"{boot}{os.pathsep}{os.pathsep}/x"}
    assert why_unreached(["python", "t.py"], env, REC, boot) == ""
    assert why_unreached(["python", "-I", "t.py"], env, REC, boot).startswith("-I (isolated mode) ignores PYTHONPATH")
    assert why_unreached(["python", "-E", "t.py"], env, REC, boot).startswith("-E ignores PYTHONPATH")
    assert why_unreached(["python", "-S", "t.py"], env, REC, boot).startswith("-S runs no sitecustomize")
    replaced = why_unreached(["python", "t.py"], {**env, "PYTHONPATH": "/opt/lib"}, REC, boot)
    assert replaced == "its PYTHONPATH ('/opt/lib') lacks the probe's boot dir: a wrapper replaced PYTHONPATH"
    assert "no SWEEP_PROBE_DIR" in why_unreached(["python", "t.py"], {"PATH": "/bin"}, REC, boot)
    (tmp_path / "sitecustomize.py").write_text("")
    ahead = why_unreached(["python", "t.py"], {**env, "PYTHONPATH": f"{tmp_path}{os.pathsep}{boot}"}, REC, boot)
    assert ahead.endswith("ahead of the probe's boot dir on PYTHONPATH, shadows it")
    # the boot dir as a relative entry, from the process's own working dir
    relative = os.path.relpath(boot, tmp_path)
    assert why_unreached(["python", "t.py"], {**env, "PYTHONPATH": relative}, REC, boot, cwd=str(tmp_path)) == ""


def test_empty_pythonpath_entries_keep_their_meaning_under_the_probe():
    env = probe_env("r", base_env={"PYTHONPATH": f"{os.pathsep}/x"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BOOT_DIR), "", "/x"]  # "": the start dir, as before
    assert probe_env("r", base_env={"PYTHONPATH": f"/x{os.pathsep}"})["PYTHONPATH"].split(os.pathsep) == [str(BOOT_DIR), "/x", ""]
    assert probe_env("r", base_env={"PYTHONPATH": ""})["PYTHONPATH"] == str(BOOT_DIR)  # set but empty: no entry


def epoch_lines() -> str:
    line = ("DLL 2024-01-02 10:11:1{e}.123456 - epoch {e:4d} | train_avg_throughput-audio-samples-per-sec : "
            "1600.00 | train_avg_took : 0.0050")
    return "\n".join(f"print({line.format(e=e)!r}, flush=True)" for e in (1, 2, 3))


def spec(tmp_path: Path, argv: list[str]) -> TrialSpec:
    workload = CommandWorkloadConfig(argv=argv, cwd=str(tmp_path), parser={"type": "myrtle"})
    return TrialSpec(1, 1, 8, 8, 8, 1, MachineConfig(device="cpu"), workload, TrialConfig(), str(tmp_path / "trial"))


def test_a_script_importing_from_the_start_dir_through_an_empty_entry_runs(tmp_path, monkeypatch):
    """`export PYTHONPATH=$PYTHONPATH:/x` with PYTHONPATH unset: the empty entry is the start dir. The probe's
    environment dropped it, and every trial failed with ModuleNotFoundError (fine with workload.probe=false)."""
    (tmp_path / "helper.py").write_text(f"def main():\n    {epoch_lines().replace(chr(10), chr(10) + '    ')}\n")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text("import helper\nhelper.main()\n")
    monkeypatch.setenv("PYTHONPATH", f"{os.pathsep}/nonexistent")
    result = run_command_trial(spec(tmp_path, [sys.executable, "scripts/train.py", "--accum={accum}"]))
    assert result.status == Status.OK, result.error
    assert "ModuleNotFoundError" not in Path(result.log).read_text()


SLEEPER = "import time\ntime.sleep(2.5)\n"  # lives past a scan (probed.READ_EVERY_S), prints no figure


@pytest.mark.parametrize(
    "argv,why",
    [
        ([sys.executable, "-E", "{script}", "--accum={accum}"], "-E ignores PYTHONPATH, which carries the probe"),
        ([sys.executable, "-S", "{script}", "--accum={accum}"], "-S runs no sitecustomize, where the probe starts"),
        (["bash", "-c", f"PYTHONPATH=/opt/site exec {sys.executable} {{script}} --accum={{accum}}"],
         "its PYTHONPATH ('/opt/site') lacks the probe's boot dir: a wrapper replaced PYTHONPATH"),
        (["env", "-i", sys.executable, "{script}", "--accum={accum}"], "its environment has no SWEEP_PROBE_DIR"),
    ],
    ids=["-E", "-S", "wrapper-pythonpath", "env-i"],
)
def test_a_process_the_probe_cannot_reach_is_named_with_the_reason(tmp_path, argv, why):
    script = tmp_path / "train.py"
    script.write_text(SLEEPER)
    result = run_command_trial(spec(tmp_path, [a.replace("{script}", str(script)) for a in argv]))
    assert result.status == Status.FAILED
    print(result.error)
    assert "the probe could not reach 1 Python process(es) of the command: pid " in result.error
    assert f"train.py --accum=1): {why}" in result.error  # its command line, paths by their last part
    assert "never armed" not in result.error and "myrtle" not in result.error  # the default parser: not the user's choice


def test_python_dash_I_that_imports_torch_is_named_not_called_unarmed(tmp_path):
    """The issue's case: `python -I train.py`, a torch trainer printing no figure the log parser knows. It said
    "the probe never armed (no torch import)" though torch was imported."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(8, 8); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(5):\n"
        "    m(torch.ones(4, 8)).sum().backward(); o.step(); o.zero_grad()\n"
        "import time; time.sleep(1.2)\n"
    )
    result = run_command_trial(spec(tmp_path, [sys.executable, "-I", str(script), "--accum={accum}"]))
    print(result.error)
    assert result.status == Status.FAILED
    assert result.error.startswith("exited 0 but printed no throughput its log parser (workload.parser) recognises; "
                                   "the probe could not reach 1 Python process(es) of the command: pid ")
    assert f"({Path(sys.executable).name} -I train.py --accum=1): -I (isolated mode) ignores PYTHONPATH, which carries the probe; see " in result.error
    assert "never armed" not in result.error
