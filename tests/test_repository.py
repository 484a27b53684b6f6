"""Rules the whole repository keeps: it cites no document its readers do not have, prose lives in the
pages rather than in Python, and the README and the home page say which chapters exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from moe_gemm.core.chapters import CHAPTERS

REPO = Path(__file__).resolve().parents[1]
# Folders that hold build outputs, caches and generated files, for a copy of the tree without .git.
UNTRACKED = {".git", "site", "build", ".cache", ".pytest_cache", "__pycache__", "figures", "gpu-session"}
# The project's internal design brief: readers never see it, so nothing may cite it, as a word or as
# part of a name (FFMA_..._TFLOPS), case-sensitively. Built from two parts so that this file does not
# cite it either.
BRIEF = re.compile(("(?<![A-Za-z])" + "SP" + "EC" + "(?![a-z])").encode())


def repository_files() -> list[Path]:
    """Tracked files and untracked ones git does not ignore; every file, outside build outputs, without git."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, check=True).stdout
        return [REPO / name for name in out.decode().split("\0") if name and (REPO / name).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in REPO.rglob("*") if p.is_file() and not UNTRACKED & set(p.relative_to(REPO).parts)
                and not any(part.endswith(".egg-info") for part in p.parts)]


def test_the_repository_lists_its_own_files():
    names = {p.relative_to(REPO).as_posix() for p in repository_files()}
    assert {"README.md", "site_docs/index.md", "python/moe_gemm/site/pages.py", "tests/test_repository.py"} <= names


@pytest.mark.parametrize(("line", "cites"), [(b"see " + b"SP" + b"EC section 6", True),
                                             (b"FP32_FFMA_" + b"SP" + b"EC_TFLOPS = 55.6", True),
                                             (b"SP" + b"EC's anchor", True), (b"READ_PAGE = INS" + b"PECT", False),
                                             (b"the spec tolerance", False)])
def test_the_citation_pattern(line, cites):
    assert bool(BRIEF.search(line)) is cites


def test_nothing_cites_the_internal_brief():
    hits = [f"{p.relative_to(REPO)}:{n}" for p in repository_files()
            for n, line in enumerate(p.read_bytes().split(b"\n"), 1) if BRIEF.search(line)]
    assert not hits, f"cite the fact and its source instead of the internal brief: {hits}"


def test_no_python_writes_the_pages_prose():
    """The pages carry their own sentences; Python draws figures and compiler tables only."""
    hits = [str(p.relative_to(REPO)) for p in repository_files()
            if p.suffix == ".py" and re.search(r"^\s*def findings_", p.read_text(encoding="utf-8"), re.M)]
    assert not hits, f"findings generators are back: {hits}"


# ---- which chapters exist ------------------------------------------------------------------------

# What a chapter's status says, from what exists: a results file means it was measured; a chapter
# that by design is never run says so once its folder exists; anything else is planned. A new chapter
# needs a row here only if it is one of those never run.
NOT_RUN_BY_DESIGN = {"00": "no GPU needed", "05": "compiled and inspected, not run"}


def expected_status(chapter: str) -> str:
    folder = REPO / "chapters" / chapter
    if list(folder.glob("results/*.json")):
        return "measured"
    if chapter in NOT_RUN_BY_DESIGN and folder.is_dir():
        return NOT_RUN_BY_DESIGN[chapter]
    return "planned"


def status_column(path: Path) -> dict[str, str]:
    """Chapter number -> the last cell of its row in the page's chapter table."""
    rows = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.match(r"\[?(\d\d) ·", cells[0]) if line.startswith("|") else None
        if match:
            rows[match.group(1)] = cells[-1]
    return rows


@pytest.mark.parametrize("document", ("site_docs/index.md", "README.md"))
def test_chapter_status_follows_what_exists(document):
    statuses = status_column(REPO / document)
    assert sorted(statuses) == [c.number for c in CHAPTERS], f"{document} lists chapters {sorted(statuses)}"
    for chapter, status in statuses.items():
        expected = expected_status(chapter)
        assert expected in status, f"{document}: chapter {chapter} says {status!r}, but should say {expected!r}"
        if expected != "measured":
            assert "measured" not in status, f"{document}: chapter {chapter} claims a measurement it does not have"


def test_every_chapter_with_results_has_a_page():
    pages = {p.name[:2] for p in (REPO / "site_docs").glob("[0-9][0-9]-*.md")}
    measured = {p.parent.parent.name for p in (REPO / "chapters").glob("*/results/*.json")}
    assert measured <= pages, f"results without a page: {sorted(measured - pages)}"


# ---- the harness's layers ------------------------------------------------------------------------

def readme_layers() -> list[str]:
    """The harness's layer folders in the order README.md's 'Where things are' lists them."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text[text.index("python/moe_gemm/ "):text.index("chapter.py ")]
    return [name.split("/")[0] for name in re.findall(r"^  (\w+)/", block, re.M)]


def test_each_harness_layer_imports_only_the_layers_listed_before_it():
    """What the README says of python/moe_gemm: a layer imports only from the layers listed before it
    (imports inside functions included), and none imports moe_gemm.chapter, which sits on top."""
    order = readme_layers()
    root = REPO / "python" / "moe_gemm"
    assert set(order) == {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    wrong = []
    for path in root.rglob("*.py"):
        layer = path.relative_to(root).parts[0]
        if layer not in order:
            continue
        for used in re.findall(r"^\s*(?:from|import) moe_gemm\.(\w+)", path.read_text(encoding="utf-8"), re.M):
            if used == "chapter" or (used in order and order.index(used) > order.index(layer)):
                wrong.append(f"{path.relative_to(REPO)} imports moe_gemm.{used}")
    assert not wrong, wrong
