"""moe_gemm.torch.weight_grad on an sm_90a GPU: k7 through torch against fp64 (exact on integer-valued inputs,
within bf16's rounding on random ones), empty experts, one expert holding every row, rows past offs[-1]; the
accumulate mode (exact, experts with no rows and M_tot = 0 left untouched bit for bit, two runs identical);
the op's backward running k7 with no fallback warning; a CUDA graph replayed with changing routings;
torch.compile; the errors. Skipped without torch or the GPU."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


def routed(counts, K, N, device, seed=0, integer=False, extra_rows=0):
    """a [M_tot, K], dc [M_tot, N] and offs; ``extra_rows`` rows past offs[-1] that no expert owns."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    rows = int(sum(counts)) + extra_rows
    if integer:  # -1, 0, 1: every sum is exact in fp32 and, at these row counts (|dB| < 256), in bf16
        a = torch.randint(-1, 2, (rows, K), generator=generator).float()
        dc = torch.randint(-1, 2, (rows, N), generator=generator).float()
    else:
        a, dc = torch.randn(rows, K, generator=generator), torch.randn(rows, N, generator=generator)
    offs = torch.tensor(np.cumsum(counts), dtype=torch.int32, device=device)
    return a.to(torch.bfloat16).to(device), dc.to(torch.bfloat16).to(device), offs


def fp64(a, dc, offs):
    starts = [0, *offs.tolist()[:-1]]
    return torch.stack([a[s:e].double().t() @ dc[s:e].double() for s, e in zip(starts, offs.tolist())])


def no_fallback():
    """A context in which torch's fallback warning is an error: k7 must be what runs."""
    context = warnings.catch_warnings()
    context.__enter__()
    warnings.filterwarnings("error", message="moe_gemm.torch.weight_grad runs torch")
    return context


