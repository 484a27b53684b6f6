"""What the Hopper steps share (moe_gemm.variants.sm90) without a GPU, against the headers their kernels
include: the K step, the boxes, the ring's alignment and the warpgroup of kernels/wgmma_config.cuh, the
OperandPlan struct of kernels/ptx.cuh that every launch passes by value; the target check; and that the
package is no kernel family."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moe_gemm.cuda.gpu import GpuInfo
from moe_gemm.variants.sm90 import maps
from moe_gemm.variants.sm90.config import BK, BOX, PLAN_DTYPE, SWIZZLE_ALIGN, WARPGROUP

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


def test_the_config_is_wgmma_configs():
    header = (KERNELS / "wgmma_config.cuh").read_text()

    def constant(name: str) -> int:
        return int(re.search(rf"constexpr (?:int|unsigned) {name} = (\d+);", header).group(1))

    assert (constant("BK"), constant("BOX"), constant("SWIZZLE_ALIGN"), constant("WARPGROUP")) == \
        (BK, BOX, SWIZZLE_ALIGN, WARPGROUP)


def test_the_plan_argument_is_the_kernels_operand_plan():
    struct = re.search(r"struct OperandPlan \{(.*?)\};", (KERNELS / "ptx.cuh").read_text(), re.S).group(1)
    little_endian = {"unsigned long long": "<u8", "unsigned": "<u4"}
    fields = [(name, little_endian[kind]) for kind, name in re.findall(r"(unsigned long long|unsigned) (\w+);", struct)]
    assert fields == [(name, PLAN_DTYPE[name].str) for name in PLAN_DTYPE.names]
    assert PLAN_DTYPE.itemsize == 16  # C's layout: the u64 first, the two u32 after it, no padding
    plan = maps.plan_argument(maps.plans("kn")[1])
    assert plan.dtype == PLAN_DTYPE and plan["k16_bytes"] == 16 * 128  # MN-major B: a k16 step is 16 rows of 128 B


def test_only_sm90a_gpus_run_the_hopper_steps(monkeypatch):
    assert maps.other_target((9, 0)) is None
    assert maps.other_target((10, 0)) == "sm_100" and maps.other_target((8, 9)) == "sm_89"
    assert maps.other_target(None) == "no GPU"
    monkeypatch.setattr(maps, "detect_gpu", lambda: GpuInfo("Test B200", (10, 0), 148, 13000))
    with pytest.raises(ValueError, match="k6/x needs an sm_90a GPU .*; Test B200 is sm_100"):
        maps.require_sm90a("k6/x")
    monkeypatch.setattr(maps, "detect_gpu", lambda: None)
    with pytest.raises(ValueError, match="k6/x needs an NVIDIA GPU and none was found"):
        maps.require_sm90a("k6/x")
    monkeypatch.setattr(maps, "detect_gpu", lambda: GpuInfo("Test H200", (9, 0), 132, 13000))
    assert maps.require_sm90a("k6/x").name == "Test H200"


def test_the_package_is_no_kernel_family():
    from moe_gemm.variants import registry

    assert "sm90" not in registry.families() and {"k3", "k5", "k6"} <= set(registry.families())
