"""The repository is self-contained: no file refers to a file outside it, and every link and
citation of a file inside it names one that exists (issue 30, point 1)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ".cfg", ".ini", ".sbatch", ".pbs", ""}
#: What pointed outside the repository before the design notes moved into docs/design.md.
OUTSIDE = re.compile(r"DESIGN\.md|\.\./shared|papers/0\d\d")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCS_CITATION = re.compile(r"\bdocs/[A-Za-z0-9_./-]+\.md\b")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    files = [ROOT / n for n in names if Path(n).suffix in TEXT_SUFFIXES and (ROOT / n).is_file()]
    assert len(files) > 100, "git ls-files found too few files: not a checkout?"
    return files


@pytest.fixture(scope="module")
def texts() -> dict[Path, str]:
    out = {}
    for path in tracked_text_files():
        try:
            out[path] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return out


def test_no_file_refers_to_a_file_outside_the_repository(texts):
    this = Path(__file__).resolve()
    found = [f"{p.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}"
             for p, text in texts.items() if p != this for m in OUTSIDE.finditer(text)]
    assert found == []


def test_every_markdown_link_to_a_file_resolves(texts):
    missing = []
    for path, text in texts.items():
        if path.suffix != ".md":
            continue
        for match in MARKDOWN_LINK.finditer(text):
            target = match.group(1).split("#")[0]
            if not target or "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                missing.append(f"{path.relative_to(ROOT)}: {match.group(1)}")
    assert missing == []


def test_every_cited_docs_page_exists(texts):
    missing = sorted({f"{p.relative_to(ROOT)}: {m.group(0)}" for p, text in texts.items()
                      for m in DOCS_CITATION.finditer(text) if not (ROOT / m.group(0)).exists()})
    assert missing == []


def test_the_design_notes_keep_the_sections_the_code_cites(texts):
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^## (\d+)\. ", design, re.M))
    cited = {m.group(1) for text in texts.values()
             for m in re.finditer(r"docs/design\.md,? sections? (\d+)", text)}
    assert cited and cited <= sections, sorted(cited - sections)
