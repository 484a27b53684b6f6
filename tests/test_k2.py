"""k2 without a GPU: every STAGES compiles for sm_90a with no local memory and the instructions the
chapter is about, the occupancy model's reading of it, and the input checks TMA needs."""

from __future__ import annotations

import pytest

from moe_gemm.cuda.sass import opcode_counts
from moe_gemm.cuda.tensormap import TiledMap, batched_matrix_map, matrix_map
from moe_gemm.model.occupancy import residency
from moe_gemm.variants.k2 import (
    STAGE_BYTES,
    STAGE_CHOICES,
    WARPS_PER_BLOCK,
    K2TmaWs,
    check_inputs,
    dynamic_smem_bytes,
    tensor_maps,
)

OPCODES = ("UTMALDG", "SYNCS", "HMMA.16816.F32.BF16", "LDSM")


@pytest.fixture(scope="module", params=STAGE_CHOICES, ids=lambda s: f"stages{s}")
def compiled(request):
    variant = K2TmaWs(request.param)
    return variant, variant.compile("sm_90a")


def test_compiles_for_sm90a_without_spills(compiled):
    _, kernel = compiled
    report = kernel.report
    assert report.spill_bytes == 0 and report.stack_frame_bytes == 0, kernel.log
    assert 64 < report.registers <= 255  # 64 fp32 accumulators per lane, at least


def test_sass_holds_tma_mbarrier_and_tensor_core_instructions(compiled):
    _, kernel = compiled
    counts = opcode_counts(kernel.sass(), OPCODES)
    assert counts["UTMALDG"] == 3, counts  # one A box and two B panels per stage, issued in one place
    assert counts["SYNCS"] >= 4, counts  # init, arrive.expect_tx, arrive, try_wait
    assert counts["HMMA.16816.F32.BF16"] == 64, counts  # 4 k16 steps x 4 x 4 warp tiles, unrolled
    assert counts["LDSM"] == 24, counts  # per k16 step: 4 A fragments + 2 transposed B pairs


def test_static_shared_memory_is_the_barriers(compiled):
    variant, kernel = compiled
    assert kernel.report.static_smem_bytes == 2 * 8 * variant.stages  # full[] and empty[], 8 bytes each


def test_resources_and_residency(compiled):
    variant, kernel = compiled
    resources = variant.resources("sm_90a")
    assert resources.warps_per_block == WARPS_PER_BLOCK == 9
    assert resources.smem_bytes == kernel.report.static_smem_bytes + variant.stages * STAGE_BYTES + 1024
    fit = residency(resources.registers, 9, resources.smem_bytes)
    assert resources.blocks_per_sm == fit.blocks
    # The kernel's __launch_bounds__ minimum (k2::Residency) is what the model then allows: ptxas
    # kept STAGES 2 and 3 within two blocks' registers; STAGES 4 fits one block by shared memory.
    assert fit.blocks == {2: 2, 3: 2, 4: 1}[variant.stages]
    assert fit.by_registers >= fit.blocks
    if variant.stages == 4:
        assert fit.by_smem == 1


def test_dynamic_smem_and_stage_size():
    assert STAGE_BYTES == 32 * 1024
    assert [dynamic_smem_bytes(s) for s in STAGE_CHOICES] == [66560, 99328, 132096]


def test_stages_must_be_2_3_or_4():
    for bad in (1, 5, 0):
        with pytest.raises(ValueError, match="STAGES"):
            K2TmaWs(bad)
    assert [K2TmaWs(s).name for s in STAGE_CHOICES] == ["k2/s2", "k2/s3", "k2/s4"]


@pytest.mark.parametrize(("K", "N", "rule"), [
    (100, 2688, "K to be a multiple of 8"),
    (1024, 2690, "N to be a multiple of 8"),
    (1000, 2688, "multiple of BK = 64"),
    (72, 200, "multiple of BK = 64"),
    (0, 2688, "K to be a positive multiple of BK = 64"),
])
def test_shapes_tma_cannot_take(K, N, rule):
    with pytest.raises(ValueError, match=rule):
        check_inputs(K, N)