CASES = {"skewed, an empty expert": (300, 0, 129, 7), "1-row experts": (1,) * 12, "one expert holds every row":
         (0, 0, 500), "rows on every side of 64": (63, 64, 65, 127, 128, 129, 1, 0, 2)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_exact_on_integer_inputs(cuda, case, out_dtype):
    from moe_gemm.torch import weight_grad

    a, dc, offs = routed(CASES[case], 128, 192, cuda, integer=True, extra_rows=5)
    context = no_fallback()
    db = weight_grad(a, dc, offs, out_dtype)
    context.__exit__(None, None, None)
    assert db.shape == (len(CASES[case]), 128, 192) and db.dtype == out_dtype
    torch.testing.assert_close(db.double(), fp64(a, dc, offs), rtol=0, atol=0)


def test_random_data_at_the_seed_shape(cuda):
    from moe_gemm.model.routing import expert_counts
    from moe_gemm.torch import weight_grad

    a, dc, offs = routed(expert_counts(64, 8192, 1.2), 1024, 2688, cuda)
    want = fp64(a, dc, offs)
    db = weight_grad(a, dc, offs, torch.float32)
    assert ((db.double() - want).norm() / want.norm()).item() < 1e-5  # fp32 accumulation of exact products


def test_accumulate_adds_exactly_and_leaves_empty_experts_untouched(cuda):
    from moe_gemm.torch import weight_grad

    counts = (70, 0, 130, 5, 0)
    a, dc, offs = routed(counts, 128, 192, cuda, integer=True, extra_rows=3)
    start = torch.randint(-8, 9, (5, 128, 192), device=cuda).float()
    start[1] = torch.nan  # expert 1 has no rows: an add of zeros would still be an add; NaN shows none happened
    start[4, 0, 0] = -0.0
    out = start.clone()
    context = no_fallback()
    assert weight_grad(a, dc, offs, out=out, accumulate=True) is out
    context.__exit__(None, None, None)
    want = start.double() + fp64(a, dc, offs)
    for e in (0, 2, 3):
        torch.testing.assert_close(out[e].double(), want[e], rtol=0, atol=0)
    for e in (1, 4):  # untouched, bit for bit (NaN's payload, -0.0's sign)
        assert torch.equal(out[e].view(torch.int32), start[e].view(torch.int32))


def test_accumulate_with_no_rows_leaves_out_as_it_was(cuda):
    from moe_gemm.torch import weight_grad

    a, dc = torch.empty(0, 64, dtype=torch.bfloat16, device=cuda), torch.empty(0, 64, dtype=torch.bfloat16,
                                                                                device=cuda)
    offs = torch.zeros(3, dtype=torch.int32, device=cuda)
    out = torch.randn(3, 64, 64, device=cuda)
    before = out.clone()
    weight_grad(a, dc, offs, out=out, accumulate=True)
    assert torch.equal(out, before)
    assert weight_grad(a, dc, offs).abs().max().item() == 0


def test_accumulating_twice_is_deterministic(cuda):
    """One reduction per element per launch: the order of the blocks cannot change the bits."""
    from moe_gemm.model.routing import expert_counts
    from moe_gemm.torch import weight_grad

    a, dc, offs = routed(expert_counts(64, 8192, 1.2), 1024, 2688, cuda, seed=4)
    start = torch.randn(64, 1024, 2688, device=cuda)
    first, second = start.clone(), start.clone()
    for out in (first, second):
        weight_grad(a, dc, offs, out=out, accumulate=True)
        weight_grad(a, dc, offs, out=out, accumulate=True)
    assert torch.equal(first.view(torch.int32), second.view(torch.int32))


def test_the_ops_backward_runs_k7(cuda):
    from moe_gemm.torch import grouped_mm

    a, dc, offs = routed((70, 0, 130, 5), 128, 192, cuda, seed=3)
    b = (torch.randn(4, 128, 192, device=cuda) * 128**-0.5).to(torch.bfloat16).requires_grad_()
    context = no_fallback()
    grouped_mm(a, b, offs).backward(dc)
    context.__exit__(None, None, None)
    want = fp64(a, dc, offs)
    assert ((b.grad.double() - want).norm() / want.norm()).item() < 1e-2
    assert b.grad[1].abs().max().item() == 0


def test_one_graph_replayed_with_changing_routings(cuda):
    from moe_gemm.torch import weight_grad

    experts, rows, K, N = 12, 700, 128, 328
    a, dc, _ = routed([rows], K, N, cuda, integer=True)
    offs = torch.full((experts,), rows, dtype=torch.int32, device=cuda)
    accumulated = torch.zeros(experts, K, N, device=cuda)
    weight_grad(a, dc, offs)  # compile and warm up outside the capture
    weight_grad(a, dc, offs, out=accumulated, accumulate=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        db = weight_grad(a, dc, offs)
        weight_grad(a, dc, offs, out=accumulated, accumulate=True)
    rng = np.random.default_rng(0)
    routings = [np.r_[np.zeros(experts - 1, dtype=int), rows], np.zeros(experts, dtype=int)]
    routings += [rng.multinomial(rows, rng.dirichlet(np.ones(experts) * 0.3)) for _ in range(3)]
    for counts in routings:
        offs.copy_(torch.tensor(np.cumsum(counts), dtype=torch.int32))
        accumulated.fill_(1.0)
        graph.replay()
        want = fp64(a, dc, offs)
        torch.testing.assert_close(db.double(), want, rtol=0, atol=0)
        torch.testing.assert_close(accumulated.double(), want + 1, rtol=0, atol=0)


def test_compiled_fullgraph(cuda):
    from moe_gemm.torch import weight_grad

    a, dc, offs = routed((100, 0, 28, 400), 128, 256, cuda, integer=True)
    compiled = torch.compile(lambda a, dc, offs: weight_grad(a, dc, offs, torch.float32) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(a, dc, offs).double(), 2 * fp64(a, dc, offs), rtol=0, atol=0)


def test_errors_before_any_launch_and_fallbacks(cuda):
    from moe_gemm.torch import weight_grad

    a, dc, offs = routed((5, 7), 64, 64, cuda)
    with pytest.raises(ValueError, match="int32"):
        weight_grad(a, dc, offs.long())
    with pytest.raises(ValueError, match="on a's device"):
        weight_grad(a, dc, offs.cpu())
    with pytest.raises(ValueError, match="contiguous float32"):
        weight_grad(a, dc, offs, out=torch.zeros(2, 64, 64, dtype=torch.bfloat16, device=cuda), accumulate=True)
    with pytest.warns(UserWarning, match="K = 96 is not a multiple of 64"):
        a96 = torch.randn(12, 96, device=cuda).to(torch.bfloat16)
        db = weight_grad(a96, dc, offs)
    torch.testing.assert_close(db.double(), fp64(a96, dc, offs), rtol=1e-2, atol=1e-1)
    with warnings.catch_warnings():  # the same fallback in fp32, which torch's bf16 form refuses to output
        warnings.simplefilter("ignore")
        single = weight_grad(a96, dc, offs, torch.float32)
        out = torch.ones(2, 96, 64, device=cuda)
        weight_grad(a96, dc, offs, out=out, accumulate=True)
    torch.testing.assert_close(single.double(), fp64(a96, dc, offs), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out.double(), fp64(a96, dc, offs) + 1, rtol=1e-5, atol=1e-4)
    torch.cuda.synchronize()  # the context is intact


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_the_accumulate_mode_is_clean_under_compute_sanitizer(cuda, tool, sanitize):
    """k7's accumulate instance under compute-sanitizer (``--kernel-name``: k7 alone, not torch's kernels), on
    several tiles per block, an empty expert and rows past offs[-1]."""
    script = ("import torch\nfrom moe_gemm.torch import weight_grad\n"
              "a = torch.randn(900, 256, device='cuda').to(torch.bfloat16)\n"
              "dc = torch.randn(900, 392, device='cuda').to(torch.bfloat16)\n"
              "offs = torch.tensor([300, 300, 377, 378, 808], dtype=torch.int32, device='cuda')\n"
              "out = torch.zeros(5, 256, 392, device='cuda')\n"
              "weight_grad(a, dc, offs, out=out, accumulate=True); torch.cuda.synchronize(); print('accumulated')\n")
    sanitize(script, "k7_weight_grad", "accumulated", tool=tool)
