"""The README's and docs/'s commands, snippets and outputs stay true.

Checked elsewhere: the `python -m sweep.logs` examples and the preset table of docs/trainers.md
(tests/test_logs.py), the demo's OOM landscape (tests/test_e2e.py)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from doc_pages import PAGES, README, ROOT, fenced_blocks, section, sweep_commands
from sbatch_golden import CASES, golden_path
from sweep_run import run_sweep
from test_api import make_sweep

DOCS = [p for p in PAGES if p != README]
PYTHON_BLOCKS = [(page, i, block) for page in PAGES for i, block in enumerate(fenced_blocks(page.read_text(), "python"))]


def test_readme_starts_with_install_sweep_and_test_commands():
    first_block = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ['pip install torch==2.13.0 -e ".[test]"', "python -m sweep", "python -m pytest"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "python -m pip install -q torch==2.13.0 -e \".[test]\"" in ci and ci.rstrip().endswith("\npython -m pytest")


def test_readme_fits_on_a_few_screens_and_its_first_says_what_the_tests_do():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200
    first_screen = "\n".join(lines[:24])
    for needed in ("minutes", "root", "Slurm", "tests/slurm/cluster.sh", "apt-get"):
        assert needed in first_screen, needed
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", README.read_text()))
    assert linked == {p.name for p in DOCS}, "every docs/ page is linked from the README"


@pytest.mark.parametrize("page,index,block", PYTHON_BLOCKS, ids=[f"{p.name}-{i}" for p, i, _ in PYTHON_BLOCKS])
def test_python_blocks_run_as_written(tmp_path, page, index, block):
    """Each python block, against two sweeps in outputs/; the one of "Reading and comparing results" (docs/outputs.md)
    also prints what it says it does and writes its parquet file."""
    outputs = tmp_path / "outputs"
    make_sweep(outputs, "2026-11-01_a100", machine="a100x8", link_latest=False)
    make_sweep(outputs, "2026-11-02_a100", machine="a100x8", scale=0.9, scale_pairs={(2, 4): 1.3})
    proc = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "throughput_samples_per_s" in proc.stdout
    if block in fenced_blocks(section("Reading and comparing results"), "python"):
        assert "ratio_vs_first" in proc.stdout and "machine.run_to_run_noise=" in proc.stdout
        assert (tmp_path / "trials.parquet").stat().st_size > 0


def test_the_reading_and_comparing_section_has_one_python_block():
    assert len(fenced_blocks(section("Reading and comparing results"), "python")) == 1


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_pages_resolve():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"\w+://", target):
                continue
            file, _, anchor = target.partition("#")
            linked = (page.parent / file).resolve() if file else page
            assert linked.exists(), f"{page.name}: link to {target}: no such file"
            if anchor:
                anchors = {_slug(h) for h in re.findall(r"^#+ (.*)$", linked.read_text(), re.M)}
                assert anchor in anchors, f"{page.name}: link to {target}: no such heading in {linked.name}"


# A path the docs name in backticks, from the repository root or, for the package's own modules, from src/ or src/sweep/.
_PATH = re.compile(r"`((?:src|tests|bench|\.ci|sweep|core|orchestration|launch|workloads|parsers|analysis|cli)/[\w./*<>-]*)`")


def test_paths_the_docs_name_exist():
    for page in PAGES:
        for named in _PATH.findall(page.read_text()):
            if "<" in named:  # a placeholder such as trials/<accum>_<split>/
                continue
            roots = [ROOT, ROOT / "src", ROOT / "src" / "sweep"]
            assert any(list(root.glob(named.rstrip("/"))) for root in roots), f"{page.name} names `{named}`: not in the repository"


def _user_sweeps(cwd: Path) -> None:
    """The docs' own sweeps/NAME.yaml files (a yaml block under a line naming `sweeps/NAME.yaml`), written into cwd."""
    for page in PAGES:
        for name, block in re.findall(r"`sweeps/(\w+)\.yaml`:\n\n```yaml\n(.*?)```", page.read_text(), re.S):
            (cwd / "sweeps").mkdir(exist_ok=True)
            (cwd / "sweeps" / f"{name}.yaml").write_text(block)


