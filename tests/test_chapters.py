"""The table of chapters (moe_gemm.core.chapters.CHAPTERS) against everything that names chapters or kernel
families and cannot read it: mkdocs.yml's nav, the pages in site_docs/, the chapters/ folders, the kernel
families under python/moe_gemm/variants, the GPU validation record, README.md's chapter table and each
run.py. A chapter, page or kernel family added in one place and not in the table fails here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from moe_gemm.core.chapters import CHAPTERS, RECORDED_CAPABILITY, REFERENCE_PAGES, chapter_module
from moe_gemm.measure import validation
from moe_gemm.variants import registry

REPO = Path(__file__).resolve().parents[1]
NUMBERS = [c.number for c in CHAPTERS]


def test_the_numbers_run_from_00_without_a_gap():
    assert NUMBERS == [f"{n:02d}" for n in range(len(CHAPTERS))]


def test_the_nav_lists_each_chapters_page_under_its_title_in_order():
    import yaml

    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    entries = [next(iter(entry.items())) for entry in nav]
    assert entries[0] == ("Home", "index.md")
    assert entries[1:] == [(c.title, c.page) for c in CHAPTERS] + list(REFERENCE_PAGES)


def test_each_chapter_has_its_page_and_folder_and_nothing_else_is_numbered():
    pages = sorted(p.name for p in (REPO / "site_docs").glob("[0-9][0-9]-*.md"))
    assert pages == [c.page for c in CHAPTERS]
    assert all(c.page.startswith(f"{c.number}-") for c in CHAPTERS)
    folders = sorted(p.name for p in (REPO / "chapters").iterdir() if p.is_dir() and p.name.isdigit())
    assert folders == NUMBERS
    for number in NUMBERS:
        assert all((REPO / "chapters" / number / name).is_file() for name in ("run.py", "figures.py")), number


def test_the_families_are_the_variant_packages_and_the_torch_op():
    """Each chapter from 01 on introduces one family; all but chapter 08's are packages under
    moe_gemm/variants (chapter 08's, the torch op and the layer's combine kernel, is moe_gemm/torch)."""
    families = [c.family for c in CHAPTERS if c.family is not None]
    assert len(families) == len(set(families)) == len(CHAPTERS) - 1 and CHAPTERS[0].family is None
    assert [f for f in families if f != "torch"] == registry.families()
    assert CHAPTERS[8].family == "torch" and (REPO / "python/moe_gemm/torch/kernels.py").is_file()


def test_the_validation_record_holds_the_families_with_gpu_tests():
    """k4 (chapter 05) has none: it needs a Blackwell GPU and none is available, so no GPU run of it is
    recorded; every other family's GPU tests exist and its kernels are in kernels/validated.json."""
    tested = {c.family for c in CHAPTERS if c.gpu_tests and c.passed_on_gpu}
    assert set(validation.GPU_TESTS) == tested | {"ceiling"}
    pending = {c.family for c in CHAPTERS if not c.passed_on_gpu}  # written, not yet passing on a GPU
    assert tested == {c.family for c in CHAPTERS if c.family is not None} - {"k4"} - pending
    record = json.loads((REPO / "kernels/validated.json").read_text())
    assert {registry.family_of(name) for name in record["kernels"]} == tested | {"ceiling"}
    for c in CHAPTERS:
        assert all((REPO / path).is_file() for path in c.gpu_tests), c.number
    assert set(validation.SANITIZED) < tested and all(c.gpu_tests for c in CHAPTERS if c.sanitized)


def readme_chapter_rows() -> list[list[str]]:
    """README.md's chapter table: the cells of each row whose first names a chapter ("01 · ...")."""
    rows = []
    for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and re.match(r"\d\d · ", cells[0]):
            rows.append(cells)
    return rows


def test_the_readmes_chapter_table_names_each_chapter_and_its_kernel():
    rows = readme_chapter_rows()
    assert [row[0][:2] for row in rows] == NUMBERS
    for row, c in zip(rows, CHAPTERS):
        kernel = row[1]
        if c.family in registry.families():
            assert kernel == c.family, c.number
        else:  # chapter 00 (none) and chapter 08 (every kernel through the op): no one family's name
            assert kernel not in registry.families(), c.number


def test_each_run_py_needs_what_the_table_says_and_runs_in_parts_where_it_says():
    for c in CHAPTERS:
        run = chapter_module(c.number)
        if c.capability is None:
            assert run.REQUIRES.accepts is None, c.number
        else:
            assert run.REQUIRES.accepts(RECORDED_CAPABILITY) == c.runs_on_the_recorded_gpu, c.number
            assert run.REQUIRES.accepts(c.capability), c.number
        assert hasattr(run, "PARTS") == c.in_parts, c.number


def test_the_gpu_session_runs_the_default_stages_from_the_table():
    assert "python3 -m moe_gemm.core.chapters --default-gpu-stages" in (REPO / "tools/gpu_session.sh").read_text()


def test_the_gpu_sessions_validate_stage_passes_the_admission_flags_the_validation_cli_takes():
    """ADMIT=1 and PENDING=1 become --admit and --pending-only, both options of the validation command."""
    script = (REPO / "tools/gpu_session.sh").read_text()
    assert "${ADMIT:+--admit}" in script and "${PENDING:+--pending-only}" in script
    source = Path(validation.__file__).read_text()
    assert '"--admit"' in source and '"--pending-only"' in source
    proc = subprocess.run([sys.executable, "-m", "moe_gemm.core.chapters", "--default-gpu-stages"], capture_output=True,
                          text=True, check=True)
    assert proc.stdout == "01 02 03 04 06\n"  # 05 needs a Blackwell GPU; 07 and 08 run in parts
