"""The user docs, README.md and docs/*.md, as the tests read them: pages, sections, code blocks, commands."""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

# A fenced block (```lang ... ```) or an indented one (4 spaces, after a blank line).
_FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_INDENTED = re.compile(r"(?:^\n)((?:^(?:    |\t).*\n|^\n)+)", re.M)


def section(title: str) -> str:
    """The text under `## title` up to the next `## `, on whichever page holds it (exactly one must)."""
    found = [text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0] for text in (p.read_text() for p in PAGES) if f"\n## {title}\n" in text]
    assert len(found) == 1, f"'## {title}' is on {len(found)} pages of README.md and docs/, not one"
    return found[0]


def fenced_blocks(text: str, lang: str | None = None) -> list[str]:
    """The fenced code blocks of `text` (only those tagged `lang`, when given)."""
    return [body for tag, body in _FENCED.findall(text) if lang is None or tag == lang]


def code_text(text: str) -> list[str]:
    """Every code block of `text`, fenced or indented, as the reader sees it (indentation removed)."""
    unfenced = _FENCED.sub("", text)
    indented = [textwrap.dedent(block) for block in _INDENTED.findall(unfenced)]
    return fenced_blocks(text) + indented


def sweep_commands(text: str) -> list[tuple[str, list[str], str]]:
    """Each `python -m sweep ...` command in `text`'s code blocks: (the line, its arguments, what the block shows
    after it up to the next command, empty when nothing). Continuation lines (`\\`) are joined, `$ ` prompts,
    `VAR=value` prefixes and trailing `# comments` are removed."""
    commands = []
    for block in code_text(text):
        lines = block.replace("\\\n", " ").splitlines()
        for i, line in enumerate(lines):
            line = line.strip().removeprefix("$ ")
            if not re.match(r"^(?:\w+=\S* )*python -m sweep(?: |$)", line):
                continue
            words = shlex.split(line, comments=True)
            while "=" in words[0]:
                words.pop(0)
            shown = []
            for after in lines[i + 1:]:
                if after.startswith("$ ") or re.match(r"^\s*(?:\w+=\S* )*python -m sweep", after):
                    break
                shown.append(after)
            commands.append((line, words[3:], "\n".join(shown).strip()))
    return commands
