"""k8's SwiGLU epilogue on an sm_90a GPU (moe_gemm.torch.scaled.fused_swiglu, launched directly): the activation
in e4m3 with its 1 x 128 scales against the numpy reference's quantization of silu(gate) x up computed from the
fp32 product of the dequantized inputs, and in bf16 against that activation; on random data and the forward's
edge cases, many tiles per block, graph replays with changing routings, and compute-sanitizer memcheck. These
are the tests that admit the kernel to the op and the FP8 layer (moe_gemm.torch.kernels.NOT_YET_RUN). Skipped
without torch or the GPU; the CPU side is tests/test_k8_swiglu.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

from moe_gemm.measure.layer import relative_error as relative  # noqa: E402
from moe_gemm.measure.validation import admitting  # noqa: E402
from moe_gemm.torch.scaled import fused_swiglu, swiglu_has_run  # noqa: E402
from moe_gemm.variants.k8.config import SWIGLU  # noqa: E402

# The e4m3 outputs: the op's (the quad's bytes transposed, then stored 8 at a time) and the first version's (pairs)
E4M3_CONFIGS = [name for name, config in SWIGLU.items() if config.out == "e4m3"]


@pytest.fixture(scope="module")
def gpu(cuda):
    """The sm_90a GPU (conftest's ``cuda``), once the kernel has run or while `validation run k8 --admit` runs it."""
    if not swiglu_has_run() and not admitting():
        pytest.skip("k8's SwiGLU epilogue is built, not yet run on a GPU (moe_gemm.torch.kernels.NOT_YET_RUN)")
    return cuda


def operands(ends, experts: int, K: int, inter: int, device, seed: int = 0, tokens: int | None = None):
    """e4m3 tokens and [W_gate | W_up] from the quantizers, as the FP8 layer makes them; gate values spread over
    silu's curve (x 3) so that both its tails are exercised."""
    from moe_gemm.torch.quantize import quantize_1x128, quantize_128x128_t

    tokens = ends[-1] if tokens is None else tokens
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, K, generator=g) * 3).to(torch.bfloat16).to(device)
    w = (torch.randn(experts, K, 2 * inter, generator=g) * K**-0.5).to(torch.bfloat16).to(device)
    (qa, sa), (qb, sb) = quantize_1x128(x), quantize_128x128_t(w)
    return qa, qb.transpose(1, 2), sa, sb, torch.tensor(ends, dtype=torch.int32, device=device)


def reference(a, b, sa, sb, offs):
    """(q, scale) of the numpy reference and act in fp32, for rows up to offs[-1]: the fp32 product of the
    dequantized inputs, silu(gate) x up in fp32, then the 1 x 128 quantization."""
    from moe_gemm.torch.quantize import swiglu_reference
    from moe_gemm.torch.scaled import reference as product

    rows = int(offs[-1])
    h = product(a, b, sa, sb, offs, torch.float32)[:rows]
    gate, up = h.chunk(2, dim=-1)
    q, scale = swiglu_reference(h)
    return q, scale, gate * torch.sigmoid(gate) * up


# The FP8 GEMM's own error, as a share of a 1 x 128 group's largest value (448 once scaled): its sums keep about
# 14 bits inside a 128-deep block, where the reference sums in fp32. Seen on an H100 at K = 256: up to 1.8e-4 (an
# activation of -0.0045 in a group whose largest is 24 written as -0.0002), several codes for a small value.
GEMM_ERROR = 1e-3


def e4m3_step(v: torch.Tensor) -> torch.Tensor:
    """The spacing of e4m3 values at magnitude v: 2^(e - 3) for a normal value of exponent e, 2^-9 for the
    subnormals below 2^-6. Neighbouring codes differ by at most the larger one's step, also across zero (a value
    whose sign the two sums disagree on rounds to 0x01 in one and 0x81 in the other)."""
    return torch.exp2(torch.floor(torch.log2(v.clamp(min=2.0**-6))) - 3)


