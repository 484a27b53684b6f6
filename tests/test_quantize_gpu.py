"""Chapter 10's quantizers on the GPU (kernels/k8_quantize.cu) against the numpy reference, bit for bit (the
SwiGLU one up to the last bit of exp): random rows at DeepSeek-V3's K = 7,168, a partial last group (K = 200),
an all-zero group (scale 1), a group with one large value (every other element rounds to zero or a subnormal),
values whose amax / 448 falls below fp32's smallest normal number (the scale's floor), groups from 2^-130 to
2^120 with -0s and subnormals among them, one row, no rows; and
compute-sanitizer memcheck. Skipped without torch or a GPU of compute capability 8.9 or newer."""

from __future__ import annotations

import pytest

from moe_gemm.torch.kernels import QUANTIZE_STEPS, QUANTIZE_WEIGHTS_STEPS

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def fp8_gpu():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs a GPU with e4m3 conversion (compute capability 8.9 or newer)")
    return torch.device("cuda")


def cases():
    g = torch.Generator().manual_seed(0)
    random = torch.randn(300, 7168, generator=g) * 5
    partial = torch.randn(7, 200, generator=g)
    zero_group = torch.randn(4, 384, generator=g)
    zero_group[1, 128:256] = 0
    one_large = torch.randn(4, 256, generator=g) * 1e-3
    one_large[2, 5] = 3e4
    tiny = torch.full((2, 128), 1e-38)
    # every group at its own magnitude, 2^-130 to 2^120, so that scales fall on both sides of the range in which
    # the kernel divides from the group's reciprocal (e4m3.cuh, Divisor: [2^-90, 2^120]); -0s and bf16 subnormals
    # among them (the division's corner cases: a sign the correction would lose, operands __fdiv_rn's range check
    # sends to its slow path)
    magnitudes = torch.exp2(torch.randint(-130, 121, (64, 8), generator=g).float()).repeat_interleave(128, dim=1)
    wide = torch.randn(64, 1024, generator=g) * magnitudes
    wide[::3, ::7] = -0.0
    wide[5, 128:256] = torch.randn(128, generator=g) * 1e-39
    return {"random": random, "partial": partial, "zero group": zero_group, "one large": one_large, "tiny": tiny,
            "wide magnitudes": wide, "one row": random[:1], "no rows": random[:0]}


@pytest.mark.parametrize("name", list(cases()))
def test_the_kernel_gives_the_references_bits(fp8_gpu, name):
    from moe_gemm.torch.quantize import quantize_1x128, reference

    x = cases()[name].to(torch.bfloat16)
    q, scale = quantize_1x128(x.to(fp8_gpu))
    want_q, want_scale = reference(x)
    assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8)), name
    M = x.shape[0]
    assert torch.equal(scale.cpu()[:, :M], want_scale[:, :M]), name


@pytest.mark.parametrize("step", sorted(QUANTIZE_STEPS))
@pytest.mark.parametrize("name", ["random", "partial", "wide magnitudes", "one row"])
def test_each_earlier_step_of_the_kernel_gives_the_references_bits(fp8_gpu, step, name):
    """The steps chapter 10 times before the op's kernel (one piece a thread, __fdiv_rn on every value, and each
    change alone) compute the same bits."""
    from moe_gemm.torch.quantize import quantize_1x128_step, reference

    x = cases()[name].to(torch.bfloat16)
    q, scale = quantize_1x128_step(x.to(fp8_gpu), step)
    want_q, want_scale = reference(x)
    assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8)), name
    assert torch.equal(scale.cpu()[:, :x.shape[0]], want_scale[:, :x.shape[0]]), name


