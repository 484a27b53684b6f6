"""k6's one launch path without a GPU (moe_gemm.variants.k6.launch): the arguments of a few configurations,
checked against values computed here; the grid; and a launch built on stand-in tensor maps (encoding a
real one needs the driver)."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.cuda.descriptors import operand_plan
from moe_gemm.cuda.tensormap import TiledMap
from moe_gemm.variants.k6.config import FUSED, LADDER
from moe_gemm.variants.k6.launch import arguments, launcher, packed_arguments

A, B, C, ENDS, UNITS = 0x7F0000000000, 0x7F1000000000, 0x7F2000000000, 0x7F3000000004, 0x7F4000000000
TOKENS, E, K, N = 1000, 64, 1024, 2560


def plan_values(major: str) -> list:
    plan = operand_plan(major)
    return [plan.bits, plan.k16_bytes, plan.mn64_bytes]


@pytest.mark.parametrize("name, a_box_rows, group, units, c_columns", [
    ("k6/pingpong-bn192", 128, 1, 0, N),
    ("k6/pingpong-cluster-bn128", 64, 1, 0, N),  # along N: each block of the pair loads half of A's box
    ("k6/pingpong-mcluster-bn192", 128, 1, 0, N),  # along M: each block its own M tile
    ("k6/coop256-cluster-bn128-g8", 128, 8, 0, N),
    ("k6/pingpong-cluster-bn192-host", 64, 1, 37, N),
    ("k6/pingpong-cluster-bn192-kmajor", 64, 1, 0, N),
    ("k6/swiglu-coop256-cluster", 128, 1, 0, N // 2),
])
def test_the_arguments_in_the_kernels_order(name, a_box_rows, group, units, c_columns):
    config = {**LADDER, **FUSED}[name]
    units_address = UNITS if units else 0
    args = arguments(config, A, B, C, ENDS, TOKENS, E, K, N, units_address, units)
    kn = config.b_layout == "kn"
    assert args[:3] == (
        TiledMap("A", A, (K, TOKENS), (K * 2,), (64, a_box_rows)),
        TiledMap("B", B, (N, K, E), (N * 2, K * N * 2), (64, 64, 1)) if kn else
        TiledMap("B^T", B, (K, N, E), (K * 2, N * K * 2), (64, 64, 1)),
        TiledMap("C", C, (c_columns, TOKENS), (c_columns * 2,), (64, 64)))
    assert args[3:12] == (C, units_address, units, ENDS, TOKENS, E, group, K, N)
    assert [type(arg) for arg in args[3:11]] == [int, int, np.int32, int, np.int32, np.int32, np.int32, np.int32]
    assert [plan.tolist() for plan in args[12:]] == [tuple(plan_values("K")), tuple(plan_values("MN" if kn else "K"))]


class Encoded:
    """A stand-in for the driver's CUtensorMap: PackedArguments asks it only for its address."""

    def getPtr(self) -> int:  # noqa: N802 - the cuda.bindings method's name
        return id(self)


@pytest.fixture
def stand_in_maps(monkeypatch):
    monkeypatch.setattr(TiledMap, "encode", lambda self: Encoded())
    packed_arguments.cache_clear()
    yield
    packed_arguments.cache_clear()  # no stand-in stays in the cache for a real launch


def test_a_launch_takes_the_devices_slots_and_the_callers_stream(stand_in_maps):
    config = LADDER["k6/pingpong-cluster-bn192"]
    kernel = object()  # compiled on the GPU machine; only handed through here
    run = launcher(kernel, config, 66, A, B, C, ENDS, TOKENS, E, K, N, stream=1234)
    assert (run.kernel, run.grid, run.smem, run.stream) == (kernel, 132, config.dynamic_smem_bytes, 1234)
    assert len(run.args.pointers) == 14  # K6_PARAMS' 14 parameters
    again = launcher(kernel, config, 66, A, B, C, ENDS, TOKENS, E, K, N)
    assert again.args is run.args and again.stream is None  # packed once; None: the harness stream
    assert again.device is None  # the harness's device; the torch op names the tensors' GPU
    assert launcher(kernel, config, 66, A, B, C, ENDS, TOKENS, E, K, N, stream=1234, device=1).device == 1
    assert launcher(kernel, config, 66, A, B, C, ENDS + 4, TOKENS, E, K, N).args is not run.args


@pytest.mark.parametrize("units, grid", [(0, 2), (5, 10), (500, 132)])
def test_the_host_walk_launches_no_more_clusters_than_units(stand_in_maps, units, grid):
    config = LADDER["k6/pingpong-cluster-bn192-host"]
    run = launcher(object(), config, 66, A, B, C, ENDS, TOKENS, E, K, N, units_address=UNITS, units=units)
    assert run.grid == grid
