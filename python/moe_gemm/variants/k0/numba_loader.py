"""numba-cuda kernels: load them from kernels/, read what the compiler reports, launch on the harness stream.

Chapter 01's kernel is Python (``kernels/k0_fp32.py``), kept beside the CUDA C++ kernels of the
later chapters rather than inside the package, so it is loaded here by path, once per process.
Whether it compiles for the GPU or runs in numba's CUDA simulator is decided when numba is first
imported (``NUMBA_ENABLE_CUDASIM=1``), so a process is one or the other for its whole life; the
simulator runs therefore happen in a child process (see ``moe_gemm.variants.k0``).

numba, torch, the NVRTC kernels and cuda.core all work in the device's primary context, so a
numba kernel launched on :func:`numba_stream` (the harness stream, wrapped) is ordered and timed
exactly like the others.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from types import ModuleType
from typing import Any

from moe_gemm.core.paths import KERNEL_DIR
from moe_gemm.cuda.variant import Resources

MODULE_PREFIX = "moe_gemm_kernel_"  # the kernels' names in sys.modules (they are not a package)


@functools.cache
def load_kernel_module(stem: str) -> ModuleType:
    """Import ``kernels/<stem>.py`` (once) and return it."""
    path = KERNEL_DIR / f"{stem}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no kernel source {path}")
    name = MODULE_PREFIX + stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # numba and tracebacks look functions' modules up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def simulator_enabled() -> bool:
    """True when numba runs kernels in its CUDA simulator in this process."""
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def kernel_resources(compiled: Any, warps_per_block: int) -> Resources:
    """What the driver reports for a compiled numba kernel (``dispatcher.compile(signature)``).

    Local memory per thread stands in for spills: it is where ptxas spills registers, and also
    where a local array ends up when the compiler cannot keep it in registers. Either is a
    defect in a kernel of this tutorial, so any nonzero value is reported.
    """
    return Resources(registers=int(compiled.regs_per_thread), smem_bytes=int(compiled.shared_mem_per_block),
                     spill_bytes=int(compiled.local_mem_per_thread), warps_per_block=warps_per_block)


def numba_stream():
    """The harness stream as a numba stream object, for ``kernel[grid, block, stream](...)``."""
    from numba import cuda

    from moe_gemm.cuda.device import stream_handle

    return cuda.external_stream(stream_handle())


def as_numba_array(array: Any):
    """A numba device-array view of anything with ``__cuda_array_interface__`` (no copy).

    Converting once, when a launch is prepared, keeps the per-launch cost down to numba's
    argument packing; bf16 buffers arrive as uint16, which is what the kernels expect.
    """
    from numba import cuda

    return cuda.as_cuda_array(array, sync=False)
