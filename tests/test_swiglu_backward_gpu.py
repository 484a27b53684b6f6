"""SwiGLU's backward as one pass on an sm_90a GPU (kernels/swiglu_backward.cu, moe_gemm.torch.swiglu.dswiglu_pass):
dh and the activation against the same formulas in fp32, in bf16 and fp16, at sizes that leave part of the last
block idle and that make the grid stride; the same numbers as the fused kernel's epilogue; a CUDA-graph replay;
compute-sanitizer memcheck. These are the tests that admit the kernel to the layer (moe_gemm.torch.kernels.
NOT_YET_RUN). Skipped without torch or the GPU; the CPU side is tests/test_swiglu_backward.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

from moe_gemm.measure.layer import relative_error as relative  # noqa: E402
from moe_gemm.measure.validation import admitting  # noqa: E402
from moe_gemm.torch.kernels import NOT_YET_RUN, SWIGLU_BACKWARD_PENDING  # noqa: E402
from moe_gemm.torch.swiglu import dswiglu_pass, dswiglu_torch  # noqa: E402


@pytest.fixture(scope="module")
def gpu(cuda):
    """The sm_90a GPU (conftest's ``cuda``), once the kernel has run or while `validation run torch --admit` runs
    it."""
    if SWIGLU_BACKWARD_PENDING in NOT_YET_RUN and not admitting():
        pytest.skip("SwiGLU's backward as one pass is built, not yet run on a GPU (moe_gemm.torch.kernels.NOT_YET_RUN)")
    return cuda


def reference(dact: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dh and act in fp32 from the 16-bit inputs."""
    gate, up = h.float().chunk(2, dim=-1)
    d = dact.float()
    s = torch.sigmoid(gate)
    return torch.cat([d * up * s * (1 + gate * (1 - s)), d * gate * s], dim=-1), gate * s * up


# (M, I): one row of one piece; a last block partly idle; I not a multiple of the 256 threads' 2,048 columns;
# more pieces than the grid's threads, so that every thread strides; no rows.
SHAPES = {"one piece": (1, 8), "a partial block": (37, 40), "odd widths": (1000, 200),
          "the grid strides": (65536, 768), "no rows": (0, 64)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_dh_and_the_activation_match_fp32(gpu, shape, dtype):
    rows, inter = SHAPES[shape]
    torch.manual_seed(rows + inter)
    dact = torch.randn(rows, inter, device=gpu).to(dtype)
    h = (3 * torch.randn(rows, 2 * inter, device=gpu)).to(dtype)
    dh, act = dswiglu_pass(dact, h)
    assert dh.shape == h.shape and act.shape == dact.shape and dh.dtype == act.dtype == dtype
    if rows:
        want_dh, want_act = reference(dact, h)
        assert torch.isfinite(dh).all() and torch.isfinite(act).all()
        assert relative(dh, want_dh) < 1e-2 and relative(act, want_act) < 1e-2  # one 16-bit rounding from fp32
        # against torch's operations, which round their intermediates: the same outputs within those roundings
        torch_dh, torch_act = dswiglu_torch(dact, h)
        assert relative(dh, torch_dh) < 2e-2 and relative(act, torch_act) < 2e-2


def test_the_pass_and_the_fused_epilogue_compute_the_same_numbers(gpu):
    """The pass on the dA GEMM's output against k6's fused epilogue on the same GEMM: both compute each element by
    epilogues.cuh's dswiglu_pair from the same dact (the pass from it rounded to bf16, the epilogue from the
    fp32 accumulators), so they differ by that rounding only."""
    from moe_gemm.torch.fused_backward import fused
    from moe_gemm.torch.ops import grouped_mm

    torch.manual_seed(11)
    dy = torch.randn(900, 256, device=gpu).to(torch.bfloat16)
    w_down = (torch.randn(4, 256, 256, device=gpu) / 16).to(torch.bfloat16)
    h = torch.randn(900, 512, device=gpu).to(torch.bfloat16)
    offs = torch.tensor([200, 400, 600, 900], dtype=torch.int32, device=gpu)
    dh, act = dswiglu_pass(grouped_mm(dy, w_down.transpose(1, 2), offs).contiguous(), h)
    fused_dh, fused_act = fused(dy, w_down, offs, h)
    assert relative(dh, fused_dh) < 1e-2 and torch.equal(act, fused_act)  # act does not read dact


def test_one_graph_replayed_with_new_values(gpu):
    """Captured once, replayed after new values are written into the same inputs."""
    dact = torch.randn(333, 96, device=gpu).to(torch.bfloat16)
    h = torch.randn(333, 192, device=gpu).to(torch.bfloat16)
    dswiglu_pass(dact, h)  # compiled and loaded outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dh, act = dswiglu_pass(dact, h)
    for seed in (1, 2):
        torch.manual_seed(seed)
        dact.copy_(torch.randn_like(dact, dtype=torch.float32))
        h.copy_(torch.randn_like(h, dtype=torch.float32))
        graph.replay()
        torch.cuda.synchronize()
        want_dh, want_act = reference(dact, h)
        assert relative(dh, want_dh) < 1e-2 and relative(act, want_act) < 1e-2, seed


def test_wrong_inputs_are_refused_before_any_launch(gpu):
    dact = torch.randn(16, 64, device=gpu).to(torch.bfloat16)
    h = torch.randn(16, 128, device=gpu).to(torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 8"):
        dswiglu_pass(dact[:, :60].contiguous(), h[:, :120].contiguous())
    with pytest.raises(ValueError, match="contiguous"):
        dswiglu_pass(dact.t().contiguous().t(), h)
    with pytest.raises(ValueError, match="both be bf16"):
        dswiglu_pass(dact, h.half())
    with pytest.raises(ValueError, match=r"\[M, 2I\]"):
        dswiglu_pass(dact, h[:, :64])


def test_the_pass_is_clean_under_memcheck(gpu, sanitize):
    """compute-sanitizer memcheck on the pass alone, with a partial last block and a striding grid: no access may
    leave dact, h, dh or the activation."""
    script = ("import torch\nfrom moe_gemm.torch.swiglu import dswiglu_pass\n"
              "for rows, inter in ((37, 40), (20000, 776)):\n"
              "    dact = torch.randn(rows, inter, device='cuda').to(torch.bfloat16)\n"
              "    h = torch.randn(rows, 2 * inter, device='cuda').to(torch.bfloat16)\n"
              "    dswiglu_pass(dact, h)\n"
              "torch.cuda.synchronize(); print('passed through')\n")
    sanitize(script, "swiglu_backward", "passed through")
