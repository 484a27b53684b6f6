"""k8's SwiGLU epilogue (the FP8 layer's GEMM 1) without a GPU: both outputs compile for sm_90a without spills or
serialized wgmmas, the SASS is the kernel described (two 128-row boxes of B^T per stage, eight FP8 wgmmas and
two promotions per k-block; bf16 out through stmatrix and TMA, e4m3 out from registers: one e4m3 conversion per
pair, two shuffles per row for the group's amax, the quad's bytes transposed and stored 8 at a time, no TMA
store), the configurations name their template instances and refuse what the kernel cannot do, the arguments are
K8_PARAMS plus the activation's scales with the maps of [M_tot, I], the rules route and refuse, and the op's
fallback on the CPU gives the product and the separate pass's bits."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from moe_gemm.cuda.tensormap import TiledMap
from moe_gemm.variants.k8 import K8Fp8, swiglu_arguments
from moe_gemm.variants.k8.config import SWIGLU, K8Config, refusals

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
SOURCE = (KERNELS / "k8_fp8.cu").read_text()


@pytest.fixture(scope="module", params=list(SWIGLU))
def compiled(request):
    name = request.param
    return name, K8Fp8(name, SWIGLU[name]).compile("sm_90a")


def test_both_outputs_build_without_spills_and_never_serialize_their_wgmmas(compiled):
    from moe_gemm.cuda.sass import opcode_counts

    name, kernel = compiled
    config = SWIGLU[name]
    assert kernel.report.spill_store_bytes == kernel.report.spill_load_bytes == kernel.report.stack_frame_bytes == 0
    assert "C7515" not in kernel.log and "C7520" not in kernel.log
    sass = kernel.sass()
    assert set(re.findall(r"QGMMA\.64x(\d+)x32\.F32\.E4M3\.E4M3", sass)) == {"128"}
    counts = opcode_counts(sass, ("QGMMA", "UTMALDG", "UTMASTG", "STSM", "F2FP", "SHFL", "MUFU"))
    # gate and up: 4 k32 steps each per k-block, in the main loop's two instances (the one- and the M_ITERS-slice
    # call, here both one slice)
    assert counts["QGMMA"] == 2 * 2 * 4
    assert counts["UTMALDG"] == 3  # A's box and B^T's two per stage
    e4m3 = config.out == "e4m3"
    assert (counts["UTMASTG"] == 0 and counts["STSM"] == 0) == e4m3
    conversions = len(re.findall(r"F2FP\.SATFINITE\.E4M3\.F32\.PACK_AB", sass))
    quad = e4m3 and config.quad_store
    # a thread's 64 values of its two rows, in pairs; the shuffles of the transpose come with the compiler's path for
    # a divergent warp (BRA.DIV), never taken here, which converts some pairs again
    assert (conversions == 32 if not quad else 32 <= conversions <= 64) if e4m3 else conversions == 0
    assert len(re.findall(r"SHFL\.BFLY[^;]*0x1, 0x1f", sass)) >= (2 if e4m3 else 0)  # the quad's amax per row
    # e4m3: transposed within the quad, each thread's row leaves in four 8-byte stores (a quad: 32-byte sectors),
    # never in two-byte pairs; and the transpose's two exchanges per 32 columns and row
    assert len(re.findall(r"STG\.E\.64 ", sass)) == (2 * 4 if quad else 0)
    assert len(re.findall(r"STG\.E\.U16 ", sass)) == (2 * 16 if e4m3 and not quad else 0)  # the first version's
    assert len(re.findall(r"SHFL\.BFLY[^;]*0x2, 0x1f", sass)) >= (2 * 4 + 2 if quad else 2 if e4m3 else 0)
    assert counts["MUFU"] >= 2 * 64  # e^-gate and the division, per activation value


def test_the_main_loop_promotes_gate_and_up_with_one_add_per_accumulator(compiled):
    from moe_gemm.cuda.sass import loops

    _, kernel = compiled
    body = min((b for b in loops(kernel.sass()) if sum(re.match(r"(?:@!?U?P\w+\s+)?QGMMA", t) is not None
                                                        for t in b) == 8), key=len)
    ffma = sum(re.match(r"(?:@!?U?P\w+\s+)?FFMA", t) is not None for t in body)
    assert ffma == 2 * 64  # scratch x (scale_a x scale_b) into the gate's and the up's fp32 accumulators
    assert len(body) - ffma <= 140  # the wait, the descriptors, three scales, the release


def test_the_configurations_name_their_instances_and_refuse_what_the_kernel_cannot_do():
    assert SWIGLU["k8/swiglu-bm128"].kernel_name == "k8_fp8_swiglu<4, 1, 0>"
    assert SWIGLU["k8/swiglu-e4m3-bm128"].kernel_name == "k8_fp8_swiglu<4, 0, 3>"
    assert SWIGLU["k8/swiglu-e4m3-pairs-bm128"].kernel_name == "k8_fp8_swiglu<4, 0, 3, false>"
    assert re.search(r"template <int STAGES, int STAGING_BOXES, int OUT, bool QUAD_STORE = true>\s*__global__ void "
                     r"__launch_bounds__\(3 \* sm90::WARPGROUP, 1\) k8_fp8_swiglu\(K8_PARAMS, float\* __restrict__ "
                     r"scale_c\)", SOURCE)
    for config in SWIGLU.values():  # the stage holds A's 16 KB and two 16 KB boxes of B^T
        assert config.stage_bytes == 3 * 128 * 128 and config.b_blocks == 2
    assert SWIGLU["k8/swiglu-e4m3-bm128"].dynamic_smem_bytes == 4 * 49152 + 1024  # no staging boxes
    assert "swiglu" in SWIGLU["k8/swiglu-bm128"].label
    for changes, message in ((dict(scaling="rowwise"), "blockwise layer"), (dict(bm=256), "128-row tiles"),
                             (dict(out="fp32"), "writes bf16 or e4m3"),
                             (dict(out="e4m3", staging_boxes=1), "staging_boxes=0"),
                             (dict(epilogue="gelu"), "store or swiglu"), (dict(quad_store=False), "out='e4m3'")):
        with pytest.raises(ValueError, match=message):
            K8Config("blockwise", True, 128, stages=4, epilogue="swiglu").replace(**changes)
    with pytest.raises(ValueError, match="writes bf16 or fp32"):
        K8Config("blockwise", True, 128, stages=6, out="e4m3")


def test_the_refusals_ask_for_i_a_multiple_of_128():
    assert refusals(8, 4096, 2 * 14336, epilogue="swiglu") == []
    reasons = refusals(8, 4096, 2 * 200, epilogue="swiglu")
    assert len(reasons) == 1 and "I a multiple of 128" in reasons[0]
    assert refusals(8, 4096, 2 * 200) == []  # the plain GEMM takes it


@pytest.mark.parametrize("name", list(SWIGLU))
def test_the_arguments_are_k8_params_then_the_activations_scales(name):
    config = SWIGLU[name]
    args = swiglu_arguments(config, 0x10000, 0x20000, 0x30000, 0x40000, 0x50000, 0x60004, 0x70000, 1001, 8, 7168,
                            4096)
    macro = re.search(r"#define K8_PARAMS(.*?)\n\n", SOURCE, re.S).group(1)
    params = re.sub(r"/\*.*?\*/|\\", " ", macro).split(",")
    assert len(args) == len(params) + 1 and args[-1] == 0x70000
    a_map, b_map, c_map = args[:3]
    assert all(isinstance(m, TiledMap) for m in (a_map, b_map, c_map))
    assert a_map.box == (128, 128) and b_map.dims == (7168, 4096, 8)  # B^T: all of [W_gate | W_up]^T
    assert c_map.dims == (2048, 1001)  # the activation [M_tot, I]
    assert c_map.element_bytes == (1 if config.out == "e4m3" else 2)
    assert int(args[-2]) == 4096  # N: B^T's rows, 2I


def test_both_kernels_quantize_by_the_one_scale_rule():
    """The separate pass and the epilogue read the scale rule from one header, as the numpy reference states it."""
    rule = (KERNELS / "e4m3.cuh").read_text()
    assert "amax == 0.0f ? 1.0f : fmaxf(__fdiv_rn(amax, MAX), FLT_MIN_NORMAL)" in rule
    for source in ("k8_fp8.cu", "k8_quantize.cu"):
        text = (KERNELS / source).read_text()
        assert '#include "e4m3.cuh"' in text and "e4m3::scale_of(amax)" in text
        assert not re.search(r"\b448\.0f|__fdiv_rn\(amax", re.sub(r"//.*", "", text))  # no second copy of the rule


# --------------------------------------------------------------------------- the op, on the CPU

torch_needed = pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"), reason="needs torch")


def _operands(tokens: int, experts: int, K: int, inter: int, seed: int = 0):
    import torch

    from moe_gemm.torch.quantize import quantize_1x128, quantize_128x128_t

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, K, generator=g).to(torch.bfloat16)
    w = (torch.randn(experts, K, 2 * inter, generator=g) * K**-0.5).to(torch.bfloat16)
    (qa, sa), (qb, sb) = quantize_1x128(x), quantize_128x128_t(w)
    return qa, qb.transpose(1, 2), sa, sb


@torch_needed
def test_the_op_on_the_cpu_is_the_product_then_the_separate_pass(monkeypatch):
    import torch

    from moe_gemm.torch import scaled
    from moe_gemm.torch.quantize import swiglu_quantize_1x128
    from moe_gemm.torch.scaled import scaled_grouped_mm, swiglu_scaled_grouped_mm
    from moe_gemm.torch.swiglu import swiglu

    a, b, sa, sb = _operands(300, 3, 256, 128)
    offs = torch.tensor([100, 100, 300], dtype=torch.int32)
    monkeypatch.setattr(scaled, "_warned", set())  # each reason warns once per process: earlier tests had theirs
    with pytest.warns(UserWarning, match="swiglu_scaled_grouped_mm runs torch instead: .*not a CUDA GPU"):
        q, scale = swiglu_scaled_grouped_mm(a, b, sa, sb, offs)
    h = scaled_grouped_mm(a, b, sa, sb, offs)
    want_q, want_scale = swiglu_quantize_1x128(h)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(scale, want_scale)
    assert torch.equal(swiglu_scaled_grouped_mm(a, b, sa, sb, offs, quantize=False), swiglu(h))


@torch_needed
def test_the_rules_refuse_what_no_path_takes_and_say_why_the_kernel_cannot():
    import torch

    from moe_gemm.torch.scaled import swiglu_refusal, swiglu_scaled_grouped_mm

    a, b, sa, sb = _operands(64, 2, 128, 200)
    offs = torch.tensor([30, 64], dtype=torch.int32)
    assert "I a multiple of 128" in swiglu_refusal(a, b, sa, sb, offs)
    rowwise = (torch.ones(64), torch.ones(2, 400))
    with pytest.raises(ValueError, match="must be blockwise"):
        swiglu_scaled_grouped_mm(a, b, *rowwise, offs)
    a2, b2, sa2, sb2 = _operands(64, 2, 128, 4)  # 2I = 8: halves of 4, not whole 16-byte pieces
    with pytest.raises(ValueError, match="I a multiple of 8"):
        swiglu_scaled_grouped_mm(a2, b2, sa2, sb2, offs)
    with pytest.raises(ValueError, match="offs must be int32"):
        swiglu_scaled_grouped_mm(a, b, sa, sb, offs.long())
    with pytest.raises(ValueError, match="float8_e4m3fn"):  # bf16 tokens passed where their e4m3 values belong
        swiglu_scaled_grouped_mm(a.float().to(torch.bfloat16), b, sa, sb, offs)
    with pytest.raises(ValueError, match="blockwise scales must be"):  # the scales of another GEMM
        swiglu_scaled_grouped_mm(a, b, sa, sb[:, :1], offs)
    empty_q, empty_scale = swiglu_scaled_grouped_mm(a[:0], b, sa[:, :0], sb, torch.zeros(2, dtype=torch.int32))
    assert empty_q.shape == (0, 200) and empty_scale.shape[1] == 0


@torch_needed
def test_a_configuration_that_writes_the_other_output_is_refused_before_any_launch():
    """fused_swiglu(quantize=...) takes only the SwiGLU configurations that write what it returns: a ValueError
    naming them, before any tensor is touched (so on the CPU too)."""
    from moe_gemm.torch.scaled import fused_swiglu

    a = b = scale = offs = None  # never read: the refusal comes first
    with pytest.raises(ValueError, match="k8/swiglu-e4m3-bm128, k8/swiglu-e4m3-pairs-bm128"):
        fused_swiglu(a, b, scale, scale, offs, quantize=True, config="k8/swiglu-bm128")
    with pytest.raises(ValueError, match="k8/swiglu-bm128, got 'k8/swiglu-e4m3-bm128'"):
        fused_swiglu(a, b, scale, scale, offs, quantize=False, config="k8/swiglu-e4m3-bm128")
    with pytest.raises(ValueError, match="got 'k8/blockwise-bm128'"):
        fused_swiglu(a, b, scale, scale, offs, config="k8/blockwise-bm128")


@torch_needed
def test_the_op_launches_the_kernel_only_once_it_has_run():
    from moe_gemm.torch import kernels
    from moe_gemm.torch.scaled import swiglu_has_run

    assert swiglu_has_run() == (kernels.FP8_SWIGLU_PENDING not in kernels.NOT_YET_RUN)
    assert set(kernels.FP8_SWIGLU_RECORDS) == set(SWIGLU)
    assert all(r.startswith(kernels.FP8_SWIGLU_PENDING + "-") for r in kernels.FP8_SWIGLU_RECORDS.values())


def test_the_validation_record_names_both_kernels_and_holds_them_back_while_pending():
    from moe_gemm.measure.validation import OTHER_KERNELS, not_yet_run
    from moe_gemm.torch.kernels import FP8_SWIGLU_PENDING, FP8_SWIGLU_RECORDS, NOT_YET_RUN

    for config, record in FP8_SWIGLU_RECORDS.items():
        assert OTHER_KERNELS[record] == ("k8_fp8.cu", SWIGLU[config].kernel_name)
        assert not_yet_run(record) == (FP8_SWIGLU_PENDING in NOT_YET_RUN)
    assert not not_yet_run("k8/swiglu-quantize-1x128")  # the separate pass is another kernel
    assert np.all([isinstance(k, str) for k in OTHER_KERNELS])


@torch_needed
@pytest.mark.parametrize("quantize", [True, False])
def test_the_launch_takes_its_pointers_in_the_kernels_order(monkeypatch, quantize):
    """fused_swiglu's glue without a GPU: the runner is built for the configuration, GPU and shape, and called on
    (a, b, scale_a, scale_b, act, offs, act's scales or None), the order swiglu_arguments reads them in; what
    comes back is the activation [M_tot, I] (e4m3 and its [I / 128, M_pad] scales of ones until written, or
    bf16)."""
    import torch

    from moe_gemm.torch import scaled

    calls = []
    monkeypatch.setattr(scaled, "_swiglu_runner", lambda *key: lambda *tensors: calls.append((key, tensors)))
    a, b, sa, sb = _operands(301, 3, 256, 128)
    offs = torch.tensor([100, 100, 301], dtype=torch.int32)
    out = scaled.fused_swiglu(a, b, sa, sb, offs, quantize)
    ((key, tensors),) = calls
    assert key == (scaled.SWIGLU_CONFIGS[quantize], a.device.index, 301, 3, 256, 256)
    act = out[0] if quantize else out
    assert tensors[:4] == (a, b, sa, sb) and tensors[4] is act and torch.equal(tensors[5], offs)
    if quantize:
        assert act.dtype == torch.float8_e4m3fn and act.shape == (301, 128)
        assert tensors[6] is out[1] and out[1].shape == (1, 304) and bool((out[1] == 1).all())
    else:
        assert act.dtype == torch.bfloat16 and act.shape == (301, 128) and tensors[6] is None
    calls.clear()
    scaled.fused_swiglu(a[:0], b, sa[:, :0], sb, torch.zeros(3, dtype=torch.int32), quantize)
    assert not calls  # no rows: no launch (a tensor map cannot describe 0 rows)
