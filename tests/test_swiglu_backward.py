"""SwiGLU's backward as one pass (kernels/swiglu_backward.cu, moe_gemm.torch.swiglu.dswiglu_pass), without a GPU:
the kernel as compiled, the rules that choose it, its place in the validation record. The GPU side is
tests/test_swiglu_backward_gpu.py."""

from __future__ import annotations

import pytest

from moe_gemm.cuda.nvrtc import compile_kernel
from moe_gemm.cuda.sass import opcode_counts
from moe_gemm.measure import validation
from moe_gemm.torch.kernels import NOT_YET_RUN, SWIGLU_BACKWARD, SWIGLU_BACKWARD_PENDING


@pytest.mark.parametrize("element", ["bf16", "fp16"])
def test_the_pass_moves_each_byte_once_in_16_byte_pieces(element):
    """Per trip of the grid-stride loop a thread makes three 16-byte loads (dact, gate, up) and three 16-byte
    stores (dgate, dup, act) and nothing narrower, one exponential per element of its 8 (the fused epilogue's
    formula), no shared memory, no spills."""
    compiled = compile_kernel(*SWIGLU_BACKWARD[element], arch="sm_90a")
    assert compiled.report.spill_store_bytes == 0 and compiled.report.static_smem_bytes == 0
    counts = opcode_counts(compiled.sass(), ("LDG", "LDG.E.128", "STG", "STG.E.128", "MUFU.EX2", "LDS", "STS"))
    assert counts["LDG"] == counts["LDG.E.128"] == 3 and counts["STG"] == counts["STG.E.128"] == 3
    assert counts["MUFU.EX2"] == 8 and counts["LDS"] == counts["STS"] == 0


def test_the_pass_and_the_fused_epilogue_share_the_element_formula():
    """One definition of SwiGLU's backward per pair of elements (epilogues.cuh, dswiglu_pair), called by k6's fused
    epilogue and by the pass: neither spells the formula itself."""
    from moe_gemm.core.paths import KERNEL_DIR

    header = (KERNEL_DIR / "epilogues.cuh").read_text()
    assert "__device__ __forceinline__ void dswiglu_pair(" in header
    fused = (KERNEL_DIR / "k6_persistent.cu").read_text().split("[start:dswiglu]")[1].split("[end:dswiglu]")[0]
    for text in (fused, (KERNEL_DIR / "swiglu_backward.cu").read_text()):
        assert "sm90::dswiglu_pair(" in text and "__expf" not in text


def test_the_pass_passed_its_gpu_run_and_the_rules_refuse_what_it_cannot_take(monkeypatch):
    """Admitted on an H100: both 16-bit kernels are in the validation record's scope and dswiglu takes the kernel
    where the rules allow; before that (NOT_YET_RUN naming it) its GPU tests ran it alone, by their module's name.
    On the CPU, dswiglu is torch's operations, bit for bit."""
    torch = pytest.importorskip("torch")
    from moe_gemm.torch import swiglu

    assert SWIGLU_BACKWARD_PENDING not in NOT_YET_RUN
    assert {f"{SWIGLU_BACKWARD_PENDING}-bf16", f"{SWIGLU_BACKWARD_PENDING}-fp16"} <= set(
        validation.kernel_configurations())
    monkeypatch.setattr(validation, "NOT_YET_RUN", frozenset({SWIGLU_BACKWARD_PENDING}))
    validation.pending_markers.cache_clear()
    assert validation.admission_markers(f"{SWIGLU_BACKWARD_PENDING}-fp16") == ("test_swiglu_backward_gpu",)
    validation.pending_markers.cache_clear()
    dact, h = torch.randn(4, 16).bfloat16(), torch.randn(4, 32).bfloat16()
    assert "CUDA" in swiglu.pass_kernel_refusal(dact, h) and not swiglu.runs_the_pass_kernel(dact, h)
    with pytest.raises(ValueError, match="dswiglu_pass: dact and h must be CUDA tensors"):
        swiglu.dswiglu_pass(dact, h)
    got, want = swiglu.dswiglu(dact, h), swiglu.dswiglu_torch(dact, h)
    assert all(torch.equal(g, w) for g, w in zip(got, want))  # on the CPU: torch's operations, bit for bit


def test_the_rules_name_each_constraint(monkeypatch):
    """pass_kernel_refusal on tensors that only pretend to be on the GPU (the rules read shapes, dtypes, strides)."""
    torch = pytest.importorskip("torch")
    from moe_gemm.torch import swiglu

    class OnGpu(torch.Tensor):
        is_cuda = True

    def cuda(t):
        return t.as_subclass(OnGpu)

    dact, h = torch.zeros(16, 64, dtype=torch.bfloat16), torch.zeros(16, 128, dtype=torch.bfloat16)
    assert swiglu.pass_kernel_refusal(cuda(dact), cuda(h)) is None
    assert "both be bf16" in swiglu.pass_kernel_refusal(cuda(dact), cuda(h.half()))
    assert "both be bf16" in swiglu.pass_kernel_refusal(cuda(dact.float()), cuda(h.float()))
    assert "[M, 2I]" in swiglu.pass_kernel_refusal(cuda(dact), cuda(h[:, :64]))
    assert "multiple of 8" in swiglu.pass_kernel_refusal(cuda(dact[:, :60]), cuda(h[:, :120]))
    assert "contiguous" in swiglu.pass_kernel_refusal(cuda(dact.t().contiguous().t()), cuda(h))
    monkeypatch.setattr(swiglu, "NOT_YET_RUN", frozenset())  # once admitted, these inputs take the kernel
    assert swiglu.runs_the_pass_kernel(cuda(dact), cuda(h))
