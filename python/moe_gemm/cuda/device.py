"""Device memory and the one stream every launch of the harness goes to.

Memory goes through the CUDA driver API (cuda.bindings), whose calls have been stable across
the cuda-python releases this project meets; the stream and events come from cuda.core. All
of it lives in the device's primary context, which numba-cuda and torch share, so a numba
kernel, an NVRTC kernel and torch._grouped_mm can be timed on one stream side by side.

bf16 data is exposed through ``__cuda_array_interface__`` as raw 16-bit words (``<u2``) and fp8
e4m3 data as raw bytes (``|u1``): numba has neither type, and torch reinterprets them with
``.view(torch.bfloat16)`` or ``.view(torch.float8_e4m3fn)``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

import numpy as np

from moe_gemm.model.problem import BF16, FP16, FP32, Problem
from moe_gemm.model.quantize import E4M3
from moe_gemm.model.routing import expert_offsets

# The canonical quiet NaNs: poison for outputs a kernel must write, so an element it missed fails the check.
BF16_NAN_BITS = 0x7FC0
FP32_NAN_BITS = 0x7FC00000
FP16_NAN_BITS = 0x7E00
NAN_BITS: dict[np.dtype, int] = {BF16: BF16_NAN_BITS, FP16: FP16_NAN_BITS, FP32: FP32_NAN_BITS}

# Types numba and torch do not read from __cuda_array_interface__, handed over as raw words of their size.
RAW_TYPESTRS: dict[np.dtype, str] = {BF16: "<u2", E4M3: "|u1"}

BLayout = Literal["kn", "nk"]


def check_driver(result: Any) -> Any:
    """Unwrap a cuda.bindings driver call's (error, *values), raising on any error."""
    from cuda.bindings import driver

    if isinstance(result, tuple):
        err, *values = result
    else:
        err, values = result, []
    if err != driver.CUresult.CUDA_SUCCESS:
        _, message = driver.cuGetErrorString(err)
        text = message.decode() if isinstance(message, bytes) else str(message)
        raise RuntimeError(f"CUDA driver error {int(err)} ({err.name}): {text}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def cuda_device():
    """cuda.core's Device 0, made current (its primary context)."""
    from cuda.core import Device

    device = Device(0)
    device.set_current()
    return device


@functools.cache
def _primary_context(index: int) -> Any:
    from cuda.bindings import driver

    return check_driver(driver.cuDevicePrimaryCtxRetain(check_driver(driver.cuDeviceGet(index))))


def make_context_current(index: int) -> None:
    """Make GPU ``index``'s primary context (torch's and numba's) current on this thread if none is: a thread
    torch started for autograd's backward can run torch's kernels with no driver context current, and a
    tensor map encode or a driver launch there fails with CUDA_ERROR_INVALID_CONTEXT (seen on the H200: the
    op's backward, when the weight gradient was the first of our launches on that thread). A context that is
    current is left alone: the CUDA runtime reads torch's current device from it."""
    from cuda.bindings import driver

    if int(check_driver(driver.cuCtxGetCurrent())) == 0:
        check_driver(driver.cuCtxSetCurrent(_primary_context(index)))


@functools.cache
def harness_stream():
    """The stream every harness launch, copy and timing event uses."""
    return cuda_device().create_stream()


def stream_handle(stream=None) -> int:
    """The raw CUstream value, for numba's external_stream and torch's ExternalStream."""
    return int((stream or harness_stream()).handle)


def synchronize() -> None:
    harness_stream().sync()


def interface_typestr(dtype: np.dtype) -> str:
    """The ``__cuda_array_interface__`` typestr of a dtype: raw words for bf16 and e4m3."""
    dtype = np.dtype(dtype)
    return RAW_TYPESTRS.get(dtype, dtype.str)


class DeviceArray:
    """A C-contiguous device allocation with a numpy shape and dtype."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype | type) -> None:
        from cuda.bindings import driver

        cuda_device()
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        # cuMemAlloc rejects 0 bytes; one byte keeps the pointer valid for empty arrays.
        self._ptr = check_driver(driver.cuMemAlloc(max(self.nbytes, 1)))
        self._free = driver.cuMemFree

    def view(self, byte_offset: int, shape: tuple[int, ...], dtype: np.dtype | type | None = None) -> DeviceArray:
        """A non-owning array starting ``byte_offset`` bytes into this allocation (any offset, so
        tests can hand a kernel the misaligned pointer it must refuse). It keeps this one alive."""
        from cuda.bindings import driver

        dtype = np.dtype(dtype or self.dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if byte_offset < 0 or byte_offset + nbytes > max(self.nbytes, 1):
            raise ValueError(f"a view of {nbytes} bytes at offset {byte_offset} does not fit in {self.nbytes} bytes")
        view = object.__new__(DeviceArray)
        view.shape, view.dtype, view.nbytes = tuple(int(s) for s in shape), dtype, nbytes
        view._ptr, view._free, view._base = driver.CUdeviceptr(self.ptr + byte_offset), None, self
        return view

    @property
    def ptr(self) -> int:
        return int(self._ptr)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __del__(self) -> None:
        if getattr(self, "_ptr", None) is not None and getattr(self, "_free", None) is not None:
            self._free(self._ptr)
        self._ptr = None

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": interface_typestr(self.dtype), "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": None}  # one harness stream: no cross-stream sync needed

    def upload(self, host: np.ndarray) -> DeviceArray:
        from cuda.bindings import driver

        host = np.ascontiguousarray(host)
        if host.shape != self.shape or host.dtype != self.dtype:
            raise ValueError(f"host array {host.shape} {host.dtype} does not match {self.shape} {self.dtype}")
        if self.nbytes:
            check_driver(driver.cuMemcpyHtoDAsync(self._ptr, host.ctypes.data, self.nbytes, stream_handle()))
            synchronize()  # the host array may be freed once we return
        return self

    def download(self) -> np.ndarray:
        from cuda.bindings import driver

        host = np.empty(self.shape, dtype=self.dtype)
        if self.nbytes:
            synchronize()
            check_driver(driver.cuMemcpyDtoH(host.ctypes.data, self._ptr, self.nbytes))
        return host

    def fill_u16(self, bits: int) -> None:
        """Set every 16-bit word (e.g. to bf16 NaN before a launch), asynchronously on the stream."""
        from cuda.bindings import driver

        if self.dtype.itemsize != 2:
            raise ValueError(f"fill_u16 needs a 2-byte dtype, got {self.dtype}")
        if self.nbytes:
            check_driver(driver.cuMemsetD16Async(self._ptr, bits, self.size, stream_handle()))

    def fill_u32(self, bits: int) -> None:
        """Set every 32-bit word (e.g. to fp32 NaN before a launch), asynchronously on the stream."""
        from cuda.bindings import driver

        if self.dtype.itemsize != 4:
            raise ValueError(f"fill_u32 needs a 4-byte dtype, got {self.dtype}")
        if self.nbytes:
            check_driver(driver.cuMemsetD32Async(self._ptr, bits, self.size, stream_handle()))


def poison(output: Any) -> None:
    """Fill an output (a DeviceArray, or a peer's output with the same fill methods) with its dtype's NaN."""
    dtype = np.dtype(output.dtype)
    if dtype not in NAN_BITS:
        raise ValueError(f"no NaN poison for a {dtype} output; outputs are {', '.join(map(str, NAN_BITS))}")
    if dtype.itemsize == 2:
        output.fill_u16(NAN_BITS[dtype])
    else:
        output.fill_u32(NAN_BITS[dtype])


def to_device(host: np.ndarray) -> DeviceArray:
    host = np.ascontiguousarray(host)
    return DeviceArray(host.shape, host.dtype).upload(host)


def host_b(problem: Problem, layout: BLayout) -> np.ndarray:
    """B as uploaded: the logical [E, K, N] ("kn"), or B^T [E, N, K] ("nk"), the K-major layout FP8 wgmma
    reads both operands in. dC of a ragged-K problem has one layout, [M_tot, N]."""
    if layout == "kn":
        return problem.b
    if layout != "nk":
        raise ValueError(f"B's layout must be 'kn' or 'nk', got {layout!r}")
    if problem.ragged != "M":
        raise ValueError("only a ragged-M problem's B [E, K, N] has a K-major layout; dC is [M_tot, N]")
    return np.ascontiguousarray(problem.b.transpose(0, 2, 1))


def output_spec(problem: Problem, columns: int | None = None) -> tuple[tuple[int, ...], np.dtype]:
    """The output's shape and dtype: C [M_tot, N] or dB [E, K, N] in the problem's output dtype;
    ``columns`` narrows C's last axis (k6's fused SwiGLU writes N / 2)."""
    shape = problem.out_shape
    if columns is not None:
        if problem.ragged != "M":
            raise ValueError("only a ragged-M problem's C [M_tot, N] has columns to narrow")
        shape = (shape[0], columns)
    return shape, problem.out_dtype


class DeviceProblem:
    """A problem's inputs on the device: A, B (or dC), the int32 expert offsets, for fp8 the scales, plus
    the host copy. ``b_layout="nk"`` uploads B^T [E, N, K] in place of B (see :func:`host_b`)."""

    def __init__(self, problem: Problem, b_layout: BLayout = "kn") -> None:
        self.problem = problem
        self.b_layout = b_layout
        self.a = to_device(problem.a)
        self.b = to_device(host_b(problem, b_layout))
        self.offsets = to_device(expert_offsets(problem.counts).astype(np.int32))
        self.scale_a = None if problem.scale_a is None else to_device(problem.scale_a)
        self.scale_b = None if problem.scale_b is None else to_device(problem.scale_b)

    def rerouted(self, counts: np.ndarray) -> DeviceProblem:
        """The same inputs on the device under another routing of the same M_tot (only the offsets are
        uploaded): for timing a configuration on a routing the inputs were not drawn for."""
        other = object.__new__(DeviceProblem)
        other.problem = dataclasses.replace(self.problem, counts=np.asarray(counts, dtype=np.int64), skew=float("nan"))
        other.b_layout, other.a, other.b = self.b_layout, self.a, self.b
        other.scale_a, other.scale_b = self.scale_a, self.scale_b
        other.offsets = to_device(expert_offsets(other.problem.counts).astype(np.int32))
        return other

    def new_output(self, columns: int | None = None) -> DeviceArray:
        """The output (:func:`output_spec`), poisoned with NaN so an unwritten element cannot pass a check."""
        out = DeviceArray(*output_spec(self.problem, columns))
        poison(out)
        return out