@pytest.mark.parametrize("step", ["now", *sorted(QUANTIZE_WEIGHTS_STEPS)])
@pytest.mark.parametrize("experts, K, N", [(2, 7168, 2048), (1, 144, 200), (3, 16, 8), (1, 176, 136)])
def test_the_weights_kernel_gives_the_references_bits(fp8_gpu, experts, K, N, step):
    """Full blocks at DeepSeek-V3's down projection's K and N, partial ones along both axes (K = 144 and 176: a
    last block of one and of three 16-byte pieces a row, where each store pattern stops at a different thread), a
    block smaller than one 16-byte store's worth of rows; one expert's block made all zeros, one holding a large
    value. The op's kernel and each earlier step that chapter 10 times."""
    from moe_gemm.torch.quantize import quantize_128x128_t, quantize_128x128_t_step, weights_reference

    b = torch.randn(experts, K, N, generator=torch.Generator().manual_seed(2)) * 0.02
    b[0, :128, :128] = 0
    b[-1, 3, 5] = 40.0
    b = b.to(torch.bfloat16)
    q, scale = (quantize_128x128_t(b.to(fp8_gpu)) if step == "now" else
                quantize_128x128_t_step(b.to(fp8_gpu), step))
    want_q, want_scale = weights_reference(b)
    assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scale.cpu(), want_scale)


@pytest.mark.parametrize("M, width", [(300, 2048), (7, 200), (1, 8), (0, 128)])
def test_the_swiglu_kernel_matches_the_reference_up_to_the_last_bit_of_exp(fp8_gpu, M, width):
    """silu(gate) x up quantized: the GPU's expf and numpy's exp may differ in the last bit of fp32, so an
    activation next to an e4m3 rounding boundary may round the other way: at most one e4m3 step apart, in
    under 0.1% of the values; every scale within one fp32 step of the reference's."""
    from moe_gemm.torch.quantize import swiglu_quantize_1x128, swiglu_reference

    h = (torch.randn(M, 2 * width, generator=torch.Generator().manual_seed(3)) * 4).to(torch.bfloat16)
    q, scale = swiglu_quantize_1x128(h.to(fp8_gpu))
    want_q, want_scale = swiglu_reference(h)
    got, want = q.cpu().view(torch.uint8).int(), want_q.view(torch.uint8).int()
    assert got.shape == want.shape == (M, width)
    differ = got != want
    assert int(differ.sum()) <= max(1, got.numel() // 1000), int(differ.sum())
    assert torch.all((got[differ] - want[differ]).abs() == 1)  # same sign, neighbouring codes
    assert torch.allclose(scale.cpu()[:, :M], want_scale[:, :M], rtol=2.0**-23, atol=0)


def test_the_kernel_is_clean_under_memcheck(fp8_gpu, sanitize):
    script = ("import torch\nfrom moe_gemm.torch.quantize import QUANTIZE_STEPS, quantize_1x128, quantize_1x128_step\n"
              "from moe_gemm.torch.quantize import quantize_128x128_t, swiglu_quantize_1x128\n"
              "for M, K in ((300, 7168), (7, 200), (1, 8), (33, 136)):\n"
              "    quantize_1x128(torch.randn(M, K, device='cuda').to(torch.bfloat16))\n"
              "    for step in QUANTIZE_STEPS:\n"
              "        quantize_1x128_step(torch.randn(M, K, device='cuda').to(torch.bfloat16), step)\n"
              "for M, I in ((300, 2048), (7, 200), (1, 8)):\n"
              "    swiglu_quantize_1x128(torch.randn(M, 2 * I, device='cuda').to(torch.bfloat16))\n"
              "from moe_gemm.torch.quantize import QUANTIZE_WEIGHTS_STEPS, quantize_128x128_t_step\n"
              "for E, K, N in ((2, 256, 384), (1, 144, 200), (1, 176, 136)):\n"
              "    quantize_128x128_t(torch.randn(E, K, N, device='cuda').to(torch.bfloat16))\n"
              "    for step in QUANTIZE_WEIGHTS_STEPS:\n"
              "        quantize_128x128_t_step(torch.randn(E, K, N, device='cuda').to(torch.bfloat16), step)\n"
              "torch.cuda.synchronize(); print('quantized')\n")
    sanitize(script, "quantize_", "quantized")
