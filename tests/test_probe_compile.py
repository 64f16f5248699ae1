"""Nothing the probe does changes what torch.compile compiles or prints into the user's log (issue 45).

Its global module hooks, live during the first step, made torch warn into the user's log ("Using
`torch.compile(module)` when there are global hooks on modules ...") and, taken out as that step closed,
failed a dynamo guard (`len(...module._global_forward_hooks) != 1`): the first timed step recompiled (a tiny
model: 4.9 s against 1.9 s without the probe). A real torch.compile'd model (tests/compile_train.py, dynamo's
eager backend: its tracing and guards without code generation) is run with and without the probe: dynamo
compiles as many frames either way, nothing is warned, every step is timed, and an OOM in compiled code is
still put in a module."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.sweep_run import forked_python

from sweep.probe import probe_env, read_probe

SCRIPT = str(Path(__file__).with_name("compile_train.py"))


def run(tmp_path: Path, *args: str, probe: bool) -> tuple[dict, str, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    records = tmp_path / "probe"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("SWEEP_PROBE_DIR", None)
    if probe:
        env.update(probe_env(records, base_env=os.environ))
    proc = forked_python(SCRIPT, list(args), tmp_path, env, timeout=300)
    assert proc.returncode == 0 or "--oom-step=3" in args, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1]) if proc.returncode == 0 else {}
    return out, proc.stderr, records


@pytest.mark.parametrize("how", ["module", "method", "function"])  # torch.compile(model), model.compile(), torch.compile(fn)
def test_the_probe_causes_no_recompile_and_no_warning(tmp_path, how):
    without, _, _ = run(tmp_path / "off", f"--how={how}", probe=False)
    probed, stderr, records = run(tmp_path / "on", f"--how={how}", probe=True)
    print(f"{how}: frames compiled without the probe {without['frames']}, with it {probed['frames']}; "
          f"steps without {without['times']}, with {probed['times']}")
    assert probed["frames"] == without["frames"] == 1  # one compile, no recompile by a guard the probe broke
    assert probed["warnings"] == [] and "global hooks" not in stderr
    report = read_probe(records)
    assert report.armed and len(report.steps) == 6 and report.problems == []  # still every step timed


def test_dynamos_own_entry_point_recompiles_and_prints_nothing_either(tmp_path):
    """torch._dynamo.optimize(backend)(model) goes round torch.compile: the probe takes its hooks out as dynamo's
    own entry point is called (torch._dynamo imported after the probe armed), so torch warns of no global hook
    (it did once, with the hooks taken out only at the compiled model's first call) and recompiles nothing."""
    without, _, _ = run(tmp_path / "off", "--how=optimize", probe=False)
    probed, _, records = run(tmp_path / "on", "--how=optimize", probe=True)
    print(f"optimize: warnings without the probe {without['warnings']}, with it {probed['warnings']}")
    assert probed["frames"] == without["frames"] == 1 and probed["warnings"] == without["warnings"] == []
    assert len(read_probe(records).steps) == 6


def test_an_oom_in_compiled_code_is_still_put_in_a_module(tmp_path):
    _, stderr, records = run(tmp_path, "--how=module", "--oom-step=3", probe=True)
    assert "can't allocate memory" in stderr and "global hooks" not in stderr
    oom = read_probe(records).oom
    assert oom is not None and (oom.step, oom.where, oom.via) == (3, "forward", "frames")
    assert oom.module == "Net"  # the compiled model, by its own name: not torch.compile's wrapper's `_orig_mod`
