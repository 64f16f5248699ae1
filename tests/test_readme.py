"""The README's commands and snippets stay true."""

import re
import subprocess
import sys
from pathlib import Path

from test_api import make_sweep

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(section: str) -> list[str]:
    text = README.read_text()
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, re.S)


def test_reading_and_comparing_snippet_runs_as_written(tmp_path):
    outputs = tmp_path / "outputs"
    make_sweep(outputs, "2026-11-01_a100", machine="a100x8", link_latest=False)
    make_sweep(outputs, "2026-11-02_a100", machine="a100x8", scale=0.9, scale_pairs={(2, 4): 1.3})
    (blocks,) = python_blocks("Reading and comparing results")
    proc = subprocess.run([sys.executable, "-c", blocks], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "throughput_samples_per_s" in proc.stdout and "ratio_vs_first" in proc.stdout
    assert "machine.run_to_run_noise=" in proc.stdout
    assert (tmp_path / "trials.parquet").stat().st_size > 0


def test_readme_starts_with_install_sweep_and_test_commands():
    first_block = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ['pip install torch==2.13.0 -e ".[test]"', "python -m sweep", "python -m pytest"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "python -m pip install -q torch==2.13.0 -e \".[test]\"" in ci and ci.rstrip().endswith("\npython -m pytest")
