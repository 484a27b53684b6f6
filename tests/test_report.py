"""Plain-text and markdown tables."""

from __future__ import annotations

import pytest

from moe_gemm.core.tables import Table, format_cell, format_table, markdown_table


def test_format_cell() -> None:
    assert format_cell(16384) == "16,384"
    assert format_cell(0.78049) == "0.780"
    assert format_cell(343.49, "{:.1f}") == "343.5"
    assert format_cell("k1/bm64") == "k1/bm64"
    assert format_cell(True) == "True"


def test_text_table_layout() -> None:
    text = format_table(("variant", "tiles", "eta"), [("k0", 10752, 1.0), ("k2/s2", 3444, 0.78)], "Title line")
    assert text.splitlines() == [
        "Title line",
        "variant   tiles    eta",
        "-------  ------  -----",
        "k0       10,752  1.000",
        "k2/s2     3,444  0.780",
    ]


def test_numeric_strings_are_right_aligned() -> None:
    lines = format_table(("share", "name"), [("22.0%", "a"), ("1.5%", "bb"), ("1.8x", "c")]).splitlines()
    assert lines[2:] == ["22.0%  a", " 1.5%  bb", " 1.8x  c"]


def test_mixed_column_is_left_aligned() -> None:
    lines = format_table(("x",), [("1",), ("n/a",), ("",)]).split("\n")
    assert lines[2:] == ["1", "n/a", ""]


def test_indent_and_no_title() -> None:
    lines = format_table(("a",), [(1,)], indent=2).splitlines()
    assert lines == ["  a", "  -", "  1"]


def test_row_length_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="row 1 has 1 cells but there are 2 headers"):
        format_table(("a", "b"), [(1, 2), (3,)])


def test_markdown_table() -> None:
    md = markdown_table(("variant", "TFLOP/s"), [("k1|bm64", 245.04), ("k2/s2", 440.1)], float_format="{:.1f}")
    assert md == ("| variant | TFLOP/s |\n"
                  "|:---|---:|\n"
                  "| k1\\|bm64 | 245.0 |\n"
                  "| k2/s2 | 440.1 |\n")


def test_table_object_prints_its_legend_under_itself() -> None:
    table = Table(("a", "b"), ((1, 0.5),), "T", legend="a: rows; b: a share.")
    lines = table.text().splitlines()
    assert lines[0] == "T" and lines[-1] == "a: rows; b: a share."
    assert table.text(indent=2).splitlines()[-1] == "  a: rows; b: a share."
    md = table.markdown().splitlines()
    assert md[2] == "| 1 | 0.500 |" and md[-1] == "*a: rows; b: a share.*"


@pytest.mark.parametrize("legend", ("", "  ", "two\nlines"))
def test_a_table_needs_a_one_line_legend(legend: str) -> None:
    with pytest.raises(ValueError, match="one non-empty line"):
        Table(("a",), ((1,),), legend=legend)
    with pytest.raises(TypeError, match="legend"):
        Table(("a",), ((1,),))  # type: ignore[call-arg]


def test_dashes_do_not_change_a_columns_alignment() -> None:
    lines = format_table(("eta",), [(0.5,), ("-",), (1.0,)]).splitlines()
    assert lines[2:] == ["0.500", "    -", "1.000"]


def test_numeric_ranges_are_right_aligned() -> None:
    """'0.621-0.625' lines up like a number (and on the site, does not wrap at its dash)."""
    lines = format_table(("min-max ms",), [("0.621-0.625",), ("12.109-12.400",), ("1.8–2.1x",)]).splitlines()
    assert lines[2:] == ["  0.621-0.625", "12.109-12.400", "     1.8–2.1x"]
    assert markdown_table(("range", "name"), [("1-2", "k1/bm64-s3")]).splitlines()[1] == "|---:|:---|"
    assert format_table(("x",), [("1-",), ("10",)]).splitlines()[2:] == ["1-", "10"]  # not a range


# ---- tables that fit a page's column (tests/test_docs.py measures them at 1400 px) ----------

