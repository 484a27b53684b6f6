"""k6's one launch path without a GPU (moe_gemm.variants.k6.launch): the arguments of a few configurations,
checked against values computed here; the grid; and a launch built on stand-in tensor maps (encoding a
real one needs the driver)."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.cuda.tensormap import TiledMap
from moe_gemm.variants.k6.config import FUSED, LADDER
from moe_gemm.variants.k6.launch import arguments, launcher, packed_arguments

A, B, C, ENDS, UNITS = 0x7F0000000000, 0x7F1000000000, 0x7F2000000000, 0x7F3000000004, 0x7F4000000000
TOKENS, E, K, N = 1000, 64, 1024, 2560


@pytest.mark.parametrize("name, a_box_rows, b_box_rows, group, units, c_columns", [
    ("k6/pingpong-bn192", 128, 64, 1, 0, N),
    ("k6/pingpong-cluster-bn128", 64, 64, 1, 0, N),  # along N: each block of the pair loads half of A's box
    ("k6/pingpong-mcluster-bn192", 128, 32, 1, 0, N),  # along M: its own M tile and half of every B box
    ("k6/coop256-cluster-bn128-g8", 128, 64, 8, 0, N),
    ("k6/pingpong-cluster-bn192-host", 64, 64, 1, 37, N),
    ("k6/pingpong-cluster-bn192-kmajor", 64, 64, 1, 0, N),
    ("k6/swiglu-coop256-cluster", 128, 64, 1, 0, N // 2),
])
def test_the_arguments_in_the_kernels_order(name, a_box_rows, b_box_rows, group, units, c_columns):
    config = {**LADDER, **FUSED}[name]
    units_address = UNITS if units else 0
    args = arguments(config, A, B, C, ENDS, TOKENS, E, K, N, units_address, units)
    kn = config.b_layout == "kn"
    assert args[:3] == (
        TiledMap("A", A, (K, TOKENS), (K * 2,), (64, a_box_rows)),
        TiledMap("B", B, (N, K, E), (N * 2, K * N * 2), (64, b_box_rows, 1)) if kn else
        TiledMap("B^T", B, (K, N, E), (K * 2, N * K * 2), (64, b_box_rows, 1)),
        TiledMap("C", C, (c_columns, TOKENS), (c_columns * 2,), (64, 64)))
    assert args[3:12] == (C, units_address, units, ENDS, TOKENS, E, group, K, N)
    assert [type(arg) for arg in args[3:11]] == [int, int, np.int32, int, np.int32, np.int32, np.int32, np.int32]
    assert len(args) == 12  # the descriptor plans are k6's compile-time constants (tests/test_k6.py)


def test_the_types_reach_the_maps():
    """fp16 operands: A's and B's maps hold FLOAT16 elements; an fp32 C: a map of 64 x 32 boxes (128 bytes,
    the swizzle's span), rows 4 bytes an element."""
    config = LADDER["k6/pingpong-bn192"].replace(element="fp16", out="fp32")
    a_map, b_map, c_map = arguments(config, A, B, C, ENDS, TOKENS, E, K, N)[:3]
    assert (a_map.element, b_map.element, c_map.element) == ("fp16", "fp16", "fp32")
    assert c_map == TiledMap("C", C, (N, TOKENS), (N * 4,), (32, 64), element="fp32")


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
    assert len(run.args.pointers) == 12  # K6_PARAMS' 12 parameters
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


@pytest.mark.parametrize("name", ["k6/pingpong-bn192-pdl", "k6/pingpong-mcluster-bn192-pdl", "k6/pingpong-bn192"])
def test_a_pdl_rung_launches_programmatically_and_its_twin_does_not(stand_in_maps, monkeypatch, name):
    """The PDL rungs' launches go to cuLaunchKernelEx with the stream-serialization attribute (a PDL rung launched
    without it would time as its twin); the same 12 arguments either way."""
    import moe_gemm.variants.k6.launch as k6_launch

    taken = []
    monkeypatch.setattr(k6_launch, "launch", lambda *args, **options: taken.append(options))
    run = launcher(object(), LADDER[name], 66, A, B, C, ENDS, TOKENS, E, K, N, stream=1234)
    run()
    assert run.programmatic == LADDER[name].pdl and len(run.args.pointers) == 12
    assert taken == [{"stream": 1234, "device": None, "programmatic": LADDER[name].pdl}]


def test_the_l2_promotion_rung_differs_from_its_twin_only_in_the_operands_maps():
    """k6/coop256-cluster-bn192-g8-p128: the g8 rung's kernel and arguments, A's and B's maps promoting each L2
    miss to 128 bytes instead of 256 (C's map as before); other promotions refused."""
    twin, rung = LADDER["k6/coop256-cluster-bn192-g8"], LADDER["k6/coop256-cluster-bn192-g8-p128"]
    assert rung.kernel_name == twin.kernel_name and rung == twin.replace(l2_promotion=128)
    ours, theirs = (arguments(c, A, B, C, ENDS, TOKENS, E, K, N) for c in (rung, twin))
    assert [m.l2_promotion_bytes for m in ours[:3]] == [128, 128, 256]
    assert [m.l2_promotion_bytes for m in theirs[:3]] == [256, 256, 256]
    assert [m.box for m in ours[:3]] == [m.box for m in theirs[:3]] and ours[3:] == theirs[3:]
    with pytest.raises(ValueError, match="128 or 256 bytes"):
        twin.replace(l2_promotion=64)
