"""A results file holds what its chapter's run wrote, nothing kept by hand beside it.

Each chapters/NN/run.py declares ``SECTIONS``, the top-level keys its ``save_results`` call writes;
every results file of the chapter must stay within them, and ``save_results`` is the only code that
writes a chapter's results file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Set

import pytest

from moe_gemm.core.chapters import chapter_module
from moe_gemm.core.paths import CHAPTERS_DIR, REPO_ROOT

CHAPTERS = sorted(path.parent.name for path in CHAPTERS_DIR.glob("[0-9][0-9]/run.py"))


def test_every_chapter_is_checked():
    assert CHAPTERS[0] == "00" and len(CHAPTERS) >= 9


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_results_files_hold_only_the_sections_the_run_writes(chapter):
    run = chapter_module(chapter)
    sections = run.SECTIONS
    assert isinstance(sections, Set) and all(isinstance(name, str) for name in sections)
    source = (CHAPTERS_DIR / chapter / "run.py").read_text()
    # measure.parts saves through save_results; chapter.start_parts_run opens a PartsFile
    writes = any(call in source for call in ("save_results(", "PartsFile(", "start_parts_run("))
    # save_results always writes the provenance and the records; a run that never calls it writes nothing
    assert {"provenance", "records"} <= sections if writes else not sections
    for path in sorted((CHAPTERS_DIR / chapter / "results").glob("*.json")):
        stray = [key for key in json.loads(path.read_text()) if key not in sections]
        assert not stray, (f"{path.relative_to(REPO_ROOT)} holds {', '.join(stray)}, which chapters/{chapter}/run.py "
                           f"does not write (its SECTIONS: {', '.join(sorted(sections))})")


def test_only_save_results_writes_a_chapters_results_file():
    """write_results is called by save_results and by the ceilings module (ceilings/<gpu>.json) only;
    nothing else names a chapter's results folder to write into it."""
    callers = set()
    for folder in ("python", "chapters", "tools"):
        for source in (REPO_ROOT / folder).rglob("*.py"):
            text = source.read_text()
            if re.search(r"(?<![\w.])write_results\(", text.replace("def write_results(", "")):
                callers.add(source.relative_to(REPO_ROOT).as_posix())
    assert callers == {"python/moe_gemm/measure/results.py", "python/moe_gemm/measure/ceilings.py"}
    ceilings = (REPO_ROOT / "python/moe_gemm/measure/ceilings.py").read_text()
    assert re.findall(r"write_results\((\w+)\(", ceilings) == ["ceilings_path"]
