"""The measured ceilings: the register-only kernels compile to the instruction they time, with no
local memory, and the host's FLOP counts agree with the kernels' chain counts. On a GPU, each
ceiling comes back as a plausible positive number."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moe_gemm.cuda.nvrtc import compile_kernel
from moe_gemm.cuda.sass import opcode_counts
from moe_gemm.measure import ceilings

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


@pytest.mark.parametrize(("variant", "arch"), [(name, arch) for name, kernel in ceilings.CEILING_KERNELS.items()
                                                for arch in kernel.arches])
def test_microbenchmarks_compile_to_their_instruction_and_touch_no_memory(variant, arch):
    kernel = ceilings.CEILING_KERNELS[variant]
    compiled = compile_kernel(kernel.source, kernel.name, arch=arch).require_no_spills()
    counts = opcode_counts(compiled.sass(), [kernel.instruction, "LDG", "LDS", "STG"])
    assert counts[kernel.instruction] >= 8, counts
    # Nothing but registers (and, for wgmma, the operand tiles it reads itself) inside the loop; one
    # store of the sums at the end, so that the loop is not dead code.
    assert counts["LDS"] == 0 and counts["LDG"] == 0 and counts["STG"] == 1, counts


@pytest.mark.parametrize("source, instruction", [("ceiling_wgmma", "HGMMA.64x256x16.F32.BF16"),
                                                 ("ceiling_wgmma_e4m3", "QGMMA.64x256x32.F32.E4M3.E4M3")])
def test_the_wgmma_ceilings_issue_the_widest_wgmma(source, instruction):
    compiled = compile_kernel(f"{source}.cu", source, arch="sm_90a")
    assert instruction in compiled.sass() and "C7515" not in compiled.log
    assert compiled.report.registers <= 255 and compiled.report.static_smem_bytes == 40 * 1024


@pytest.mark.parametrize(("source", "constant", "host"), [
    ("ceiling_ffma.cu", "CEILING_FFMA_CHAINS", ceilings.FFMA_CHAINS),
    ("ceiling_mma_sync.cu", "CEILING_MMA_CHAINS", ceilings.MMA_CHAINS),
    ("ceiling_wgmma.cuh", "CEILING_WGMMA_N", ceilings.WGMMA_N),
    ("ceiling_wgmma.cuh", "CEILING_WGMMA_K16", ceilings.WGMMA_K16),
    ("ceiling_wgmma.cuh", "CEILING_WGMMA_WARPGROUPS", ceilings.WGMMA_WARPGROUPS),
])
def test_host_flop_counts_match_the_kernels(source, constant, host):
    match = re.search(rf"constexpr int {constant} = (\d+);", (KERNELS / source).read_text())
    assert match and int(match.group(1)) == host


def test_ceiling_value_reads_records():
    records = [{"variant": "ceiling/copy", "tbps": 4.1}, {"variant": "ceiling/mma_sync", "tflops": 600.0}]
    assert ceilings.ceiling_value(records, "copy") == 4.1
    assert ceilings.ceiling_value(records, "mma_sync") == 600.0
    assert ceilings.ceiling_value(records, "dense_bf16") is None


@pytest.mark.gpu
def test_ceilings_on_the_gpu():
    from moe_gemm.cuda.gpu import detect_gpu

    gpu = detect_gpu()
    if gpu is None or gpu.compute_capability < (8, 0):
        pytest.skip("the mma.sync ceiling needs sm_80 or newer")
    assert 0.1 < ceilings.copy_tbps(256 * 1024**2, warmup=1, iterations=3) < 20
    assert 1 < ceilings.ffma_tflops(2000, warmup=1, iterations=3) < 500
    assert 10 < ceilings.mma_sync_tflops(500, warmup=1, iterations=3) < 5000
    if gpu.arch == "sm_90a":
        assert 100 < ceilings.wgmma_tflops(500, warmup=1, iterations=3) < 2000
        assert 200 < ceilings.wgmma_e4m3_tflops(500, warmup=1, iterations=3) < 4000
