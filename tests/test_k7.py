"""k7 without a GPU: every rung compiles for sm_90a in every type pair without spills and within the shared
memory, its SASS is the kernel described (wgmma with both operands transposed from shared memory, a main
loop that adds constant steps to two descriptors, the tail's zeroing outside it), the configurations name
the template instances they compile, the arguments are K7_PARAMS in number and kind, and the refusals
name their rules."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from moe_gemm.cuda.tensormap import TiledMap
from moe_gemm.model.problem import BF16_OPERANDS, FP16, FP32, problem_from_counts
from moe_gemm.variants.k7 import K7WeightGrad, arguments, ladder
from moe_gemm.variants.k7.config import LADDER, NOT_YET_RUN, STATIC_SMEM_ALLOWANCE, THREADS, K7Config, refusals
from moe_gemm.variants.sm90.config import SMEM_LIMIT

SOURCE = (Path(__file__).resolve().parents[1] / "kernels" / "k7_weight_grad.cu").read_text()
TYPES = [("bf16", "bf16"), ("fp16", "fp16"), ("bf16", "fp32"), ("fp16", "fp32")]


@pytest.mark.parametrize("types", TYPES)
@pytest.mark.parametrize("name", list(LADDER))
def test_every_rung_builds_in_every_type_pair_without_spills(name, types):
    from moe_gemm.cuda.sass import opcode_counts

    variant = K7WeightGrad(name, LADDER[name].replace(element=types[0], out=types[1]))
    kernel = variant.compile("sm_90a")
    assert kernel.report.spill_store_bytes == 0 and kernel.report.spill_load_bytes == 0
    assert kernel.report.static_smem_bytes <= STATIC_SMEM_ALLOWANCE
    assert variant.config.dynamic_smem_bytes + STATIC_SMEM_ALLOWANCE <= SMEM_LIMIT
    assert "C7520" not in kernel.log  # no serialized wgmma
    sass = kernel.sass()
    # both operands transposed: the HGMMA reads A^T and dC as they lie (no K-major copy)
    wgmmas = set(re.findall(r"HGMMA\.64x(\d+)x16\.F32(\.BF16)?", sass))
    assert wgmmas == {(str(variant.config.bn), ".BF16" if types[0] == "bf16" else "")}
    counts = opcode_counts(sass, ("HGMMA", "STSM", "UTMASTG", "STG.E.64", "STS.128", "USETMAXREG"))
    # 2 slices and 1 slice x 4 k16 steps, each in the loop and in its peeled last stage (cooperative: 1 slice, and
    # none where K ends half-way into the tile, which issues no wgmma at all)
    assert counts["HGMMA"] == (8 if variant.config.cooperative else 24) and counts["USETMAXREG"] == 2
    assert counts["STS.128"] > 0  # the tail's zeros
    fp32 = types[1] == "fp32"
    assert (counts["STSM"] == 0 and counts["UTMASTG"] == 0) == fp32 and (counts["STG.E.64"] > 0) == fp32


@pytest.mark.parametrize("name", list(LADDER))
def test_the_main_loop_steps_two_descriptors_and_tests_nothing(name):
    """The loop is k6's (71 instructions per k-step and warp for 8 HGMMA, 58 for 4): the tail's zeroing
    sits in the peeled last stage, not in the loop."""
    from moe_gemm.cuda.sass import main_loop_instructions

    sass = K7WeightGrad(name).compile("sm_90a").sass()
    assert main_loop_instructions(sass, 4) <= 70
    if not LADDER[name].cooperative:  # a cooperative warpgroup has one m64 slice: 4 wgmmas a k-step, never 8
        assert main_loop_instructions(sass, 8) <= 80


def test_each_configuration_names_its_template_instance():
    config = K7Config(192, stages=5, element="fp16", out="fp32")
    assert config.kernel_name == "k7_weight_grad<192, 5, 2, 1, 2>"
    assert re.search(r"template <int BN, int STAGES, int STAGING_BOXES, int IN, int OUT, int RINGS = 1, "
                     r"bool ACCUMULATE = false,\s*bool PANELS = true, bool COOP = false>\s*"
                     r"__global__ void __launch_bounds__\(3 \* sm90::WARPGROUP, 1\) k7_weight_grad", SOURCE)
    assert K7Config(128, stages=5, rings=2).kernel_name == "k7_weight_grad<128, 5, 2, 0, 0, 2>"
    assert LADDER["k7/bn192-boxes"].kernel_name == "k7_weight_grad<192, 5, 2, 0, 0, 1, false, false>"
    assert LADDER["k7/bn192-boxes"].label == "128x192 pingpong g8 s5 box copies"
    coop = K7Config(256, stages=3, staging_boxes=4, rings=2, cooperative=True)
    assert coop.kernel_name == "k7_weight_grad<256, 3, 4, 0, 0, 2, false, true, true>"
    assert coop.label == "128x256 cooperative g8 s3 2 rings"
    assert THREADS == 384
    assert config.label == "128x192 pingpong g8 s5 fp16->fp32"
    assert [v.name for v in ladder(pending=True)] == list(LADDER)
    assert [v.name for v in ladder()] == [name for name in LADDER if name not in NOT_YET_RUN]


def test_the_arguments_are_k7_params_in_number_kind_and_order():
    macro = re.search(r"#define K7_PARAMS(.*?)\n\n", SOURCE, re.S).group(1)
    parameters = [p.split() for p in re.sub(r"/\*.*?\*/|\\", " ", macro).split(",")]

    def kind(declaration: list[str]) -> str:
        text = " ".join(declaration[:-1])
        return "tensor map" if "CUtensorMap" in text else "pointer" if "*" in text else text

    args = arguments(LADDER["k7/bn192"], 0x10000, 0x20000, 0x30000, 0x40004, 1000, 8, 1024, 2688)
    kinds = ["tensor map" if isinstance(arg, TiledMap)
             else "int" if isinstance(arg, np.int32) else "pointer" if type(arg) is int else repr(arg) for arg in args]
    assert kinds == [kind(p) for p in parameters]
    a_map, dc_map, db_map = args[:3]
    # One copy per operand per stage: 64 rows of the reduction x two 64-column panels of K, x three of N
    assert a_map.box == (64, 64, 2) and dc_map.box == (64, 64, 3)
    assert a_map.dims == (64, 1000, 1024 // 64) and a_map.strides == (1024 * 2, 128)
    assert db_map.dims == (2688, 8 * 1024)  # dB as [E x K, N]
    # N not a multiple of 64: the last panel would read the next row, so dC keeps a box per 64 columns
    dc_plain = arguments(LADDER["k7/bn192"], 0x10000, 0x20000, 0x30000, 0x40004, 1000, 8, 1024, 2696)[1]
    assert dc_plain.box == (64, 64) and dc_plain.dims == (2696, 1000)


def test_a_panel_map_puts_the_panels_side_by_side_within_each_row():
    from moe_gemm.cuda.tensormap import panel_map

    with pytest.raises(ValueError, match="multiple of 64"):
        panel_map("dC", 0, rows=10, cols=200, box_rows=64, box_panels=3)
    # a panel stride other than the box's inner 128 bytes, or panels reaching past the row, is refused
    with pytest.raises(ValueError, match="side by side"):
        TiledMap("X", 0, (64, 10, 4), (512, 256), (64, 64, 2), panel_dim=2)
    with pytest.raises(ValueError, match="side by side"):
        TiledMap("X", 0, (64, 10, 5), (512, 128), (64, 64, 2), panel_dim=2)
    # without the panel exemption the same strides break the covering rule
    with pytest.raises(ValueError, match="must cover"):
        TiledMap("X", 0, (64, 10, 4), (512, 128), (64, 64, 2))


def test_the_refusals_name_their_rules():
    assert refusals(8, 1024, 2688) == []
    reasons = " ".join(refusals(300, 96, 100, a_address=8))
    for rule in ("K = 96 is not a multiple of 64", "N = 100 is not a multiple of 8", "E = 300 experts",
                 "16-byte boundaries"):
        assert rule in reasons
    with pytest.raises(ValueError, match="K = 96 is not a multiple of 64"):
        K7WeightGrad("k7/bn128").check_shape(4, 96, 64)
    with pytest.raises(ValueError, match="BN is a multiple of 64 up to 192"):
        K7Config(256, stages=3)
    with pytest.raises(ValueError, match="BN is a multiple of 64 up to 256"):
        K7Config(320, stages=2, rings=2, cooperative=True)
    with pytest.raises(ValueError, match="through a ring each"):
        K7Config(256, stages=3, cooperative=True)


def test_it_takes_only_weight_gradients_in_its_types():
    from moe_gemm.variants.compiled import require_takes

    variant = K7WeightGrad("k7/bn192")
    forward = problem_from_counts(np.array([3, 5]), 64, 64)
    with pytest.raises(ValueError, match="ragged-K"):
        require_takes(variant.name, forward, variant.ragged_axes, variant.formats, variant.out_dtypes)
    for out in (FP16, FP32):
        grad = problem_from_counts(np.array([3, 5]), 64, 64, ragged="K", fmt=BF16_OPERANDS, out_dtype=out)
        require_takes(variant.name, grad, variant.ragged_axes, variant.formats, variant.out_dtypes)
        assert variant.typed(grad).config.out == ("fp16" if out == FP16 else "fp32")


@pytest.mark.parametrize("name", [n for n in LADDER if LADDER[n].rings == 2 and not LADDER[n].cooperative])
def test_the_rings_rungs_keep_the_main_loop(name):
    """A staging ring per warpgroup (RINGS = 2): the same main loop, the template's third-last argument."""
    from moe_gemm.cuda.sass import main_loop_instructions

    variant = K7WeightGrad(name)
    assert variant.config.kernel_name.endswith(", 2>")
    sass = variant.compile("sm_90a").sass()
    assert main_loop_instructions(sass, 8) <= 80 and main_loop_instructions(sass, 4) <= 70


