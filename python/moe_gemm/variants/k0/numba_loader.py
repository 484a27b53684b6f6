"""numba-cuda kernels: load them from kernels/, read what the compiler reports, launch on the harness stream.

Chapter 01's kernel is Python (``kernels/k0_fp32.py``), kept beside the CUDA C++ kernels of the
later chapters rather than inside the package, so it is loaded here by path, once per process.
Whether it compiles for the GPU or runs in numba's CUDA simulator is decided when numba is first
imported (``NUMBA_ENABLE_CUDASIM=1``), so a process is one or the other for its whole life; the
simulator runs therefore happen in a child process (see ``moe_gemm.variants.k0``).

numba, torch, the NVRTC kernels and cuda.core all work in the device's primary context, so a
numba kernel launched on :func:`numba_stream` (the harness stream, wrapped) is ordered and timed
exactly like the others.

numba-cuda 0.30.4 cannot compile for the GPU with numpy 2.5 or newer: its first compile registers
an overload of ``np.row_stack``, which numpy 2.5 removed, and fails with an AttributeError deep in
numba (NVIDIA/numba-cuda#907; numba-cuda is in maintenance mode and closed it unfixed).
:func:`numba_cuda_problem` says so in one line before anything is compiled, with the fix; the
simulator does not reach that code and runs either way.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import itertools
import sys
from types import ModuleType
from typing import Any

from moe_gemm.core.paths import KERNEL_DIR
from moe_gemm.cuda.variant import Resources

MODULE_PREFIX = "moe_gemm_kernel_"  # the kernels' names in sys.modules (they are not a package)
NUMPY_FIX = 'python -m pip install "numpy<2.5"'
# The newest numba-cuda known to call np.row_stack unconditionally; a later release is trusted to
# have the guard (numba 0.67 has it), and K0Fp32.compile still turns the AttributeError into this
# module's message if it does not.
ROW_STACK_NUMBA_CUDA = (0, 30, 4)


def _version_tuple(version: str) -> tuple[int, ...]:
    """'0.30.4' -> (0, 30, 4); '0.31.0rc1' -> (0, 31, 0): the leading numbers of each part."""
    parts = []
    for part in version.split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def numba_cuda_version() -> str | None:
    """The installed numba-cuda's version, without importing it; None if it is not installed."""
    try:
        return importlib.metadata.version("numba-cuda")
    except importlib.metadata.PackageNotFoundError:
        return None


def numba_cuda_problem() -> str | None:
    """One line saying why numba-cuda cannot compile k0 with this numpy, and what to do; None if it can.

    It asks numpy and the package metadata only: nothing is imported from numba, nothing compiled.
    """
    import numpy

    if hasattr(numpy, "row_stack"):
        return None
    version = numba_cuda_version()
    if version is None or _version_tuple(version) > ROW_STACK_NUMBA_CUDA:
        return None
    return row_stack_message(version)


def row_stack_message(version: str | None = None) -> str:
    import numpy

    return (f"k0 cannot be compiled here: numba-cuda {version or '(this version)'} calls np.row_stack, which "
            f"numpy {numpy.__version__} no longer has (removed in numpy 2.5); to run k0: {NUMPY_FIX}")


def require_numba_cuda() -> None:
    """ValueError with :func:`numba_cuda_problem`'s line where numba-cuda cannot compile k0."""
    problem = numba_cuda_problem()
    if problem is not None:
        raise ValueError(problem)


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
