"""k8 without a GPU: every rung compiles for sm_90a in both output types without spills and within the shared
memory, its SASS is the kernel described (FP8 wgmma with both operands K-major, four per 128-deep stage and
m64 slice, never serialized; the promoted rungs add each stage's scratch sums into fp32 with one FFMA per
accumulator; the fast-accumulation rung has none), the configurations name the template instances they
compile, the arguments are K8_PARAMS in number and kind, the scales are laid out as the kernel's loads read
them, and the refusals name their rules."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from moe_gemm.cuda.tensormap import TiledMap
from moe_gemm.model.problem import BF16_OPERANDS, FP8_BLOCKWISE, FP8_ROWWISE, FP32, problem_from_counts
from moe_gemm.variants.k8 import K8Fp8, arguments, kernel_scales, ladder
from moe_gemm.variants.k8.config import LADDER, NOT_YET_RUN, STATIC_SMEM_ALLOWANCE, THREADS, K8Config, refusals
from moe_gemm.variants.sm90.config import SMEM_LIMIT

SOURCE = (Path(__file__).resolve().parents[1] / "kernels" / "k8_fp8.cu").read_text()


@pytest.mark.parametrize("out", ["bf16", "fp32"])
@pytest.mark.parametrize("name", list(LADDER))
def test_every_rung_builds_without_spills_and_never_serializes_its_wgmmas(name, out):
    from moe_gemm.cuda.sass import opcode_counts

    variant = K8Fp8(name, LADDER[name].replace(out=out))
    kernel = variant.compile("sm_90a")
    assert kernel.report.spill_store_bytes == 0 and kernel.report.spill_load_bytes == 0
    assert kernel.report.stack_frame_bytes == 0
    assert kernel.report.static_smem_bytes <= STATIC_SMEM_ALLOWANCE
    assert variant.config.dynamic_smem_bytes + STATIC_SMEM_ALLOWANCE <= SMEM_LIMIT
    assert not re.search(r"C75(15|18|20)", kernel.log)  # no serialized wgmma
    sass = kernel.sass()
    assert set(re.findall(r"QGMMA\.64x(\d+)x32\.F32\.E4M3\.E4M3", sass)) == {"128"}
    assert "HGMMA" not in sass
    counts = opcode_counts(sass, ("QGMMA", "STSM", "UTMASTG", "UTMALDG", "USETMAXREG"))
    # 4 k32 steps per stage, for each m64 slice of each instance of the main loop (1 slice and M_ITERS slices);
    # overlapped: one loop instance, its first k-block, two a turn in the loop and one in the tail
    assert counts["QGMMA"] == (4 * (1 + 2 + 1) if variant.config.overlap else 4 * (1 + variant.config.bm // 128))
    assert counts["USETMAXREG"] == 2
    assert (counts["STSM"] == 0 and counts["UTMASTG"] == 0) == (out == "fp32")
    # A and B^T only: a TMA box must start on 16 bytes, and a box of A's MN-major scales would start at the
    # expert's first row x 4 bytes, any row (the first run of a version that loaded them so trapped)
    assert counts["UTMALDG"] == 2


@pytest.mark.parametrize("name", list(LADDER))
def test_the_main_loop_promotes_with_one_add_per_accumulator(name):
    """Promoting, a stage's loop (4 QGMMA per slice) holds 64 FFMA per m64 slice: scratch x (scale_a x scale_b)
    added into the fp32 accumulators (FADD for rowwise, whose scales wait for the epilogue); not promoting,
    none."""
    from moe_gemm.cuda.sass import loops, main_loop_instructions

    config = LADDER[name]
    sass = K8Fp8(name).compile("sm_90a").sass()
    turn = 2 if config.overlap else 1  # k-blocks per turn of the loop
    wgmmas = 4 * turn * config.bm // 128
    body = min((b for b in loops(sass) if sum(re.match(r"(?:@!?U?P\w+\s+)?QGMMA", t) is not None for t in b) == wgmmas),
               key=len)
    adds = "FFMA" if config.scaling == "blockwise" else "FADD"
    ffma = sum(re.match(rf"(?:@!?U?P\w+\s+)?{adds}", t) is not None for t in body)
    assert ffma == (64 * turn * config.bm // 128 if config.promote else 0)
    assert main_loop_instructions(sass, wgmmas, "QGMMA") == len(body)
    assert len(body) - ffma <= 100 * turn  # the rest: the barrier wait, two descriptors, the scales, the release


def test_the_overlapped_loop_promotes_one_k_block_while_the_next_runs():
    """In k8/blockwise-bm128-overlap's loop each promotion follows the issue of the next k-block's four wgmmas and
    a wait that leaves that group in flight (WARPGROUP.DEPBAR.LE gsb0, 0x1); the plain rung waits for none in
    flight (0x0) before it promotes."""
    from moe_gemm.cuda.sass import loops

    def turn(name: str, wgmmas: int) -> list[str]:
        sass = K8Fp8(name).compile("sm_90a").sass()
        body = min((b for b in loops(sass) if sum("QGMMA" in t for t in b) == wgmmas), key=len)
        ops = []
        for t in body:
            op = "QGMMA" if "QGMMA" in t else "FFMA" if re.match(r"(?:@!?U?P\w+\s+)?FFMA", t) else \
                f"wait {t.split(',')[-1].strip(' ;')}" if "WARPGROUP.DEPBAR" in t else None
            if op and (not ops or ops[-1] != op):
                ops.append(op)
        return ops

    assert turn("k8/blockwise-bm128-overlap", 8) == ["QGMMA", "wait 0x1", "FFMA"] * 2
    assert turn("k8/blockwise-bm128", 4) == ["QGMMA", "wait 0x0", "FFMA"]


def test_each_configuration_names_its_template_instance():
    config = K8Config("blockwise", True, 256, stages=4, out="fp32")
    assert config.kernel_name == "k8_fp8<0, true, 256, 4, 1, 2>"
    assert K8Config("rowwise", False, 128, stages=6).kernel_name == "k8_fp8<1, false, 128, 6, 1, 0>"
    assert K8Config("blockwise", True, 128, stages=6, overlap=True).kernel_name == "k8_fp8<0, true, 128, 6, 1, 0, true>"
    prefetch = K8Config("blockwise", True, 256, stages=4, prefetch=True)
    assert prefetch.kernel_name == "k8_fp8<0, true, 256, 4, 1, 0, false, true>"
    assert prefetch.label == "256x128 blockwise promoted prefetched scales g8 s4 bf16"
    with pytest.raises(ValueError, match="overlapped promotion"):
        K8Config("blockwise", True, 256, stages=4, overlap=True)
    with pytest.raises(ValueError, match="prefetches the scales"):
        K8Config("rowwise", True, 128, stages=6, prefetch=True)
    with pytest.raises(ValueError, match="prefetches the scales"):
        K8Config("blockwise", True, 128, stages=6, overlap=True, prefetch=True)
    assert re.search(r"template <int SCALING, bool PROMOTE, int BM, int STAGES, int STAGING_BOXES, int OUT, "
                     r"bool OVERLAP = false,\s*bool PREFETCH = false>\s*"
                     r"__global__ void __launch_bounds__\(3 \* sm90::WARPGROUP, 1\) k8_fp8", SOURCE)
    assert THREADS == 384
    assert config.label == "256x128 blockwise promoted g8 s4 fp32"
    assert [v.name for v in ladder(pending=True)] == list(LADDER)
    assert [v.name for v in ladder()] == [name for name in LADDER if name not in NOT_YET_RUN]
    with pytest.raises(ValueError, match="apply by promotion"):
        K8Config("blockwise", False, 128, stages=6)
    with pytest.raises(ValueError, match="BM is 128 or 256"):
        K8Config("rowwise", True, 64, stages=6)


def test_the_arguments_are_k8_params_in_number_kind_and_order():
    macro = re.search(r"#define K8_PARAMS(.*?)\n\n", SOURCE, re.S).group(1)
    parameters = [p.split() for p in re.sub(r"/\*.*?\*/|\\", " ", macro).split(",")]

    def kind(declaration: list[str]) -> str:
        text = " ".join(declaration[:-1])
        return "tensor map" if "CUtensorMap" in text else "pointer" if "*" in text else text

    args = arguments(LADDER["k8/blockwise-bm256"], 0x10000, 0x20000, 0x30000, 0x40000, 0x50000, 0x60004, 1001, 8,
                     7168, 2048)
    kinds = ["tensor map" if isinstance(arg, TiledMap)
             else "int" if isinstance(arg, np.int32) else "pointer" if type(arg) is int else repr(arg) for arg in args]
    assert kinds == [kind(p) for p in parameters]
    a_map, b_map, c_map = args[:3]
    # 128-byte rows of e4m3: 128 of K per stage; A in boxes of BM rows, B^T in boxes of 128 columns
    assert a_map.box == (128, 256) and a_map.element_bytes == 1 and a_map.swizzle_bytes == 128
    assert b_map.box == (128, 128, 1) and b_map.dims == (7168, 2048, 8)
    assert c_map.box == (64, 64)


def test_the_scales_are_laid_out_as_the_kernel_reads_them():
    """Blockwise: scale_a [M_tot, K / 128] becomes [K / 128, M_pad] (padding 1), scale_b [E, K / 128, N / 128]
    becomes [E, N / 128, K / 128]; rowwise scales stay as they are."""
    problem = problem_from_counts(np.array([3, 0, 6]), 384, 256, seed=0, fmt=FP8_BLOCKWISE)
    scale_a, scale_b = kernel_scales(problem)
    assert scale_a.shape == (3, 12) and np.array_equal(scale_a[:, :9], problem.scale_a.T)
    assert (scale_a[:, 9:] == 1).all()
    assert scale_b.shape == (3, 2, 3) and scale_b[1, 1, 2] == problem.scale_b[1, 2, 1]
    assert scale_b.flags.c_contiguous
    rowwise = problem_from_counts(np.array([3, 0, 6]), 384, 256, seed=0, fmt=FP8_ROWWISE)
    assert all(a is b for a, b in zip(kernel_scales(rowwise), (rowwise.scale_a, rowwise.scale_b)))


def test_the_refusals_name_their_rules():
    assert refusals(8, 7168, 2048) == []
    reasons = " ".join(refusals(300, 200, 100, a_address=8))
    for rule in ("K = 200 is not a multiple of 16", "N = 100 is not a multiple of 8", "E = 300 experts",
                 "16-byte boundaries"):
        assert rule in reasons
    with pytest.raises(ValueError, match="K = 200 is not a multiple of 16"):
        K8Fp8("k8/blockwise-bm128").check_shape(4, 200, 64)


def test_it_takes_only_its_own_fp8_format():
    from moe_gemm.variants.compiled import require_takes

    blockwise, rowwise = K8Fp8("k8/blockwise-bm128"), K8Fp8("k8/rowwise-bm128")
    for variant, theirs in ((blockwise, FP8_ROWWISE), (rowwise, FP8_BLOCKWISE), (blockwise, BF16_OPERANDS)):
        other = problem_from_counts(np.array([3, 5]), 128, 64, fmt=theirs)
        with pytest.raises(ValueError, match=variant.formats[0].name):
            require_takes(variant.name, other, variant.ragged_axes, variant.formats, variant.out_dtypes)
    mine = problem_from_counts(np.array([3, 5]), 128, 64, fmt=FP8_BLOCKWISE, out_dtype=FP32)
    assert blockwise.typed(mine).config.out == "fp32"


def test_every_rung_runs_the_edge_cases_of_its_own_format():
    for variant in ladder():
        assert variant.edge_cases and all(case.fmt == variant.formats[0] for case in variant.edge_cases)
        assert variant.sanitize_cases and all(case.fmt == variant.formats[0] for case in variant.sanitize_cases)


def test_the_prefetching_loop_multiplies_scales_loaded_a_k_block_before():
    """The page's reading of the plain blockwise loop: s_A x s_B is formed before the k-block's first wgmma from
    registers its own loads filled that turn, so the wgmmas wait for the scales' L2 round trip. The prefetching
    rungs multiply, before their wgmmas, only values loaded a turn earlier."""
    from moe_gemm.cuda.sass import loops

    def waits_before_first_wgmma(name: str) -> list[str]:
        wgmmas = 4 * LADDER[name].bm // 128
        sass = K8Fp8(name).compile("sm_90a").sass()
        body = min((b for b in loops(sass) if sum("QGMMA" in t for t in b) == wgmmas), key=len)
        loaded, waits = set(), []
        for t in body:
            if "QGMMA" in t:
                break
            if m := re.match(r"(?:@!?U?P\w+\s+)?LDG\S*\s+(R\d+)", t):
                loaded.add(m.group(1))
            if m := re.match(r"(?:@!?U?P\w+\s+)?FMUL\S*\s+R\d+,\s*(R\d+)(?:\.reuse)?,\s*(R\d+)", t):
                waits += [r for r in m.groups() if r in loaded]
        return waits

    assert waits_before_first_wgmma("k8/blockwise-bm128")
    assert waits_before_first_wgmma("k8/blockwise-bm256")
    assert not waits_before_first_wgmma("k8/blockwise-bm128-prefetch")
    assert not waits_before_first_wgmma("k8/blockwise-bm256-prefetch")


@pytest.mark.parametrize("name", [n for n, c in LADDER.items() if c.scaling == "rowwise"])
def test_the_rowwise_epilogue_loads_each_column_pairs_scales_once_per_tile(name):
    """The rowwise scales of B: one 8-byte load per column pair a thread holds (BN / 8 = 16), whatever the tile's
    rows. The promoted 256-row rung scales its own sums in place, both m64 slices at once, so it loads no more
    than the 128-row ones; a slice at a time would load them twice. Counted on the converged path (up to the
    first EXIT: BRA.DIV's slow paths after it repeat code beside the shuffles)."""
    sass = K8Fp8(name).compile("sm_90a").sass()
    assert len(re.findall(r"LDG\.E\.64\b", sass.split("EXIT")[0])) == 128 // 8
