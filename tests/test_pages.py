"""moe_gemm.site.pages, the macros the docs pages read their numbers through: on a small synthetic results
file, directly and through a real mkdocs build, and against the CLI's table on the recorded files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from moe_gemm.core.chapters import measured_chapters
from moe_gemm.site.numbers import Number, PageDataError, change, fmt, pct
from moe_gemm.site.pages import Pages, display_command
from moe_gemm.variants import registry

REPO = Path(__file__).resolve().parents[1]


def _record(variant: str, tokens: int = 16384, skew: float = 0.0, tflops: float = 100.0, **extra) -> dict:
    return {"variant": variant, "experts": 64, "K": 1024, "N": 2688, "tokens": tokens, "skew": skew,
            "median_ms": 0.9, "min_ms": 0.85, "max_ms": 1.25, "useful_tflops": tflops, "tiles": 10752,
            "registers": 96, "eta": 1.0, **extra}


SYNTHETIC = {
    "provenance": {"gpu": "Test GPU", "compute_capability": "9.0", "sm_count": 132, "driver": "13.0",
                   "cuda": {"driver_api": "13.0", "nvrtc": "13.0"}, "clocks": {"clocks.sm": "1980 MHz"},
                   "packages": {"numpy": "2.4.6"}, "git_commit": "0123456789abcdef0123456789abcdef01234567",
                   "date": "2026-11-29T12:50:33+00:00",
                   "command": "/opt/venv/bin/python3 /home/someone/repo/chapters/99/run.py --profile", "host": "box"},
    "records": [_record("k9/a"), _record("k9/a", skew=1.2, tflops=80.0), _record("k9/a", tokens=2048, tflops=40.0),
                _record("peer/torch_grouped_mm", tflops=200.0),
                _record("peer/torch_grouped_mm", skew=1.2, tflops=160.0),
                _record("k9/a", K=8192, tflops=120.0)],
    "ceilings": [{"variant": "ceiling/copy", "tbps": 4.2}, {"variant": "ceiling/dense_bf16", "tflops": 700.0}],
    "profile": [{"variant": "k9/a", "cycles_per_issue": 14.904, "instructions": 56300184.0}],
}


# The GPU's one ceilings record, which every page's roofline reads (not the chapter's own ceilings).
CEILINGS = {"provenance": SYNTHETIC["provenance"], "records": [],
            "ceilings": [{"variant": "ceiling/copy", "tbps": 4.0}, {"variant": "ceiling/wgmma", "tflops": 800.0}]}


def _write_synthetic(root: Path, ceilings: dict = CEILINGS) -> None:
    path = root / "chapters" / "99" / "results" / "h200.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(SYNTHETIC))
    (root / "ceilings").mkdir()
    (root / "ceilings" / "h200.json").write_text(json.dumps(ceilings))


@pytest.fixture
def pages(tmp_path) -> Pages:
    _write_synthetic(tmp_path)
    return Pages(tmp_path)


def test_numbers_print_in_their_fields_format_and_stay_numbers(pages):
    assert str(pages.tflops("99", "k9/a")) == "100.0"
    assert str(pages.ms("99", "k9/a", skew=1.2)) == "0.900"
    assert str(pages.value("99", "k9/a", "tiles")) == "10,752"
    assert str(pages.value("99", "k9/a", "registers", fmt=".1f")) == "96.0"
    half = pages.tflops("99", "k9/a", tokens=2048) / pages.tflops("99", "k9/a")
    assert half == pytest.approx(0.4) and not isinstance(half, Number)


def test_workloads_match_on_every_keyword_with_the_seed_as_default(pages):
    assert pages.tflops("99", "k9/a", skew=1.2) == 80.0
    assert pages.tflops("99", "k9/a", tokens=2048, skew=0) == 40.0
    assert pages.tflops("99", "k9/a", K=8192) == 120.0
    with pytest.raises(PageDataError, match=r"no record of k9/a at 2,048 rows, s=1.2"):
        pages.tflops("99", "k9/a", tokens=2048, skew=1.2)


def test_part_picks_one_of_two_records_of_a_variant_at_a_workload(tmp_path):
    """Parts measured by separate processes can both hold a variant at a workload (chapter 07's ladder
    and grid share the seed five): without ``part`` the first is found, with it the named one."""
    data = {**SYNTHETIC, "records": [_record("k9/a", tflops=90.0, part="ladder"), _record("k9/a", tflops=95.0,
                                                                                         part="grid")]}
    _write_synthetic(tmp_path)
    (tmp_path / "chapters" / "99" / "results" / "h200.json").write_text(json.dumps(data))
    pages = Pages(tmp_path)
    assert pages.tflops("99", "k9/a") == 90.0 and pages.tflops("99", "k9/a", part="grid") == 95.0
    assert pages.record("99", "k9/a", part="ladder").useful_tflops == 90.0
    with pytest.raises(PageDataError, match="no record of k9/a at 16,384 rows, s=0 in part 'models'"):
        pages.tflops("99", "k9/a", part="models")
    assert "95.0" in pages.results_table("99", part="grid") and "90.0" not in pages.results_table("99", part="grid")
    assert pages.macros()["command"]("/opt/venv/bin/python3 /x/chapters/08/run.py --quick") == \
        "python chapters/08/run.py --quick"


def test_missing_data_raises_naming_what_is_missing(pages):
    with pytest.raises(PageDataError, match="no record of k9/b"):
        pages.record("99", "k9/b")
    with pytest.raises(PageDataError, match="has no 'spill_bytes'"):
        pages.value("99", "k9/a", "spill_bytes")
    with pytest.raises(PageDataError, match="has no 'spill_bytes'"):
        pages.record("99", "k9/a").spill_bytes
    with pytest.raises(PageDataError, match="chapters/98/results/h200.json does not exist"):
        pages.tflops("98", "k9/a")
    with pytest.raises(PageDataError, match="no section 'stages'"):
        pages.section("99", "stages")
    with pytest.raises(PageDataError, match="no entry for k9/b"):
        pages.entry("99", "profile", "k9/b")
    with pytest.raises(PageDataError, match="no ceiling/ffma"):
        pages.ceiling("99", "ffma")


def test_ratio_spread_and_sections(pages):
    assert str(pages.ratio("99", "k9/a", "peer/torch_grouped_mm")) == "0.50"
    assert str(pages.ratio("99", "k9/a", "peer/torch_grouped_mm", skew=1.2, fmt=".3f")) == "0.500"
    assert pages.spread("99", "k9/a") == "0.850-1.250 ms"
    assert str(pages.entry("99", "profile", "k9/a", "cycles_per_issue")) == "14.90"
    assert str(pages.entry("99", "profile", "k9/a", "instructions")) == "56,300,184"
    assert str(pages.section("99", "provenance").clocks["clocks.sm"]) == "1980 MHz"
    assert str(pages.ceiling("99", "copy")) == "4.20" and str(pages.ceiling("99", "dense_bf16")) == "700.0"


def test_roofline_uses_the_gpus_one_ceilings_record(pages, tmp_path):
    # At 4 TB/s the seed shape's 473,956,352 compulsory bytes take longer than its 90.2 GFLOP at
    # 800 TFLOP/s: memory-bound, just, at 16,384 rows; far more so at 2,048. The chapter's own
    # ceilings (4.2 TB/s, cuBLAS 700) play no part.
    assert str(pages.roofline()) == "761"
    assert pages.roofline(tokens=2048) == pytest.approx(2 * 2048 * 1024 * 2688 / (367_525_888 / 4e12) / 1e12)
    assert pages.roofline_bound() == "memory-bound" and pages.roofline_bound(tokens=1 << 20) == "compute-bound"
    assert pages.roofline_basis() == ("800 TFLOP/s (wgmma) and 4.00 TB/s (copy), wgmma peak and device copy "
                                      "measured on the H200 (ceilings/h200.json)")
    assert str(pages.gpu_ceiling("wgmma")) == "800.0" and str(pages.gpu_ceiling("copy")) == "4.00"
    half = dict(CEILINGS, ceilings=[{"variant": "ceiling/copy", "tbps": 4.0}])  # half a basis is none
    (tmp_path / "ceilings/h200.json").write_text(json.dumps(half))
    with pytest.raises(ValueError, match="python -m moe_gemm.measure.ceilings"):
        pages.roofline()


def test_results_table_selects_variants_workloads_and_columns(pages):
    table = pages.results_table("99", variants=["k9/a"], workloads=[(16384, 0), {"tokens": 16384, "skew": 1.2}],
                                columns=["variant", "workload", "tflops", "vs_peer", "roofline"])
    lines = table.strip().splitlines()
    assert lines[0] == "| variant | workload | TFLOP/s | vs peer | % roofline (800 / 4.00) |"
    assert lines[2] == "| k9/a | 16k s=0 | 100.0 | 0.50 | 13.1 |"  # of 761
    assert lines[3] == "| k9/a | 16k s=1.2 | 80.0 | 0.50 | 10.5 |"
    assert lines[4] == ""
    assert lines[5].startswith("*workload: 16k = 16,384 rows") and "TFLOP/s: useful" in lines[5]
    assert "ceilings wgmma peak and device copy measured on the H200" in lines[5]
    everything = pages.results_table("99")
    assert everything.count("| k9/a |") == 4 and "peer/torch_grouped_mm" in everything
    with pytest.raises(PageDataError, match="no record of k9/a at 2,048 rows, s=1.2"):
        pages.results_table("99", variants=["k9/a"], workloads=[(2048, 1.2)])
    with pytest.raises(ValueError, match="unknown column"):
        pages.results_table("99", columns=["variant", "speed"])


def test_provenance_is_one_collapsible_block_without_machine_paths(pages):
    block = pages.provenance("99")
    lines = block.splitlines()
    assert lines[0] == '??? info "Provenance: chapters/99/results/h200.json"'
    assert all(line.startswith("    ") for line in lines[2:])  # all of it inside the block
    assert "| GPU | Test GPU, compute capability 9.0, 132 SMs |" in block
    assert "| command | `python chapters/99/run.py --profile` |" in block
    assert "| date | 2026-11-29 12:50 UTC |" in block
    assert "0123456789abcdef0123456789abcdef01234567" in block
    assert "/opt/" not in block and "/home/" not in block and "box" not in block


def test_provenance_lists_each_parts_run_inside_the_block_when_asked(tmp_path):
    """A file whose parts ran as separate processes: with parts=True the one block also names, part by part,
    what was measured, the commit, the date and the command as a reader types it; without, it does not."""
    path = tmp_path / "chapters" / "98" / "results" / "h200.json"
    path.parent.mkdir(parents=True)
    runs = {"grid": {"commit": "f" * 40, "date": "2026-12-01T18:20:47+00:00", "measured": "the grid's rows 512",
                     "command": "/opt/venv/bin/python3 chapters/98/run.py --parts grid"}}
    path.write_text(json.dumps({**SYNTHETIC, "part_runs": runs}))
    pages = Pages(tmp_path)
    block = pages.provenance("98", parts=True)
    assert all(line.startswith("    ") for line in block.splitlines()[2:])
    assert ("| part grid | the grid's rows 512: commit `" + "f" * 40 + "`, 2026-12-01 18:20 UTC, "
            "`python chapters/98/run.py --parts grid` |") in block
    assert "part grid" not in pages.provenance("98") and "/opt/" not in block


def test_measured_and_best_look_up_without_failing_on_a_missing_record(pages):
    """measured() is the one lookup that answers False instead of failing the build; best() takes the
    fastest of several names that were measured, and fails when none was."""
    assert pages.measured("99", "k9/a") and pages.measured("99", "k9/a", K=8192)
    assert not pages.measured("99", "k9/a", tokens=512) and not pages.measured("99", "k9/b")
    assert not pages.measured("99", "k9/a", part="grid")
    best = pages.best("99", ["k9/a", "peer/torch_grouped_mm", "k9/b"], skew=1.2)
    assert (best.variant, best.useful_tflops) == ("peer/torch_grouped_mm", 160.0)
    assert pages.best("99", ["k9/a", "k9/b"], tokens=2048).useful_tflops == 40.0
    with pytest.raises(PageDataError, match="no record of k9/b"):
        pages.best("99", ["k9/b"])


def test_display_command():
    assert display_command("/opt/torch/.venv/bin/python3 chapters/01/run.py") == "python chapters/01/run.py"
    assert display_command("python3.12 /work/x/chapters/02/run.py --quick") == "python chapters/02/run.py --quick"
    assert display_command("pytest -q") == "pytest -q"


def test_formatting_helpers():
    assert fmt(0.05809, ".3f") == "0.058" and fmt(Number(3.14159, ".1f")) == "3.1"
    assert pct(0.4731) == "47.3%" and pct(0.4731, 0) == "47%"
    assert change(388.8, 374.5) == "+3.8%" and change(357.8, 388.8) == "-8.0%"


def test_harness_models(pages):
    assert str(pages.eta(128, skew=1.2)) == "0.780" and str(pages.eta(64, tokens=2048)) == "0.500"
    assert str(pages.compulsory_bytes()) == "473,956,352"
    assert pages.residency(96, 9, 99376).blocks == 2


# ---- through a build ---------------------------------------------------------------------------

def _mini_site(tmp_path: Path, page: str) -> subprocess.CompletedProcess:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(page)
    (tmp_path / "mkdocs.yml").write_text(textwrap.dedent("""\
        site_name: macros test
        plugins:
          - macros:
              modules: [moe_gemm.site.pages]
              on_undefined: strict
              on_error_fail: true
        markdown_extensions: [tables, pymdownx.details]
        """))
    _write_synthetic(tmp_path)
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=os.pathsep.join(
        [str(REPO / "python"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_a_page_renders_its_numbers_in_a_build(tmp_path):
    page = ('k9 runs at {{ tflops("99", "k9/a") }} TFLOP/s, {{ ratio("99", "k9/a", "peer/torch_grouped_mm") }} '
            'of the peer.\n\n{{ results_table("99", variants=["k9/a"], columns=["variant", "tflops"]) }}\n\n'
            '{{ provenance("99") }}\n')
    proc = _mini_site(tmp_path, page)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = (tmp_path / "site" / "index.html").read_text()
    assert "k9 runs at 100.0 TFLOP/s, 0.50 of the peer." in html
    assert re.search(r"<td[^>]*>k9/a</td>\s*<td[^>]*>120.0</td>", html)  # the K = 8192 row
    assert '<details class="info">' in html and "python chapters/99/run.py --profile" in html


def test_a_missing_record_fails_the_build(tmp_path):
    proc = _mini_site(tmp_path, 'A number that was never measured: {{ tflops("99", "k9/b") }}.\n')
    assert proc.returncode != 0
    assert "no record of k9/b at 16,384 rows, s=0" in proc.stdout + proc.stderr


# ---- one roofline basis on the CLI and the site ------------------------------------------------

# The chapters measured in one run whose records are kernels' at a workload, one per variant and workload,
# so that the CLI's rows and the page's pair up (chapters 07 and 08 run in parts, which time the same
# variant at the same cell; chapter 08's layer records are whole layers').
ONE_RUN_CHAPTERS = [c.number for c in measured_chapters() if c.family in registry.families() and not c.in_parts]


@pytest.mark.parametrize("chapter", ONE_RUN_CHAPTERS)
def test_cli_and_page_show_the_same_roofline(chapter, capsys):
    from moe_gemm.site.records import show_recorded

    show_recorded(chapter)
    cli = capsys.readouterr().out
    page = Pages(REPO).results_table(chapter)
    header = next(h for h in re.findall(r"% roofline \([^)]*\)", page))
    assert header in cli, f"the CLI's header differs from the page's {header!r}"
    cli_rows = [line.split() for line in cli.splitlines() if re.match(r"^(k\d|peer/)", line)]
    page_rows = [[c.strip() for c in line.strip("|").split("|")] for line in page.splitlines()
                 if re.match(r"^\| (k\d|peer/)", line)]
    assert len(cli_rows) == len(page_rows) > 0
    index = [c.strip() for c in page.splitlines()[0].strip("|").split("|")].index(header)
    for cli_row, page_row in zip(cli_rows, page_rows):
        assert page_row[index] in cli_row, (cli_row, page_row)


def test_the_documented_examples_hold_on_the_recorded_files():
    """Every '``{{ ... }}`` gives ``X``' in the module's docstring renders to X on the recorded results."""
    import jinja2

    import moe_gemm.site.pages

    inside = r"(?:(?!``).)*?"  # within one ``...`` span
    pattern = rf"``((?:\{{%{inside}%\}})?\{{\{{{inside}\}}\}})``\s+gives\s+``([^`]+)``"
    examples = re.findall(pattern, moe_gemm.site.pages.__doc__, re.S)
    assert len(examples) >= 4
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.globals.update(Pages(REPO).macros())
    for template, expected in examples:
        assert env.from_string(" ".join(template.split())).render() == expected, template