def assert_quantized_alike(q, scale, a, b, sa, sb, offs):
    """The kernel's sums are not the reference's, so an activation may round to another e4m3 value, a small one by
    several codes: each value within one e4m3 step of the reference's plus GEMM_ERROR of its group's largest; the
    dequantized activation as close to the fp32 one as the reference's own quantization is (within 10%); every
    scale within 1e-3 of the reference's."""
    want_q, want_scale, act = reference(a, b, sa, sb, offs)
    rows = want_q.shape[0]
    got, want = q[:rows].cpu().float(), want_q.cpu().float()
    assert torch.all((got - want).abs() <= e4m3_step(torch.maximum(got.abs(), want.abs())) + GEMM_ERROR * 448)
    assert torch.allclose(scale[:, :rows].cpu(), want_scale[:, :rows].cpu(), rtol=1e-3, atol=0)

    def per_element(s: torch.Tensor) -> torch.Tensor:  # scale[group][row] -> [row, column]
        return s[:, :rows].cpu().T.repeat_interleave(128, dim=1)[:, :got.shape[1]]

    ours, theirs = relative(got * per_element(scale), act.cpu()), relative(want * per_element(want_scale), act.cpu())
    assert ours <= 1.1 * theirs, (ours, theirs)


# The forward's edge cases that matter to this epilogue: experts with no rows, ends in the middle of an m64 slice
# and of a 128-row tile (the row guard), one expert holding every row, a single expert, one row, rows past
# offs[-1], one 128-column tile of the activation, K of one k-block and K ending inside a k-block (TMA's zeros).
CASES = {
    "ragged, empty experts": ((0, 70, 71, 200, 650, 650), 256, 256),
    "one expert holds every row": ((0, 0, 1000, 1000), 512, 128),
    "E = 1": ((777,), 384, 384),
    "one row": ((0, 1), 128, 128),
    "K ends inside a k-block": ((130, 300), 208, 256),
    "one k-step": ((90, 257), 128, 128),
}


@pytest.mark.parametrize("config", E4M3_CONFIGS)
@pytest.mark.parametrize("case", CASES)
def test_the_quantized_activation_matches_the_reference(gpu, case, config):
    ends, K, inter = CASES[case]
    a, b, sa, sb, offs = operands(ends, len(ends), K, inter, gpu)
    q, scale = fused_swiglu(a, b, sa, sb, offs, config=config)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (ends[-1], inter)
    assert_quantized_alike(q, scale, a, b, sa, sb, offs)


@pytest.mark.parametrize("case", CASES)
def test_the_bf16_activation_matches_fp32(gpu, case):
    ends, K, inter = CASES[case]
    a, b, sa, sb, offs = operands(ends, len(ends), K, inter, gpu)
    act = fused_swiglu(a, b, sa, sb, offs, quantize=False)
    _, _, want = reference(a, b, sa, sb, offs)
    assert act.dtype == torch.bfloat16 and relative(act[:ends[-1]], want) < 5e-3


def test_rows_past_the_last_end_are_left_alone(gpu):
    a, b, sa, sb, offs = operands((64, 100), 2, 256, 128, gpu, tokens=300)
    q, scale = fused_swiglu(a, b, sa, sb, offs)
    torch.cuda.synchronize()
    assert_quantized_alike(q, scale, a, b, sa, sb, offs)
    assert torch.all(scale[:, 100:] == 1)  # the scales' rows past offs[-1] keep the allocation's ones


def test_many_tiles_per_block_at_a_real_models_width(gpu):
    """8,192 rows over 8 experts at I = 1,024: 512 tiles, about four per block, so the ring's and the walk's
    phases go round; K = 2,048."""
    ends = tuple(range(1024, 8193, 1024))
    a, b, sa, sb, offs = operands(ends, 8, 2048, 1024, gpu)
    q, scale = fused_swiglu(a, b, sa, sb, offs)
    assert_quantized_alike(q, scale, a, b, sa, sb, offs)
    act = fused_swiglu(a, b, sa, sb, offs, quantize=False)
    assert relative(act, reference(a, b, sa, sb, offs)[2]) < 5e-3