@pytest.mark.parametrize("offset", [2, 8])
def test_misaligned_pointers(offset):
    with pytest.raises(ValueError, match="A to start on a 16-byte boundary"):
        check_inputs(1024, 2688, 0x7F0000000000 + offset, 0x7F1000000000)
    with pytest.raises(ValueError, match="B to start on a 16-byte boundary"):
        check_inputs(1024, 2688, 0x7F0000000000, 0x7F1000000000 + offset)


def test_good_inputs_pass():
    check_inputs(1024, 2688, 0x7F0000000000, 0x7F1000000010)
    check_inputs(128, 200)  # the edge cases' shape
    check_inputs(64, 72)


def test_tensor_maps_for_the_seed_shape():
    a_map, b_map = tensor_maps(0x7F0000000000, 0x7F1000000000, tokens=16384, experts=64, K=1024, N=2688)
    assert (a_map.dims, a_map.strides, a_map.box) == ((1024, 16384), (2048,), (64, 128))
    assert (b_map.dims, b_map.strides, b_map.box) == ((2688, 1024, 64), (5376, 1024 * 2688 * 2), (64, 64, 1))
    assert a_map.box_bytes + 2 * b_map.box_bytes == STAGE_BYTES  # the kernel's expect_tx per stage
    assert a_map.swizzle_bytes == b_map.swizzle_bytes == 128


def test_tensor_map_boxes_may_exceed_small_tensors():
    # 54 routed rows, N = 72: the boxes hang over the tensor's edges, which TMA zero-fills.
    a_map, b_map = tensor_maps(0x1000, 0x2000, tokens=54, experts=4, K=64, N=72)
    assert a_map.dims == (64, 54) and b_map.dims == (72, 64, 4)


@pytest.mark.parametrize(("kwargs", "rule"), [
    ({"address": 0x1008}, "16-byte aligned"),
    ({"strides": (2056,)}, "stride 0 must be a multiple of 16"),
    ({"strides": (1024,)}, "must cover"),
    ({"box": (128, 128)}, "inner extent must be <= 128 bytes"),
    ({"box": (64, 512)}, "box extent 1 must be 1..256"),
    ({"box": (4, 128)}, "multiple of 16 bytes"),
    ({"dims": (1024, 0)}, "dimension 1 must be 1..2"),
    ({"dims": (1024, 2**32 + 1)}, "dimension 1 must be 1..2"),
    ({"swizzle_bytes": 96}, "swizzle"),
    ({"l2_promotion_bytes": 512}, "L2 promotion"),
    ({"strides": ()}, "2 dims need 1 strides"),
    ({"element": "e5m2"}, r"tensor map A: the element must be one of bf16, fp16, fp32, e4m3, got 'e5m2'"),
])
def test_tensor_map_rules(kwargs, rule):
    base = {"name": "A", "address": 0x1000, "dims": (1024, 16384), "strides": (2048,), "box": (64, 128)}
    with pytest.raises(ValueError, match=rule):
        TiledMap(**{**base, **kwargs})


def test_map_helpers_list_dimensions_innermost_first():
    m = matrix_map("X", 0x100, rows=10, cols=24, box_rows=8, box_cols=16)
    assert (m.dims, m.strides, m.box) == ((24, 10), (48,), (16, 8))
    b = batched_matrix_map("Y", 0x100, batch=3, rows=64, cols=200, box_rows=64, box_cols=64)
    assert (b.dims, b.strides, b.box) == ((200, 64, 3), (400, 400 * 64), (64, 64, 1))
    wide = matrix_map("C", 0x100, rows=10, cols=24, box_rows=64, box_cols=32, element="fp32")
    assert (wide.strides, wide.element_bytes, wide.box_bytes) == ((96,), 4, 32 * 64 * 4)
    with pytest.raises(ValueError, match="tensor map Z: the element must be one of"):
        batched_matrix_map("Z", 0x100, batch=3, rows=64, cols=200, box_rows=64, box_cols=64, element="fp8")


def test_registry_names_resolve():
    from moe_gemm.variants.registry import get, names

    assert names("k2") == ["k2/s2", "k2/s3", "k2/s4"]
    assert get("k2/s3").stages == 3 and get("k2/s3").kernel_function == "k2_tma_ws"
