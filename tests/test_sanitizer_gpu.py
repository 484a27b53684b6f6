"""compute-sanitizer on every CUDA C++ kernel: each configuration of a family on every edge case,
under memcheck, racecheck and synccheck. Clean means no report, exit status 0 and every answer
exact (moe_gemm.measure.sanitize_target checks each output against the reference)."""

from __future__ import annotations

import subprocess

import pytest

from moe_gemm.core.chapters import CHAPTERS
from moe_gemm.cuda.gpu import detect_gpu
from moe_gemm.measure.sanitize_target import find_compute_sanitizer, sanitizer_command
from moe_gemm.measure.validation import sanitized

pytestmark = pytest.mark.gpu

# The CUDA C++ families and the compute capability each needs (k1 is mma.sync, sm_80; k2 adds TMA,
# sm_90; k3 wgmma, k5 its mixed tiles and k6 chapter 07's ladder, sm_90a), each checked on its
# module's SANITIZED variants (and, under `validation run --admit`, on those not yet run).
FAMILIES = {c.family: c.capability for c in CHAPTERS if c.sanitized}
CLEAN = ("ERROR SUMMARY: 0 errors", "RACECHECK SUMMARY: 0 hazards")


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_compute_sanitizer_is_clean(family: str, tool: str) -> None:
    gpu = detect_gpu()
    if gpu is None or gpu.compute_capability < FAMILIES[family]:
        pytest.skip(f"{family} needs sm_{FAMILIES[family][0]}{FAMILIES[family][1]} or newer")
    if find_compute_sanitizer() is None:
        pytest.skip("compute-sanitizer not found (PATH, /usr/local/cuda*/bin or $COMPUTE_SANITIZER)")
    proc = subprocess.run(sanitizer_command(tool, sanitized(family)), capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert any(line in output for line in CLEAN), output[-4000:]
    assert "every case exact" in output, output[-4000:]