@pytest.mark.parametrize("case", ["ragged, empty experts", "E = 1", "K ends inside a k-block"])
def test_the_quads_transposed_bytes_are_the_pairs_bytes(gpu, case):
    """The two e4m3 stores compute the same values and differ only in which thread stores which bytes: the
    activation and its scales bit for bit alike (every byte of q, so a pair put in the wrong place shows)."""
    ends, K, inter = CASES[case]
    a, b, sa, sb, offs = operands(ends, len(ends), K, inter, gpu)
    (q, scale), (q_pairs, scale_pairs) = (fused_swiglu(a, b, sa, sb, offs, config=c) for c in E4M3_CONFIGS)
    rows = ends[-1]
    assert torch.equal(q[:rows].view(torch.uint8), q_pairs[:rows].view(torch.uint8))
    assert torch.equal(scale[:, :rows], scale_pairs[:, :rows])


def test_one_graph_replayed_with_changing_routings(gpu, graph_replays):
    a, b, sa, sb, offs = operands((0, 500, 501, 900), 4, 256, 256, gpu)
    for _, (q, scale) in graph_replays(lambda: fused_swiglu(a, b, sa, sb, offs), offs):
        assert_quantized_alike(q, scale, a, b, sa, sb, offs)


def test_the_fp8_layer_on_the_fused_epilogue_stays_close_to_the_bf16_layer(gpu, monkeypatch):
    """The FP8 layer with GEMM 1's SwiGLU in the epilogue (forced on while admitting) against the bf16 layer:
    within the 10% the layer with the separate pass keeps (tests/test_scaled.py)."""
    from moe_gemm.torch import scaled
    from moe_gemm.torch.fp8_layer import FP8MoELayer
    from moe_gemm.torch.layer import MoELayer

    launched = []
    monkeypatch.setattr(scaled, "swiglu_has_run", lambda: True)
    monkeypatch.setattr(scaled, "fused_swiglu", lambda *args: launched.append(1) or fused_swiglu(*args))
    torch.manual_seed(0)
    layer = MoELayer(512, 256, 8, 2, device=gpu)
    x = torch.randn(600, 512, device=gpu).to(torch.bfloat16)
    with torch.no_grad():
        want, got = layer(x), FP8MoELayer.from_layer(layer)(x)
    assert launched, "the layer did not take the fused epilogue"
    assert relative(got, want.float()) < 0.1


def test_the_fused_epilogue_is_clean_under_memcheck(gpu, sanitize):
    """compute-sanitizer memcheck on the kernel alone, in each output and e4m3 store, with ragged experts and rows
    past the last end: no access may leave a, B^T, the scales, the activation or its scales."""
    script = ("import torch\nfrom moe_gemm.torch.quantize import quantize_1x128, quantize_128x128_t\n"
              "from moe_gemm.torch.scaled import fused_swiglu\n"
              "x = torch.randn(700, 256, device='cuda').to(torch.bfloat16)\n"
              "w = torch.randn(5, 256, 512, device='cuda').to(torch.bfloat16)\n"
              "(a, sa), (b, sb) = quantize_1x128(x), quantize_128x128_t(w)\n"
              "offs = torch.tensor([0, 70, 71, 200, 650], dtype=torch.int32, device='cuda')\n"
              "fused_swiglu(a, b.transpose(1, 2), sa, sb, offs)\n"
              "fused_swiglu(a, b.transpose(1, 2), sa, sb, offs, config='k8/swiglu-e4m3-pairs-bm128')\n"
              "fused_swiglu(a, b.transpose(1, 2), sa, sb, offs, quantize=False)\n"
              "torch.cuda.synchronize(); print('fused')\n")
    sanitize(script, "k8_fp8_swiglu", "fused")
