"""`python -m sweep [OVERRIDES...]`: compose conf/ with Hydra and run a sweep.

Bad input (a SweepError, a Hydra or OmegaConf config error, malformed YAML) ends with
one line on stderr naming the value and what would be valid, exit status 2, no traceback
(SWEEP_DEBUG=1 or HYDRA_FULL_ERROR=1 shows it). Anything else is a bug in sweep: its
traceback, a line saying so, exit status 1.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from sweep.core.fingerprint import hydra_quoted
from sweep.resources import CONF_DIR, config_options

EXIT_USAGE = 2
EXIT_BUG = 1
BUG_LINE = "sweep: this is a bug in sweep, not in your input; please report it with the traceback above (an issue in sweep's repository)"


def _task(cfg: Any) -> None:
    """Only reached with hydra.mode=RUN: run one trial in this process (debugging a single pair)."""
    import json

    from hydra.core.hydra_config import HydraConfig

    from sweep.core.schema import trial_dir
    from sweep.errors import SweepError
    from sweep.orchestration.plan import make_plan
    from sweep.orchestration.settings import read_settings
    from sweep.startup import over
    from sweep.workloads import run_job

    try:
        settings = read_settings(cfg, [])
    except SweepError as exc:
        # Hydra's run mode would print "Error executing job with overrides: ..." above it: the one line alone, as a sweep.
        print(f"sweep: error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    over()  # the trial writes from here: a Ctrl-C is its own to handle
    sweep_dir = Path(HydraConfig.get().runtime.output_dir).absolute()
    plan = make_plan(settings, sweep_dir)
    cand = next(c for c in plan.candidates if c.valid)
    spec = plan.spec(cand, trial_dir(sweep_dir, cand.key))
    print(json.dumps(run_job(spec).to_dict(), indent=2))


def expand_resume(argv: list[str]) -> list[str]:
    """`resume=DIR` reruns DIR's sweep with the arguments it was started with, in the same dir.

    Finished trials there are reused and trials still running are re-attached (the
    orchestrator does that for any existing sweep dir); arguments given now are added last.
    """


    given = [a for a in argv if a.startswith("resume=")]
    if not given:
        return argv
    sweep_dir = Path(given[-1].split("=", 1)[1]).expanduser()
    stored = _stored_argv(sweep_dir)
    rest = [a for a in argv if not a.startswith("resume=")]
    # A key given now replaces the stored one (accum=1,2 now: not accum=1,2,4 and accum=1,2).
    given_keys = {_override_key(a) for a in rest}
    keep = [a for a in stored if not a.startswith(("hydra.sweep.dir=", "resume=")) and _override_key(a) not in given_keys]
    return keep + rest + [f"hydra.sweep.dir={hydra_quoted(str(sweep_dir.resolve()))}"]


def machine_before_sweep(argv: list[str]) -> list[str]:
    """The command line with every +machine= profile ahead of the first +sweep= preset. Both are appended to the
    defaults in the order given, and a profile's `override /workload: rnnt_base` given after a command preset would
    replace the preset's workload under its argv (`Key 'argv' not in 'RNNTWorkloadConfig'`). In this order, the
    documented one, the preset's workload and settings win over the profile's, whichever order they were typed in."""
    first_sweep = next((i for i, a in enumerate(argv) if a.lstrip("+").startswith("sweep=")), None)
    if first_sweep is None:
        return argv
    late_machines = [a for a in argv[first_sweep:] if a.lstrip("+").startswith("machine=")]
    if not late_machines:
        return argv
    rest = [a for a in argv[first_sweep:] if a not in late_machines]
    return argv[:first_sweep] + late_machines + rest


def _stored_argv(sweep_dir: Path) -> list[str]:
    """The command line sweep.json recorded; a SweepError saying what is wrong, and how to go on."""
    import json

    from sweep.errors import SweepError
    from sweep.records import read_regular_text

    meta = sweep_dir / "sweep.json"
    trials = sweep_dir / "trials"
    if not trials.is_dir() and not meta.exists():
        raise SweepError(f"resume={sweep_dir} is not a sweep dir (no sweep.json inside): give a dir an earlier sweep printed, e.g. outputs/latest")
    why = "missing"
    if meta.exists():
        try:
            argv = json.loads(read_regular_text(meta))["argv"]
            if isinstance(argv, list) and all(isinstance(a, str) for a in argv):
                return argv
            why = "damaged (its argv is not a list of strings)"
        except OSError as e:
            why = f"unreadable ({e.strerror})"
        except (ValueError, KeyError, TypeError) as e:
            why = f"damaged ({type(e).__name__})" if not isinstance(e, ValueError) else "damaged (not valid JSON)"
    kept = sum(1 for d in trials.glob("*") if (d / "result.json").is_file()) if trials.is_dir() else 0
    raise SweepError(
        f"resume={sweep_dir}: its sweep.json is {why}, so the command to rerun is lost; the {kept} trial result(s) "
        f"under {trials} are intact: run the sweep's original command again with "
        f"{shlex.quote(f'hydra.sweep.dir={sweep_dir}')} and those measured with the same settings are reused"
    )


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


HELP = """\
python -m sweep [KEY=VALUE ...]: find the fastest (grad_accumulation_batches, batch_split_factor)
pair for a training job at a fixed global batch size.

