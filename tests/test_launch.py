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
