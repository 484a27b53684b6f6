"""kernels/moe_combine.cu without a GPU: it builds for sm_90a without spills, reads and writes 16 bytes
at a time and uses no atomics (each output row has one writer). Its GPU tests are in
tests/test_torch_op_gpu.py."""

from __future__ import annotations

from moe_gemm.cuda.nvrtc import compile_kernel
from moe_gemm.cuda.sass import opcode_counts


def test_the_combine_kernel_loads_16_bytes_at_a_time_and_has_no_atomics():
    compiled = compile_kernel("moe_combine.cu", "moe_combine", arch="sm_90a")
    assert compiled.report.spill_store_bytes == 0 and compiled.report.registers <= 64
    counts = opcode_counts(compiled.sass(), ("LDG.E.128", "STG.E.128", "ATOM", "RED", "F2FP"))
    assert counts["LDG.E.128"] >= 1 and counts["STG.E.128"] >= 1
    assert counts["ATOM"] == 0 and counts["RED"] == 0
    assert counts["F2FP"] >= 4  # the fp32 sums rounded to bf16 pairs (cvt.rn.bf16x2.f32) before each store
