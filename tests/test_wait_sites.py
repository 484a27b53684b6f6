"""The mbarrier waits read from Nsight Compute's source page (moe_gemm.measure.wait_sites), on a source page made
up like the one ncu exported for k7's first version at 65,536 rows: consumers waiting for full stages, a producer
that never had to retry."""

from __future__ import annotations

import pytest

from moe_gemm.measure.wait_sites import hot_sites, parse_source_csv, wait_sites, wait_summary

HEADER = ('"Kernel Name","k7_weight_grad<192, 5, 2, 0, 0>"\n'
          '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"# Samples","Instructions Executed"\n')


def page(rows: list[tuple[int, str, float, int]]) -> str:
    return HEADER + "".join(f'"{address:#x}","{source}","{samples}","0","0","{executed:,}"\n'
                            for address, source, samples, executed in rows)


PAGE = page([
    # a consumer's wait for a full stage: first try, forward branch to its retry loop, then the wgmmas it guards
    (0x100, "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R8+URZ], R5", 0.5, 430080),
    (0x110, "@!P1 BRA 0x900", 19.5, 430080),
    (0x120, "STS.128 [R221], RZ", 1.0, 100),  # a peeled last stage zeroes rows before its wgmmas
    (0x130, "HGMMA.64x192x16.F32.BF16 R24, gdesc[UR8].tnspA.tnspB, R24", 0.6, 430080),
    (0x140, "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R13+URZ], RZ", 0.1, 100),  # its release of the stage: not an expect-tx
    # the producer's wait for a free stage, then the arrive announcing the copies' bytes
    (0x500, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2+URZ], R3", 0.0, 114688),
    (0x510, "@!P0 BRA 0xa00", 0.4, 114688),
    (0x520, "SYNCS.ARRIVE.TRANS64 RZ, [R18+URZ], R17", 0.1, 114688),
    (0x530, "UTMALDG.3D [UR8], [UR16]", 0.1, 114688),
    (0x540, "UTMALDG.3D [UR8], [UR16]", 0.1, 114688),
    # the retry loops, at the end: a consumer's ran 1,157,292 times, the producer's never
    (0x900, "YIELD", 0.0, 1157292),
    (0x910, "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R8+URZ], R5", 0.0, 1157292),
    (0x920, "@!P1 BRA 0x900", 0.0, 1157292),
    (0xa00, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2+URZ], R3", 0.0, 0),
    (0xa10, "@!P0 BRA 0xa00", 0.0, 0),
    (0xa20, "BRA 0x520", 0.0, 0),
])


def test_the_rows_come_in_address_order_with_their_samples_and_executions():
    rows = parse_source_csv(PAGE)
    assert [r.address for r in rows] == sorted(r.address for r in rows) and len(rows) == 16
    assert rows[1].source == "@!P1 BRA 0x900" and rows[1].samples == 19.5 and rows[10].executed == 1157292
    with pytest.raises(ValueError, match="header"):
        parse_source_csv("==PROF== nothing profiled\n")


def test_each_wait_is_found_once_with_its_role_tries_retries_and_share():
    sites = wait_sites(parse_source_csv(PAGE))
    assert [(s["address"], s["role"], s["first_tries"], s["retries"]) for s in sites] == [
        (0x100, "consumer", 430080, 1157292), (0x500, "producer", 114688, 0)]  # the retry loops are not sites
    total = sum(r.samples for r in parse_source_csv(PAGE))
    assert sites[0]["samples_pct"] == pytest.approx(100 * 20.0 / total)


def test_the_summary_says_which_side_waits():
    summary = wait_summary(parse_source_csv(PAGE))
    assert summary["consumer_wait_pct"] > 40 * summary["producer_wait_pct"] > 0
    assert summary["producer_wait_retries"] == 0 and summary["consumer_wait_retries"] == 1157292
    assert summary["producer_waits"] == 114688 and "other_wait_pct" not in summary


def test_the_hot_sites_are_the_instructions_with_most_samples_most_first_and_none_without():
    rows = parse_source_csv(PAGE)
    sites = hot_sites(rows, shown=3)
    assert [s["address"] for s in sites] == [0x110, 0x120, 0x130]
    assert sites[0]["source"] == "@!P1 BRA 0x900"
    assert sites[0]["samples_pct"] == pytest.approx(100 * 19.5 / sum(r.samples for r in rows))
    assert all(s["samples_pct"] > 0 for s in hot_sites(rows, shown=100))  # instructions never sampled are left out


def test_a_chapter_prints_where_the_warps_stood_only_for_launches_that_recorded_it(capsys):
    from moe_gemm.chapter import show_profile

    row = {"variant": "k6/auto", "experts": 64, "K": 1024, "N": 2688, "tokens": 65536, "skew": 0.0,
           "duration_ns": 4.7e5, "gmma_pipe_pct": 92.7}
    show_profile([row])
    assert "Where the warps stood" not in capsys.readouterr().out
    show_profile([row, {**row, "hot_sites": hot_sites(parse_source_csv(PAGE), shown=2)}])
    out = capsys.readouterr().out
    assert "Where the warps stood" in out and "@!P1 BRA 0x900" in out and "0x0120" in out
