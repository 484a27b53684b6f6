"""The kernel-parameter array cuLaunchKernel reads, built without a GPU."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from moe_gemm.cuda.launch import PackedArguments, TensorMapArg


class FakeMap:
    """Stands in for a CUtensorMap: 128 bytes at a known address."""

    def __init__(self) -> None:
        self.bytes = (ctypes.c_uint8 * 128)(*range(128))

    def getPtr(self) -> int:  # noqa: N802 - cuda.bindings' name
        return ctypes.addressof(self.bytes)


def test_each_pointer_points_at_its_arguments_bytes():
    tensor_map = FakeMap()
    packed = PackedArguments((TensorMapArg(tensor_map), 0xDEADBEEF00, np.int32(-7), np.int32(2688)))
    pointers = np.ctypeslib.as_array((ctypes.c_uint64 * 4).from_address(packed.address))
    assert pointers[0] == tensor_map.getPtr()  # the map by value: its own 128 bytes
    assert ctypes.c_uint64.from_address(int(pointers[1])).value == 0xDEADBEEF00
    assert ctypes.c_int32.from_address(int(pointers[2])).value == -7
    assert ctypes.c_int32.from_address(int(pointers[3])).value == 2688


def test_an_argument_of_another_type_is_refused():
    with pytest.raises(TypeError, match="cannot pass float"):
        PackedArguments((1.5,))


def test_a_programmatic_launch_goes_through_the_extended_launch_with_its_attribute(monkeypatch):
    """A programmatic launch on a caller's stream: cuLaunchKernelEx with the grid, block, shared memory, stream
    and the stream-serialization attribute, the packed parameters unchanged; otherwise cuLaunchKernel."""
    from cuda.bindings import driver

    import moe_gemm.cuda.launch as cuda_launch

    class Kernel:
        handle = 0

    calls = []
    success = (driver.CUresult.CUDA_SUCCESS,)
    monkeypatch.setattr(driver, "cuLaunchKernelEx",
                        lambda config, f, params, extra: calls.append(("ex", config, params)) or success)
    monkeypatch.setattr(driver, "cuLaunchKernel", lambda f, *rest: calls.append(("plain", rest)) or success)
    packed = PackedArguments((0xDEADBEEF00, np.int32(7)))
    for programmatic in (True, False):
        cuda_launch._driver_launch(Kernel(), (132, 1, 1), (384, 1, 1), 200_000, packed, stream=77,
                                   programmatic=programmatic)
    (kind, config, params), (plain, rest) = calls
    assert kind == "ex" and params == packed.address and plain == "plain"
    assert (config.gridDimX, config.blockDimX, config.sharedMemBytes, int(config.hStream)) == (132, 384, 200_000, 77)
    assert config.attrs[0].id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert rest[:7] == (132, 1, 1, 384, 1, 1, 200_000) and rest[-2:] == (packed.address, 0)
