"""Chapter 10's activation quantizer without a GPU (moe_gemm.torch.quantize, kernels/k8_quantize.cu): the
kernel compiles for sm_90a without spills and converts with the saturating e4m3 instruction, the CPU path
lays the numpy reference's scales out MN-major with the rows padded to 4, and bad inputs are refused with a
ValueError. The kernel against the reference, bit for bit: tests/test_quantize_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from moe_gemm.torch.kernels import QUANTIZE_STEPS  # noqa: E402
from moe_gemm.torch.quantize import PIECES  # noqa: E402


@pytest.mark.parametrize("pieces, divide_once", [(PIECES, True), *QUANTIZE_STEPS.values()])
def test_the_kernel_compiles_for_sm90a_without_spills_and_saturates(pieces, divide_once):
    """The op's instance and its earlier steps (moe_gemm.torch.kernels.QUANTIZE_STEPS)."""
    from moe_gemm.cuda.nvrtc import compile_kernel
    from moe_gemm.cuda.sass import function_sass, opcode_counts
    from moe_gemm.torch.kernels import QUANTIZE, quantize_instance

    kernel = compile_kernel(QUANTIZE[0], quantize_instance(pieces, divide_once), arch="sm_90a")
    assert kernel.report.spill_store_bytes == 0 and kernel.report.stack_frame_bytes == 0
    sass = function_sass(kernel.sass(), kernel.symbol)  # the module holds the other quantizers too
    counts = opcode_counts(sass, ("LDG.E.128", "STG.E.64", "F2FP.SATFINITE.E4M3", "FMUL"))
    # 16 bytes in, 8 out, per piece, `pieces` a lane; dividing once, each of a piece's 8 quotients starts from one
    # multiply by its group's reciprocal (e4m3.cuh, divide), where __fdiv_rn starts from a reciprocal of its own
    assert counts == {"LDG.E.128": pieces, "STG.E.64": pieces, "F2FP.SATFINITE.E4M3": 4 * pieces,
                      "FMUL": 8 * pieces if divide_once else 0}
    loads = [i for i, line in enumerate(sass.splitlines()) if "LDG.E.128" in line]
    first_shuffle = next(i for i, line in enumerate(sass.splitlines()) if "SHFL.BFLY" in line)
    assert max(loads) < first_shuffle  # every load in flight before the first group's amax