@pytest.mark.parametrize("name", ["k7/bn192", "k7/bn128"])
def test_the_accumulate_mode_adds_by_reduction_in_l2(name):
    """dB += A^T dC: every store of the fp32 epilogue becomes one 8-byte reduction (REDG ... F32x2), no plain
    store and no load of dB is left, and the main loop is untouched."""
    from moe_gemm.cuda.sass import main_loop_instructions, opcode_counts

    variant = K7WeightGrad(name, LADDER[name].replace(out="fp32", accumulate=True))
    assert variant.config.kernel_name.endswith(", 1, true>") and variant.config.label.endswith("bf16->fp32 +=")
    kernel = variant.compile("sm_90a")
    assert kernel.report.spill_store_bytes == 0
    sass = kernel.sass()
    reductions = re.findall(r"REDG\.E\.ADD\.F32x2\S*", sass)
    # 2 m64 slices x 2 row halves x BN / 8 column pairs per thread
    assert len(reductions) == 2 * 2 * variant.config.bn // 8
    counts = opcode_counts(sass, ("STG.E.64", "LDG.E.64"))
    assert counts["STG.E.64"] == 0 and counts["LDG.E.64"] == 0
    assert main_loop_instructions(sass, 8) <= 80
    with pytest.raises(ValueError, match="accumulates into an fp32 dB only"):
        LADDER[name].replace(accumulate=True)


def test_the_rings_parameter_keeps_the_validated_instances_names():
    """RINGS comes last with a default, so the rungs validated before it existed keep their names (and, the
    validation record's carry-over checked, their machine code)."""
    assert all(config.kernel_name.count(",") == 4 for config in LADDER.values() if config.rings == 1 and config.panels)
    assert re.search(r"int IN, int OUT, int RINGS = 1, bool ACCUMULATE = false,\s*bool PANELS = true, "
                     r"bool COOP = false>\s*__global__", SOURCE)


@pytest.mark.parametrize("name", ["k7/bn192", "k7/bn192-boxes"])
def test_a_stage_is_one_copy_per_operand_where_the_columns_come_in_whole_panels(name):
    """The producer's copies: one 3-D copy of A and one of dC per stage (the panel maps), with the 2-D copies per
    box kept for an N that is not a multiple of 64; the first version issues only 2-D ones."""
    from moe_gemm.cuda.sass import opcode_counts

    counts = opcode_counts(K7WeightGrad(name).compile("sm_90a").sass(), ("UTMALDG.3D", "UTMALDG.2D"))
    assert (counts["UTMALDG.3D"] > 0) == LADDER[name].panels and counts["UTMALDG.2D"] > 0
