"""Tables that describe a workload before any kernel runs: routing, tile counts, eta, estimates.

Chapter 00 prints them and writes them into the docs; later chapters reuse them next to their
measurements. Everything here is arithmetic on :func:`~moe_gemm.model.routing.expert_counts`, so the
same numbers come out on every machine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moe_gemm.core.tables import Table
from moe_gemm.measure.ceilings import roofline_basis
from moe_gemm.model.problem import useful_flops
from moe_gemm.model.roofline import compulsory_bytes
from moe_gemm.model.routing import expert_counts, routing_summary
from moe_gemm.model.tiles import eta, eta_estimate, m_tiles_per_expert, scheduled_flops, tile_count
from moe_gemm.model.workloads import SEED, Workload

TokensSkew = tuple[int, float]  # a routing of the seed shape: (M_tot, s)

# The one balanced rate we can quote without a GPU: k2/S2 (BM=128) at 16,384 rows on the seed's B300.
SEED_B300_K2_TFLOPS = 440.1
SEED_B300_K2_LABEL = "the seed's B300 k2/S2 number"


def skew_label(skew: float) -> str:
    """0 -> '0', 1.2 -> '1.2': skews print as typed, not as 1.200."""
    return f"{skew:g}"


def _eta_cell(counts: np.ndarray, bm: int) -> float | str:
    """eta, or '-' where no row is routed: 0 / 0 real over scheduled rows is not a utilisation."""
    return eta(counts, bm) if np.sum(counts) else "-"


def routing_table(experts: int, workloads: Sequence[TokensSkew]) -> Table:
    """Largest, smallest and empty experts, and max/mean imbalance, per workload."""
    rows = []
    for tokens, skew in workloads:
        summary = routing_summary(expert_counts(experts, tokens, skew))
        rows.append((tokens, skew_label(skew), summary["largest"], summary["smallest"], summary["empty"],
                     f"{summary['imbalance']:.2f}" if tokens else "-"))
    return Table(("rows M_tot", "skew s", "largest m_e", "smallest m_e", "empty experts", "max/mean"),
                 tuple(rows), f"Routing over E = {experts:,} experts",
                 legend="m_e proportional to (e+1)^-s, floored, leftover rows to the heaviest experts; "
                        "max/mean: largest expert over the mean.")


def tile_count_table(experts: int, N: int, workloads: Sequence[TokensSkew],
                     shapes: Sequence[tuple[int, int]] = ((64, 64), (128, 128))) -> Table:
    """Per workload and BM x BN: M tiles, N tiles, descriptors (blocks) and eta."""
    rows = []
    for tokens, skew in workloads:
        counts = expert_counts(experts, tokens, skew)
        for bm, bn in shapes:
            m_tiles = int(m_tiles_per_expert(counts, bm).sum())
            rows.append((tokens, skew_label(skew), f"{bm}x{bn}", m_tiles, -(-N // bn),
                         tile_count(counts, N, bm, bn), _eta_cell(counts, bm)))
    return Table(("rows M_tot", "skew s", "tile BMxBN", "M tiles", "N tiles", "tiles", "eta"),
                 tuple(rows), f"Flat tile list, E = {experts:,}, N = {N:,}",
                 legend="tiles = sum_e ceil(m_e / BM) * ceil(N / BN), one block each, none crossing an expert "
                        "boundary; eta: real rows / scheduled rows.")


def eta_detail_table(counts: np.ndarray, K: int, N: int, bms: Sequence[int], bn: int = 128,
                     title: str | None = None) -> Table:
    """One routing, several BM: scheduled rows, eta, wasted share and scheduled vs useful GFLOP."""
    counts = np.asarray(counts)
    tokens = int(counts.sum())
    title = title or f"Row utilisation eta for {tokens:,} rows"
    useful = useful_flops(tokens, K, N)
    rows = []
    for bm in bms:
        m_tiles = int(m_tiles_per_expert(counts, bm).sum())
        value = _eta_cell(counts, bm)
        rows.append((bm, m_tiles, m_tiles * bm, value, "-" if value == "-" else f"{100 * (1 - value):.1f}%",
                     f"{useful / 1e9:,.1f}", f"{scheduled_flops(counts, K, N, bm, bn) / 1e9:,.1f}"))
    return Table(("BM", "M tiles", "scheduled rows", "eta", "padding", "useful GFLOP", f"scheduled GFLOP (BN={bn})"),
                 tuple(rows), title,
                 legend="eta = real rows / scheduled rows: a partial tile runs the full MMA loop, padding "
                        "included; padding = 1 - eta; '-' where no row is routed.")


def estimate_table(experts: int, workloads: Sequence[TokensSkew], bms: Sequence[int], balanced_tflops: float,
                   estimate_bm: int = 128, reference: TokensSkew = (SEED.tokens, SEED.skew),
                   rate_label: str = "measured") -> Table:
    """eta per BM and the eta-only estimate T ~= T_ref * eta / eta_ref for ``estimate_bm``.

    ``balanced_tflops`` is a measured rate at the ``reference`` workload with BM = ``estimate_bm``, on
    the seed's experts (where it was measured); every other workload's estimate scales it by the ratio
    of row utilisations and nothing else. eta_ref is the reference's own, at the seed's E: taken at
    the table's E instead, a routing with fewer rows per expert than a tile at the reference would
    lower eta_ref and lift every estimate past the measured rate.
    """
    eta_ref = eta(expert_counts(SEED.experts, *reference), estimate_bm)
    rows = []
    for tokens, skew in workloads:
        counts = expert_counts(experts, tokens, skew)
        etas = [_eta_cell(counts, bm) for bm in bms]
        estimate = "-" if not tokens else f"{eta_estimate(balanced_tflops, eta(counts, estimate_bm), eta_ref):.1f}"
        rows.append((tokens, skew_label(skew), *etas, estimate))
    headers = ("rows M_tot", "skew s", *(f"eta BM={bm}" for bm in bms), f"estimate BM={estimate_bm} (TFLOP/s)")
    title = (f"eta-only estimate, E = {experts:,}: T = {balanced_tflops:g} TFLOP/s x eta(BM={estimate_bm}) / "
             f"{eta_ref:.3f}\n({balanced_tflops:g} TFLOP/s: {rate_label}, BM = {estimate_bm}, "
             f"{reference[0]:,} rows, s = {skew_label(reference[1])})")
    return Table(headers, tuple(rows), title,
                 legend="padding only: per-block costs, the grid's tail, occupancy and caching are not modelled; "
                        "'-' where no row is routed.")


def roofline_table(experts: int, K: int, N: int, tokens_list: Sequence[int]) -> Table:
    """Useful FLOP, compulsory bytes, arithmetic intensity and the H200 roofline per M_tot (balanced
    routing), at the recorded H200's ceilings."""
    basis = roofline_basis()
    rows = []
    for tokens in tokens_list:
        workload = Workload(tokens, 0.0, experts, K, N)
        flops = useful_flops(tokens, K, N)
        traffic = compulsory_bytes(workload.counts, K, N)
        rows.append((tokens, f"{flops / 1e9:,.1f}", f"{traffic / 1e6:,.1f}", f"{flops / traffic:,.1f}",
                     f"{basis.tflops(workload):.0f}", basis.bound(workload)))
    return Table(("rows M_tot", "useful GFLOP", "compulsory MB", "FLOP/byte", "roofline TFLOP/s", "bound by"),
                 tuple(rows), f"Roofline, E = {experts:,}, K = {K:,}, N = {N:,}, s = 0: H200 "
                 f"{basis.tensor_tflops:.0f} TFLOP/s, {basis.copy_tbps:.2f} TB/s (ridge {basis.ridge:.0f} FLOP/byte)",
                 legend="compulsory: A and the weights of experts with rows read once, C written once, bf16; "
                        "roofline: useful FLOP over max(FLOP / wgmma peak, bytes / copy), both measured on the "
                        "H200 (ceilings/h200.json).")