# ---- a chapter measured on another GPU, and a run's own tables on its page ---------------------------

SONICMOE_ROW = {"config": "SonicMoE 7B", "variant": "train/quack", "forward_eager_ms": 1.5, "backward_ms": 2.5,
                "forward_tflops": 309.2, "backward_tflops": 371.1, "step_tflops": 347.9, "peak_extra_bytes": 3 * 2**30,
                "grad_rel_error_vs_ours": 2e-3}


def test_a_chapter_measured_only_on_another_gpu_is_read_from_that_gpus_file(pages, tmp_path):
    assert pages.measured_on("99") == "h200" and pages.measured_on("99", "profile") == "h200"
    assert pages.measured_on("99", "sonicmoe") == "" and pages.measured_on("42") == ""
    other = tmp_path / "chapters" / "99" / "results" / "h100.json"
    other.write_text(json.dumps({**SYNTHETIC, "sonicmoe": [SONICMOE_ROW]}))
    assert pages.measured_on("99", "sonicmoe") == "h100"  # only the H100's file has it
    assert pages.measured_on("99", "records") == "h200"  # both have it: the recorded GPU's first


def test_a_chapter_table_on_a_page_is_the_runs_own_from_the_recorded_section(tmp_path):
    path = tmp_path / "chapters" / "09" / "results" / "h100.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"provenance": SYNTHETIC["provenance"], "sonicmoe": [SONICMOE_ROW]}))
    pages = Pages(tmp_path)
    table = pages.chapter_table("09", "sonicmoe_table", "sonicmoe", gpu="h100")
    assert "| SonicMoE 7B | quack | 1.50 | 2.50 | 309 | 371 | 348 | 3.0 |" in table
    assert "SonicMoE's benchmark times them" in table  # the legend comes along
    with pytest.raises(PageDataError, match="no section 'layer'"):
        pages.chapter_table("09", "sonicmoe_table", "layer", gpu="h100")