def plan(arguments: list[str], sweep_dir: Path):
    """What `python -m sweep ARGUMENTS` would run: Hydra composes the fixed overrides, the sweeper plans the swept knobs."""
    from hydra import compose, initialize_config_dir

    from sweep.cli.config import register_configs
    from sweep.orchestration.plan import make_plan
    from sweep.orchestration.settings import SWEEPABLE, read_settings
    from sweep.resources import CONF_DIR

    swept = [a for a in arguments if a.split("=", 1)[0] in SWEEPABLE]
    fixed = [a for a in arguments if a not in swept and not a.startswith("hydra.sweep.dir=")]
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("sweep", overrides=[*fixed, f"hydra.sweep.dir={sweep_dir}"], return_hydra_config=True)
        moved = _in_a_checkout(cfg, sweep_dir.parent / "checkout")
        if moved:
            cfg = compose("sweep", overrides=[*fixed, *moved, f"hydra.sweep.dir={sweep_dir}"], return_hydra_config=True)
    return make_plan(read_settings(cfg, swept), sweep_dir)


def _in_a_checkout(cfg, checkout: Path) -> list[str]:
    """The docs' command sweeps run from the trainer's checkout (the command runs where sweep starts, and
    its script is checked there before launch): the scripts its argv names, as empty files where it runs.
    A workload.cwd that is not on this host (the docs' /tmp/nanogpt) becomes checkout: the override."""
    from sweep.workloads.command.template import script_arguments

    workload = cfg.workload
    if workload.get("name") != "command":
        return []
    cwd, moved = workload.get("cwd"), []
    if cwd and not Path(cwd).is_dir():
        checkout.mkdir(parents=True, exist_ok=True)
        cwd, moved = str(checkout), [f"workload.cwd={checkout}"]
    for script in script_arguments([str(a) for a in workload.argv]):
        path = Path(cwd or ".") / script
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    return moved


def test_every_sweep_command_in_the_docs_is_a_valid_sweep(tmp_path, monkeypatch):
    """Each `python -m sweep ...` the docs show composes and plans as sweep would run it (nothing launched); those
    whose shown output is an error are run for real below, and `resume=` needs a sweep dir (tests/test_fingerprint.py)."""
    _user_sweeps(tmp_path)
    monkeypatch.chdir(tmp_path)
    checked = 0
    for page in PAGES:
        for line, args, shown in sweep_commands(page.read_text()):
            if "sweep: error:" in shown or any(a.startswith("resume=") for a in args):
                continue
            try:
                plan(args, tmp_path / "plan")
            except Exception as e:  # noqa: BLE001  (the command and the error, whatever it is)
                pytest.fail(f"{page.name}: `{line}`: {type(e).__name__}: {e}")
            checked += 1
    assert checked >= 20


def test_error_examples_print_what_the_docs_show(tmp_path):
    """A bad-input example with no sweep dir behind it is run as written: its one line, exit status 2."""
    examples = [(page, line, args, shown) for page in PAGES for line, args, shown in sweep_commands(page.read_text())
                if shown.startswith("sweep: error:") and not any(a.startswith(("resume=", "hydra.sweep.dir=")) for a in args)]
    assert len(examples) >= 2
    for page, line, args, shown in examples:
        proc = run_sweep(args, cwd=tmp_path)
        assert (proc.returncode, proc.stderr) == (2, shown + "\n"), f"{page.name}: `{line}`"


def test_slurm_example_is_the_pinned_golden_script():
    """docs/slurm.md's example command is the golden case `readme_example`, and the script it shows is that golden file."""
    text = section("Running on Slurm")
    (command, script) = fenced_blocks(text, "bash")[:2]
    ((_, args, _),) = sweep_commands(f"```bash\n{command}```")
    assert [a for a in args if not a.startswith("max_in_flight=")] == CASES["readme_example"]
    golden = golden_path("readme_example").read_text()
    golden = golden.replace("/SWEEP", "<sweep dir>").replace(" python -u", " <python> -u")
    kept = [line for line in golden.splitlines() if line and not line.startswith(("#!", "# "))]
    assert [line for line in script.splitlines() if line] == kept