Each candidate pair (accum, split) runs as one short trial (a submitit job, on this host or on
Slurm); the sweep measures its throughput and peak memory, records out-of-memory and failures
as results, and recommends the fastest pair that fits, with a confidence score. Results land in
the sweep dir as they finish (trials.csv, recommendation.yaml); an interrupted sweep resumes.

Main options (KEY=VALUE; a sweep value is a,b,c):
  global_batch_size=N       samples per optimizer step over all devices (default 128)
  accum=1,2,4 split=1,2,4   candidates to try (default: every valid power of two)
  +machine=NAME             a machine profile: {machine}
  workload=NAME             what a trial trains: {workload}
  +sweep=NAME               a ready-made sweep (./sweeps/NAME.yaml first): {sweep}
  search=NAME               how candidates are chosen: {search}
  workload.argv=[...]       with workload=command: your training command, {{accum}} {{split}} ... filled in
  trial.time_limit_s=S      stop a trial after S seconds (recorded as timeout)
  max_in_flight=N           trials running at once
  warm_workers=false        a fresh process per built-in trial (default: a warm worker per device group)
  hydra/launcher=submitit_slurm   run the trials as Slurm jobs (hydra.launcher.partition=...)
  hydra.sweep.dir=DIR       where results go (default: outputs/<date_time>, outputs/latest links it)
  resume=DIR                rerun DIR's sweep there, reusing finished trials
  detach=true               the search runs on in the background (this host): python -m sweep.status DIR watches it,
                            python -m sweep.cancel DIR stops it
  dry_run=true              show the candidates; launch nothing

Examples:
  python -m sweep dry_run=true
  python -m sweep +machine=cpu2 global_batch_size=64 accum=1,2,4 split=1,2
  python -m sweep workload=command 'workload.argv=["python","train.py","--accum={{accum}}","--split={{split}}"]'

More: README.md and docs/; every key and its default: python -m sweep --cfg job; Hydra's own flags: --hydra-help."""


def help_text() -> str:
    """The tool's own help: what it does, the main options, examples; the schema names are internal."""
    return HELP.format(**{group: ", ".join(config_options(group)) for group in ("machine", "workload", "sweep", "search")})


def main() -> int:
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        print(help_text())
        return 0
    debug = bool(os.environ.get("SWEEP_DEBUG")) or bool(os.environ.get("HYDRA_FULL_ERROR"))
    # Hydra re-raises instead of printing its own multi-line report; we print one line below.
    # Set for this call only: an in-process caller (a test, a notebook) keeps its own setting.
    previous_full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        return _main(debug)
    except KeyboardInterrupt:
        # Ctrl-C in a caller's process (no sweep/startup.py handler there): no traceback either.
        print("sweep: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous_full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = previous_full_error


def _main(debug: bool) -> int:
    import hydra

    from sweep.cli.config import register_configs

    register_configs()
    from sweep.orchestration import entry

    app = hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="sweep")(_task)
    try:
        sys.argv[1:] = machine_before_sweep(expand_resume(sys.argv[1:]))
        with entry.sweep_exit_status() as status:
            app()
    except BrokenPipeError:
        # Output piped into `head` and closed: not an error worth a message.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("sweep: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - sorted below: the user's to fix, or ours
        if not user_fixable(exc):
            import traceback

            traceback.print_exc()
            print(BUG_LINE, file=sys.stderr)
            return EXIT_BUG
        if debug:
            raise
        print(f"sweep: error: {one_line_error(exc)}", file=sys.stderr)
        return EXIT_USAGE
    return status.code


def user_fixable(exc: BaseException) -> bool:
    """Errors in what the user gave: sweep's own, Hydra's and OmegaConf's config errors, and YAML errors."""
    import yaml
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from sweep.errors import SweepError

    return isinstance(exc, (SweepError, HydraException, OmegaConfBaseException, yaml.YAMLError))


