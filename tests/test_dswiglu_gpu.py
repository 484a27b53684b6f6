"""SwiGLU's backward fused into the dA GEMM on an sm_90a GPU (k6's "dswiglu" epilogue, launched directly by
moe_gemm.torch.fused_backward.fused): dh and the activation against the same formulas in fp32 on the fp32
product, on random data and on the forward's edge cases, graph replays with changing routings, and
compute-sanitizer memcheck. These are the tests that admit the kernel to the op (moe_gemm.torch.kernels.
NOT_YET_RUN). Skipped without torch or the GPU; the CPU side is tests/test_dswiglu.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

from moe_gemm.measure.validation import admitting  # noqa: E402
from moe_gemm.torch.fused_backward import fused, has_run  # noqa: E402
from moe_gemm.variants.k6.config import FUSED_BACKWARD  # noqa: E402


@pytest.fixture(params=list(FUSED_BACKWARD))
def config(request) -> str:
    """Each fused configuration: h loaded by the epilogue, or prefetched by TMA; one not yet admitted skips."""
    if not has_run(request.param) and not admitting():  # run by `validation run torch --admit`
        pytest.skip(f"{request.param} is built, not yet run on a GPU (moe_gemm.torch.kernels.NOT_YET_RUN)")
    return request.param


def reference(dy: torch.Tensor, w_down: torch.Tensor, offs: torch.Tensor,
              preact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dh and act in fp32: dact expert by expert in fp32, then the SwiGLU's derivative, for rows up to offs[-1]."""
    rows = int(offs[-1])
    dact, start = torch.empty(rows, w_down.shape[1], device=dy.device), 0
    for e, end in enumerate(offs.tolist()):
        dact[start:end] = dy[start:end].float() @ w_down[e].float().t()
        start = end
    gate, up = preact[:rows].float().chunk(2, dim=-1)
    s = torch.sigmoid(gate)
    dh = torch.cat([dact * up * s * (1 + gate * (1 - s)), dact * gate * s], dim=-1)
    return dh, gate * s * up


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).norm() / want.norm().clamp_min(1e-30)).item()


# The forward's edge cases that matter to this epilogue: experts with no rows, ends in the middle of an m64
# slice and of a 128-row tile, one expert holding every row, a single expert, rows past offs[-1], I not a
# multiple of the 128-column tile (the column guard), the smallest H (one k-step).
CASES = {
    "ragged, empty experts": ((0, 70, 1, 129, 300, 0), 256, 384),
    "one expert holds every row": ((0, 0, 1000, 0), 512, 256),
    "E = 1": ((777,), 128, 128),
    "rows past the last end": ((64, 64, 100), 256, 256),
    "I not a multiple of 128": ((200, 56, 333), 256, 200),
    "one k-step": ((130, 7), 64, 128),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_dh_and_the_activation_match_fp32(cuda, config, case, dtype):
    counts, hidden, inter = CASES[case]
    extra = 19 if case == "rows past the last end" else 0
    torch.manual_seed(len(case))
    rows = sum(counts) + extra
    dy = torch.randn(rows, hidden, device=cuda).to(dtype)
    w_down = (torch.randn(len(counts), inter, hidden, device=cuda) * hidden**-0.5).to(dtype)
    preact = (3 * torch.randn(rows, 2 * inter, device=cuda)).to(dtype)
    offs = torch.tensor(counts, device=cuda).cumsum(0).to(torch.int32)
    dh, act = fused(dy, w_down, offs, preact, config)
    want_dh, want_act = reference(dy, w_down, offs, preact)
    ends = int(offs[-1])
    assert dh.dtype == act.dtype == dtype and torch.isfinite(dh[:ends]).all() and torch.isfinite(act[:ends]).all()
    assert relative(dh[:ends], want_dh) < 1e-2  # one 16-bit rounding of each output from fp32
    assert relative(act[:ends], want_act) < 1e-2


def test_many_tiles_per_block_each_with_its_own_h(cuda, config):
    """About eight tiles per block (1,024 over the GPU's blocks), so each warpgroup's epilogue runs several times
    and the prefetched h's buffer and barriers go round their phases: every tile's h, none of its neighbour's."""
    torch.manual_seed(5)
    counts, hidden, inter = (2048,) * 8, 256, 1024
    rows = sum(counts)
    dy = torch.randn(rows, hidden, device=cuda).to(torch.bfloat16)
    w_down = (torch.randn(len(counts), inter, hidden, device=cuda) * hidden**-0.5).to(torch.bfloat16)
    preact = (3 * torch.randn(rows, 2 * inter, device=cuda)).to(torch.bfloat16)
    offs = torch.tensor(counts, device=cuda).cumsum(0).to(torch.int32)
    dh, act = fused(dy, w_down, offs, preact, config)
    want_dh, want_act = reference(dy, w_down, offs, preact)
    assert relative(dh, want_dh) < 1e-2 and relative(act, want_act) < 1e-2


def test_one_graph_replayed_with_changing_routings(cuda, config, graph_replays):
    """Captured once, replayed after writing other expert ends into the same offs: the device walk reads them
    on every replay."""
    torch.manual_seed(3)
    dy = torch.randn(900, 256, device=cuda).to(torch.bfloat16)
    w_down = (torch.randn(4, 256, 256, device=cuda) / 16).to(torch.bfloat16)
    preact = torch.randn(900, 512, device=cuda).to(torch.bfloat16)
    offs = torch.tensor([200, 400, 600, 900], dtype=torch.int32, device=cuda)
    for ends, (dh, act) in graph_replays(lambda: fused(dy, w_down, offs, preact, config), offs):
        want_dh, want_act = reference(dy, w_down, offs, preact)
        assert relative(dh, want_dh) < 1e-2 and relative(act, want_act) < 1e-2, ends


def test_the_fused_backward_is_clean_under_memcheck(cuda, config, sanitize):
    """compute-sanitizer memcheck on the fused kernel alone, with ragged experts, rows past the last end and
    I not a multiple of the tile: no access may leave dy, W_down, h, dh or the activation."""
    script = ("import torch\nfrom moe_gemm.torch.fused_backward import fused\n"
              "dy = torch.randn(700, 256, device='cuda').to(torch.bfloat16)\n"
              "w = torch.randn(5, 200, 256, device='cuda').to(torch.bfloat16)\n"
              "h = torch.randn(700, 400, device='cuda').to(torch.bfloat16)\n"
              "offs = torch.tensor([0, 70, 71, 200, 650], dtype=torch.int32, device='cuda')\n"
              f"fused(dy, w, offs, h, {config!r}); torch.cuda.synchronize(); print('fused')\n")
    sanitize(script, "k6_persistent_dswiglu", "fused")