def test_a_page_split_table_is_two_tables_on_the_page_and_one_in_the_terminal() -> None:
    table = Table(("kernel", "regs", "HGMMA", "SYNCS"), (("k3/a", 168, 4, 19), ("k3/b", 158, 8, 13)),
                  "T", legend="regs: per thread; the rest: SASS counts", page_split=2)
    assert table.markdown() == ("| kernel | regs |\n|:---|---:|\n| k3/a | 168 |\n| k3/b | 158 |\n\n"
                                "| kernel | HGMMA | SYNCS |\n|:---|---:|---:|\n| k3/a | 4 | 19 |\n| k3/b | 8 | 13 |\n"
                                "\n*regs: per thread; the rest: SASS counts*\n")
    assert table.text().splitlines()[1].split() == ["kernel", "regs", "HGMMA", "SYNCS"]
    for bad in (0, 1, 4):
        with pytest.raises(ValueError, match="page_split"):
            Table(("kernel", "regs", "HGMMA", "SYNCS"), (), legend="x", page_split=bad)


def _compile_row(variant: str, limiter: str, spill_bytes: int = 0) -> dict:
    return {"variant": variant, "arch": "sm_90a", "registers": 168, "smem_bytes": 200 * 1024,
            "spill_bytes": spill_bytes, "warps_per_block": 12, "blocks_per_sm": 1, "limiter": limiter,
            "sass": {"HGMMA": 4, "UCGABAR": 2}}


def test_the_compile_report_abbreviates_its_limits_and_splits_on_the_page() -> None:
    from moe_gemm.site.compile_report import compile_table, short_limit

    assert short_limit("registers = shared memory") == "regs = smem"
    assert short_limit("warps") == "warps"
    table = compile_table([_compile_row("k3/a", "registers = shared memory")], ("HGMMA", "UCGABAR"),
                          {"UCGABAR": "CLUSTER BAR"}, legend="regs: per thread")
    assert table.headers == ("kernel", "regs", "smem KB", "warps", "blocks/SM", "limit", "HGMMA", "CLUSTER BAR")
    assert table.rows[0][5] == "regs = smem"
    assert "regs: registers, smem: shared memory" in table.legend and "spills: none" in table.legend
    first, second = table.markdown().split("\n\n")[:2]
    assert first.splitlines()[0] == "| kernel | regs | smem KB | warps | blocks/SM | limit |"
    assert second.splitlines()[0] == "| kernel | HGMMA | CLUSTER BAR |"
    # A kernel that spills keeps the column: the number matters then.
    spilled = compile_table([_compile_row("k3/a", "registers", 64), _compile_row("k3/b", "registers")], ("HGMMA",))
    assert "spills" in spilled.headers and "spills: none" not in spilled.legend
    assert [row[spilled.headers.index("spills")] for row in spilled.rows] == [64, 0]


def test_interleaved_rounds_keep_the_median_of_their_medians():
    from moe_gemm.measure.runs import _merge_rounds

    rounds = [{"variant": "v", "median_ms": m, "min_ms": m - 0.1, "max_ms": m + 0.2, "useful_tflops": 10.0 / m,
               "scheduled_tflops": 20.0 / m} for m in (1.0, 2.0, 4.0)]
    merged = _merge_rounds(rounds)
    assert merged["median_ms"] == 2.0 and merged["round_medians_ms"] == [1.0, 2.0, 4.0] and merged["rounds"] == 3
    assert merged["min_ms"] == pytest.approx(0.9) and merged["max_ms"] == pytest.approx(4.2)
    assert merged["useful_tflops"] == pytest.approx(5.0) and merged["scheduled_tflops"] == pytest.approx(10.0)
    assert rounds[0]["median_ms"] == 1.0 and "rounds" not in rounds[0]  # the round's own record is untouched


def test_the_vs_peer_ratio_compares_within_one_part_of_a_run():
    """Chapter 07's ladder and grid time the same cells in two processes: a ladder record is compared with
    the ladder's torch._grouped_mm, never the grid's (torch once read 0.97 against itself that way)."""
    from moe_gemm.site.records import peer_ratio

    cell = {"tokens": 16384, "skew": 0.0, "experts": 64, "K": 1024, "N": 2688}
    records = [{**cell, "variant": "peer/torch_grouped_mm", "useful_tflops": 500.0, "part": "grid"},
               {**cell, "variant": "peer/torch_grouped_mm", "useful_tflops": 400.0, "part": "ladder"},
               {**cell, "variant": "k6/auto", "useful_tflops": 600.0, "part": "ladder"}]
    assert peer_ratio(records[2], records) == pytest.approx(1.5)
    assert peer_ratio(records[1], records) == pytest.approx(1.0)
    assert peer_ratio({**records[2], "part": "models"}, records) is None