def one_line_error(exc: BaseException) -> str:
    """Hydra and OmegaConf errors span several lines; users get the facts on one."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < 3:
        special = _yaml_or_override_error(seen)
        if special:
            return special
        text = str(seen).strip()
        full_key = re.search(r"full_key:\s*(\S+)", text)
        first = text.split("\n")[0].strip() if text else type(seen).__name__
        # "In 'sweep/x': ValidationError raised while composing config:" -> "In 'sweep/x'"; the cause follows.
        first = re.sub(r"^(In '[^']+'): \w+ raised while composing config:$", r"\1", first)
        options = re.search(r"Available options in '([^']+)':\n((?:[ \t]+\S.*\n?)*)", text)
        if options:
            # The typed schemas share the group with the YAML options; they are not choices.
            names = [x.strip() for x in options.group(2).split("\n") if x.strip() and not x.strip().endswith("_schema")]
            first = f"{first.removeprefix('In ' + repr('sweep') + ': ')}; available options in '{options.group(1)}': {', '.join(names)}"
        if full_key and full_key.group(1) not in first and not first.startswith("In '"):
            first = f"{full_key.group(1)}: {first}"
        first = first.rstrip(".")
        if first and first not in parts:
            parts.append(first)
        seen = seen.__cause__ or (seen.__context__ if not seen.__suppress_context__ else None)
    line = "; ".join(parts)
    missing_header = _missing_package_header(line)
    if missing_header:
        return missing_header
    hint = _key_hint(line)
    return (line + hint).replace("\n", " ")


def _missing_package_header(line: str) -> str:
    """A +sweep= (or +machine=) file without `# @package _global_`: Hydra files its keys under `sweep.` (or `machine.`)
    and its `override /workload` under `workload@sweep`, and its own error names neither the file's fault nor the fix."""
    m = re.match(r"In '(sweep|machine)/([^']+)'", line)
    if not m:
        return ""
    group, name = m.groups()
    if f"@{group}" not in line and f"Key '{group}' not in 'SweepConfig'" not in line:
        return ""
    return (f"{group}/{name}.yaml has no `# @package _global_` header: add that line as the file's first line (its keys, "
            f"global_batch_size, workload, ..., are the sweep's top-level keys, as in the shipped {group} files)")


def _yaml_or_override_error(exc: BaseException) -> str:
    """Malformed YAML (file, line and column) and unparsable overrides, with what would be valid."""
    import yaml
    from hydra.errors import OverrideParseException

    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "a YAML file"
        what = exc.problem or exc.context or "syntax error"
        if exc.context and exc.problem:
            ctx = exc.context_mark
            what += f", {exc.context}" + (f" from line {ctx.line + 1}, column {ctx.column + 1}" if ctx else "")
        return f"{where}: malformed YAML ({what}): fix that file's YAML syntax (balanced quotes and brackets, `key: value` pairs)"
    if isinstance(exc, yaml.YAMLError):
        return f"malformed YAML: {' '.join(str(exc).split())}"
    if isinstance(exc, OverrideParseException):
        text = str(exc).strip().split("\n")
        override = getattr(exc, "override", "") or ""
        what = text[0].rstrip(".") if text else "cannot parse it"
        if override and override not in what:
            what = f"{override!r}: {what}"
        return (
            f"{what}: an override is key=value, a list is [a,b], a sweep is a,b; quote values with "
            "special characters, e.g. 'workload.argv=[\"python\",\"--x={accum}\"]' "
            "(https://hydra.cc/docs/advanced/override_grammar/basic)"
        )
    return ""


def _key_hint(line: str) -> str:
    """For an unknown key, list the keys that do exist at that level."""
    from dataclasses import fields

    from sweep.cli.config import schema_levels

    levels = schema_levels(_chosen_workload(sys.argv[1:]))
    named = re.search(r"Key '[^']+' (?:is )?not in '(\w+)'", line)  # the schema the key is missing from
    # "Could not override 'workload.parser'; workload.parser.pattern: Key 'pattern' is not in struct": the full key
    # is the one after the override, a key inside the mapping the override replaced.
    full = re.search(r"([\w.]+\.\w+): Key '[^']+' is not in struct", line)
    m = named or full or re.search(r"Could not override '([^']+)'", line) or re.search(r"Key '([^']+)' is not in struct", line)
    if not m:
        return ""
    if named:
        parent, schema = next(((p, c) for p, c in levels if c.__name__ == named.group(1)), ("", None))
    else:
        parent = re.sub(r"^\+*", "", m.group(1)).rpartition(".")[0]
        schema = next((c for p, c in levels if p == parent), None)
    if schema is None:
        # A free-form mapping (workload.env, workload.parser): new keys are added with a +.
        key = re.sub(r"^\+*", "", m.group(1))
        return f"; {parent} takes any key, added with a +: +{key}=..." if parent and "." in key else ""
    names = ", ".join(f.name for f in fields(schema))
    return f"; valid keys{' under ' + parent if parent else ''}: {names}"


def _chosen_workload(args: list[str]) -> str:
    """The workload the command line picks (workload=NAME; a +sweep= preset other than the RNN-T's is a command's),
    so a key hint lists that workload's keys, not the default's."""
    for arg in args:
        if arg.startswith("workload="):
            return arg.split("=", 1)[1]
    if any(a.startswith(("+sweep=", "sweep=")) and not a.split("=", 1)[1].startswith("rnnt") for a in args):
        return "command"
    return "rnnt"


if __name__ == "__main__":
    sys.exit(main())