@pytest.mark.parametrize("M, K", [(5, 384), (3, 200), (1, 8), (0, 128)])
def test_the_cpu_path_is_the_reference_laid_out_mn_major(M, K):
    from moe_gemm.model.quantize import padded_rows, quantize
    from moe_gemm.torch.quantize import quantize_1x128

    x = (torch.randn(M, K, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    q, scale = quantize_1x128(x)
    want_q, want_scale = quantize(x.float().numpy(), (1, 128))
    assert q.dtype == torch.float8_e4m3fn and q.shape == (M, K)
    assert scale.shape == (-(-K // 128), padded_rows(M)) and padded_rows(M) % 4 == 0
    assert np.array_equal(q.view(torch.uint8).numpy(), want_q.view(np.uint8))
    assert np.array_equal(scale[:, :M].numpy(), want_scale.T)


@pytest.mark.parametrize("bad, match", [
    (lambda: torch.randn(4, 12).to(torch.bfloat16), "multiple of 8"),
    (lambda: torch.randn(4, 16), "bf16"),
    (lambda: torch.randn(2, 4, 16).to(torch.bfloat16), "2-D"),
    (lambda: torch.randn(16, 8).to(torch.bfloat16).t(), "row-major"),
])
def test_bad_inputs_are_refused(bad, match):
    from moe_gemm.torch.quantize import quantize_1x128

    with pytest.raises(ValueError, match=match):
        quantize_1x128(bad())


def test_more_groups_than_the_kernels_32_bit_index_is_refused_before_any_allocation(monkeypatch):
    """The activation quantizers index groups in 32 bits: a tensor of 2^31 groups or more (512 GiB of bf16) is
    refused with a ValueError before q is allocated or anything is launched (shown here with the limit lowered)."""
    from moe_gemm.torch import quantize

    monkeypatch.setattr(quantize, "MAX_GROUPS", 8)
    with pytest.raises(ValueError, match="groups; the kernel indexes fewer than 2"):
        quantize._launch_1x128("quantize_1x128", torch.zeros(4, 256, dtype=torch.bfloat16), 256)


def test_an_earlier_step_is_refused_for_an_unknown_name_or_off_the_gpu():
    from moe_gemm.torch.quantize import quantize_1x128_step

    x = torch.randn(4, 256).to(torch.bfloat16)
    with pytest.raises(ValueError, match="step must be one of"):
        quantize_1x128_step(x, "k8/quantize-1x128")
    with pytest.raises(ValueError, match="compute capability 8.9"):
        quantize_1x128_step(x, next(iter(QUANTIZE_STEPS)))


def test_the_weights_kernel_compiles_without_spills_in_static_shared_memory():
    from moe_gemm.cuda.nvrtc import compile_kernel
    from moe_gemm.torch.kernels import QUANTIZE_WEIGHTS

    kernel = compile_kernel(*QUANTIZE_WEIGHTS, arch="sm_90a")
    assert kernel.report.spill_store_bytes == 0 and kernel.report.static_smem_bytes <= 48 * 1024
    assert "F2FP.SATFINITE.E4M3" in kernel.sass() and "STG.E.128" in kernel.sass()


def test_the_weights_kernel_writes_its_eight_loads_before_staging_them_where_its_first_version_looped():
    """Chapter 10's reading of the two versions' SASS: the first version's staging loop holds two 16-byte loads
    and sixteen 16-bit shared-memory stores (eight passes as four trips of the loop); with LOADS_FIRST all eight
    loads are straight-line code and each pair of values is staged by one 32-bit store. WHOLE_SECTORS changes
    only the store side: the same loads."""
    from moe_gemm.cuda.nvrtc import compile_kernel
    from moe_gemm.cuda.sass import function_sass, opcode_counts
    from moe_gemm.torch.kernels import QUANTIZE_WEIGHTS, QUANTIZE_WEIGHTS_STEPS, weights_instance

    def counts(name):
        kernel = compile_kernel(QUANTIZE_WEIGHTS[0], name, arch="sm_90a")
        assert kernel.report.spill_store_bytes == 0 and kernel.report.stack_frame_bytes == 0, name
        return opcode_counts(function_sass(kernel.sass(), kernel.symbol),
                             ("LDG.E.128.CONSTANT", "STS.U16", "STS"))  # prefixes: STS counts STS.U16 too

    first = counts(weights_instance(*QUANTIZE_WEIGHTS_STEPS["k8/quantize-128x128-first"]))
    now = counts(QUANTIZE_WEIGHTS[1])
    # the staging stores and one of the warp's maximum
    assert first == {"LDG.E.128.CONSTANT": 2, "STS.U16": 16, "STS": 16 + 1}, first
    assert now == {"LDG.E.128.CONSTANT": 8, "STS.U16": 0, "STS": 32 + 1}, now
    for step, flags in QUANTIZE_WEIGHTS_STEPS.items():
        assert counts(weights_instance(*flags))["LDG.E.128.CONSTANT"] == (8 if flags[0] else 2), step


def test_an_earlier_step_of_the_weights_kernel_is_refused_for_an_unknown_name_or_off_the_gpu():
    from moe_gemm.torch.kernels import QUANTIZE_WEIGHTS_STEPS
    from moe_gemm.torch.quantize import quantize_128x128_t_step

    b = torch.randn(1, 128, 128).to(torch.bfloat16)
    with pytest.raises(ValueError, match="step must be one of"):
        quantize_128x128_t_step(b, "k8/quantize-128x128")
    with pytest.raises(ValueError, match="compute capability 8.9"):
        quantize_128x128_t_step(b, next(iter(QUANTIZE_WEIGHTS_STEPS)))
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_128x128_t_step(torch.randn(1, 12, 8).to(torch.bfloat16), next(iter(QUANTIZE_WEIGHTS_STEPS)))


@pytest.mark.parametrize("experts, K, N", [(2, 256, 384), (1, 144, 200), (3, 16, 8), (0, 128, 128)])
def test_the_weights_cpu_path_is_the_reference_transposed(experts, K, N):
    from moe_gemm.model.quantize import quantize
    from moe_gemm.torch.quantize import quantize_128x128_t

    b = torch.randn(experts, K, N, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q, scale = quantize_128x128_t(b)
    assert q.shape == (experts, N, K) and q.dtype == torch.float8_e4m3fn
    assert scale.shape == (experts, -(-N // 128), -(-K // 128))
    for e in range(experts):
        want_q, want_scale = quantize(b[e].float().numpy(), (128, 128))
        assert np.array_equal(q[e].view(torch.uint8).numpy(), want_q.view(np.uint8).T)
        assert np.array_equal(scale[e].numpy(), want_scale.T)


@pytest.mark.parametrize("shape, match", [((4, 12, 8), "multiple of 16"), ((4, 16, 12), "multiple of 16"),
                                          ((16, 8), "3-D")])
def test_bad_weights_are_refused(shape, match):
    from moe_gemm.torch.quantize import quantize_128x128_t

    with pytest.raises(ValueError, match=match):
        quantize_128x128_t(torch.randn(*shape).to(torch.bfloat16))


def test_the_swiglu_kernel_compiles_with_two_loads_and_one_store_per_piece():
    """GEMM 1's output [gate | up] read once (two 16-byte loads a piece, I columns apart), the activation stored
    as e4m3 only (one 8-byte store a piece): nothing in bf16 is written."""
    from moe_gemm.cuda.nvrtc import compile_kernel
    from moe_gemm.cuda.sass import function_sass, opcode_counts
    from moe_gemm.torch.kernels import SWIGLU_QUANTIZE

    kernel = compile_kernel(*SWIGLU_QUANTIZE, arch="sm_90a")
    assert kernel.report.spill_store_bytes == 0 and kernel.report.stack_frame_bytes == 0
    sass = function_sass(kernel.sass(), kernel.symbol)  # the module holds the other quantizers too
    counts = opcode_counts(sass, ("LDG.E.128", "STG.E.64", "STG.E.128", "F2FP.SATFINITE.E4M3"))
    assert counts == {"LDG.E.128": 2 * PIECES, "STG.E.64": PIECES, "STG.E.128": 0, "F2FP.SATFINITE.E4M3": 4 * PIECES}


@pytest.mark.parametrize("M, width", [(5, 384), (3, 200), (1, 8), (0, 128)])
def test_the_swiglu_cpu_path_quantizes_silu_gate_times_up(M, width):
    """Against torch's silu in fp32: every value within e4m3's rounding of the activation (half a step, 2^-4
    relative, or a subnormal's step), each group's scale its activation's amax / 448."""
    from moe_gemm.model.quantize import padded_rows
    from moe_gemm.torch.quantize import swiglu_quantize_1x128

    h = (torch.randn(M, 2 * width, generator=torch.Generator().manual_seed(1)) * 3).to(torch.bfloat16)
    q, scale = swiglu_quantize_1x128(h)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (M, width)
    assert scale.shape == (-(-width // 128), padded_rows(M))
    gate, up = h.float().chunk(2, dim=1)
    act = torch.nn.functional.silu(gate) * up
    per_element = scale[:, :M].t().repeat_interleave(128, dim=1)[:, :width]
    got = q.float() * per_element
    assert torch.all((got - act).abs() <= act.abs() / 16 + per_element * 2.0**-9 * 1.01)
    if M:
        groups = torch.nn.functional.pad(act.abs(), (0, -width % 128)).view(M, -1, 128).amax(dim=2)
        assert torch.allclose(scale[:, :M].t(), torch.where(groups > 0, groups / 448, 1.0), rtol=1e-6)


@pytest.mark.parametrize("bad, match", [
    (lambda: torch.randn(4, 24).to(torch.bfloat16), "2I = 24 must be a multiple of 16"),
    (lambda: torch.randn(4, 32), "bf16"),
    (lambda: torch.randn(32, 16).to(torch.bfloat16).t(), "row-major"),
])
def test_bad_swiglu_inputs_are_refused(bad, match):
    from moe_gemm.torch.quantize import swiglu_quantize_1x128

    with pytest.raises(ValueError, match=match):
        swiglu_quantize_1x128(bad())
