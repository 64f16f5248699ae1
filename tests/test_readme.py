"""The README's and docs/'s commands, snippets and outputs stay true.

Checked elsewhere: the `python -m sweep.logs` examples and the preset table of docs/trainers.md
(tests/test_logs.py), the demo's OOM landscape (tests/test_e2e.py)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.doc_pages import PAGES, README, ROOT, fenced_blocks, section, sweep_commands
from support.plans import plan
from support.results import make_sweep
from support.sbatch_golden import CASES, golden_path
from support.sweep_run import run_sweep

DOCS = [p for p in PAGES if p != README]
# A python block that is a file shipped under examples/, verbatim, is a script to run with flags: tests/test_tutorial.py runs it.
SHIPPED = {path.read_text() for path in (ROOT / "examples").rglob("*.py")}
PYTHON_BLOCKS = [(page, i, block) for page in PAGES for i, block in enumerate(fenced_blocks(page.read_text(), "python")) if block not in SHIPPED]


def test_readme_starts_with_install_sweep_and_test_commands():
    first_block = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ['pip install torch==2.13.0 -e ".[test]"', "python -m sweep", "python -m pytest", "python -m pytest --full"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "python -m pip install -q torch==2.13.0 -e \".[test]\"" in ci and ci.rstrip().endswith("\npython -m pytest --full")


def test_readme_fits_on_a_few_screens_and_its_first_says_what_the_tests_do():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200
    first_screen = "\n".join(lines[:24])
    for needed in ("minutes", "root", "Slurm", "tests/slurm/cluster.sh install", "--full"):
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


@pytest.mark.e2e
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
