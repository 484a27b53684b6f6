"""k0: the FP32 baseline (kernels/k0_fp32.py, numba-cuda), chapter 01.

One 256-thread block per 64 x 64 tile of the flat tile list, K in slices of 16, bf16 inputs
widened to fp32 in shared memory, fp32 accumulation, one bf16 rounding at the store.

What the kernel cannot take is refused here, before any launch, with a ValueError naming the
rule: K must be a positive multiple of BK = 16 (there is no K tail), the inputs must be bf16 of the
problem's shapes, and the GPU must be one that CUDA 13 (numba-cuda's compiler here) targets. A
numpy that numba-cuda cannot compile with (2.5 and newer, for numba-cuda 0.30.4) is refused when
the variant is made, with the one-line fix (:func:`.numba_loader.numba_cuda_problem`).
N and the row counts are free: the kernel guards rows at each expert's end and columns at N.

The same kernel also runs in numba's CUDA simulator, with no GPU: :mod:`.simulator`.
"""

from __future__ import annotations

import numpy as np

from moe_gemm.cuda.device import DeviceProblem, to_device
from moe_gemm.cuda.gpu import detect_gpu, require_capability
from moe_gemm.cuda.variant import Prepared, Resources
from moe_gemm.model.problem import BF16
from moe_gemm.model.tiles import tile_list
from moe_gemm.variants.compiled import require_takes
from moe_gemm.variants.k0.numba_loader import (
    as_numba_array,
    kernel_resources,
    load_kernel_module,
    numba_cuda_problem,
    numba_stream,
    require_numba_cuda,
    row_stack_message,
)

KERNEL_STEM = "k0_fp32"  # kernels/k0_fp32.py
KERNEL_FUNCTION = "k0_fp32"
# The kernel's configuration, repeated here so that importing this module does not import numba
# (which would fix the simulator switch for the whole process); kernel_module() checks they agree.
BM, BN, BK = 64, 64, 16
THREADS = 256
WARPS_PER_BLOCK = THREADS // 32
# bf16 travels as its 16-bit words: A [M_tot, K], B [E, K, N], tiles [T, 4] int32, C [M_tot, N].
SIGNATURE = "void(uint16[:, ::1], uint16[:, :, ::1], int32[:, ::1], uint16[:, ::1])"
MIN_CAPABILITY = (7, 5)  # CUDA 13, whose NVVM numba-cuda compiles with here, targets sm_75 and newer
# SASS instructions the chapter talks about (static counts): the FFMAs of the unrolled inner loop,
# its 16-byte shared loads (every LDS should be an LDS.128), the bf16 loads and stores, the two
# barriers, and local memory (LDL/STL), which must not appear at all.
SASS_OPCODES = ("FFMA", "LDS.128", "LDS", "LDG.E.U16", "STS", "BAR.SYNC", "STG.E.U16", "LDL", "STL")


# --8<-- [start:checks]
def check_inputs(K: int, N: int) -> None:
    """ValueError naming the first rule of the kernel that these inputs break."""
    if K < 1 or K % BK:
        raise ValueError(f"k0 needs K to be a positive multiple of BK = {BK} (it stages whole "
                         f"K slices and has no K tail), got K = {K}")
    if N < 1:
        raise ValueError(f"k0 needs N >= 1, got N = {N}")
# --8<-- [end:checks]


def micro_tile_origin(thread: int) -> tuple[int, int]:
    """(row, column) in the 64 x 64 tile of the first element of ``thread``'s 4 x 4 micro-tile.

    The kernel's own map (kernels/k0_fp32.py, section "tile"), written out for the chapter's
    figure and tests: warps tile the block 4 x 2, a warp's 32 lanes tile its 16 x 32 patch 4 x 8.
    """
    warp, lane = divmod(thread, 32)
    return (warp // 2 * 4 + lane // 8) * 4, (warp % 2 * 8 + lane % 8) * 4


def kernel_module():
    module = load_kernel_module(KERNEL_STEM)
    kernel_config = (module.BM, module.BN, module.BK, module.THREADS)
    if kernel_config != (BM, BN, BK, THREADS):
        raise RuntimeError(f"kernels/{KERNEL_STEM}.py has (BM, BN, BK, THREADS) = {kernel_config}, "
                           f"but its wrapper expects {(BM, BN, BK, THREADS)}")
    return module


class K0Fp32:
    """The variant ``k0``: the numba FP32 kernel over the 64 x 64 flat tile list."""

    name = "k0"
    bm, bn, bk = BM, BN, BK
    kernel_function = KERNEL_FUNCTION
    source = f"{KERNEL_STEM}.py"  # under kernels/
    kernel_name = KERNEL_FUNCTION

    def __init__(self) -> None:
        # Before anything is compiled: numba-cuda 0.30.4 fails its first compile under numpy >= 2.5.
        require_numba_cuda()

    def __repr__(self) -> str:
        return "K0Fp32()"

    def compile(self):
        """The kernel compiled for the current GPU (numba's ``_Kernel``; compiled once per process)."""
        try:
            return kernel_module().k0_fp32.compile(SIGNATURE)
        except AttributeError as error:
            if "row_stack" in str(error):  # a numba-cuda newer than numba_loader knows, still without the guard
                raise ValueError(row_stack_message()) from error
            raise

    def resources(self) -> Resources:
        """Registers, shared memory and local memory as the driver reports them for the compiled kernel."""
        return kernel_resources(self.compile(), WARPS_PER_BLOCK)

    def sass_counts(self) -> dict[str, int]:
        """Static counts of :data:`SASS_OPCODES` in the compiled kernel (numba's inspect_sass; nvdisasm
        from the nvidia-cuda-nvdisasm wheel)."""
        from moe_gemm.cuda.sass import opcode_counts

        return opcode_counts(self.compile().inspect_sass(), SASS_OPCODES)

    def prepare(self, dev: DeviceProblem) -> Prepared:
        require_numba_cuda()
        problem = dev.problem
        require_takes(self.name, problem)
        for name, array, shape in (("A", dev.a, problem.a.shape), ("B", dev.b, problem.b.shape)):
            if array.dtype != BF16 or tuple(array.shape) != tuple(shape):
                raise ValueError(f"k0 needs {name} as bf16 {shape} on the device, got {array.dtype} {array.shape}")
        check_inputs(problem.K, problem.N)
        require_capability(detect_gpu(), MIN_CAPABILITY, "k0 (numba-cuda, compiled by CUDA 13)")
        return self.prepare_tiles(dev, tile_list(problem.counts, problem.N, BM, BN))

    # --8<-- [start:launch]
    def prepare_tiles(self, dev: DeviceProblem, tiles_host: np.ndarray) -> Prepared:
        """A launch over the given tile descriptors: :meth:`prepare` passes the full
        list; a test can pass fewer to see the NaN poison of the tiles nobody wrote."""
        resources = self.resources()
        output = dev.new_output()  # NaN-poisoned (and again before every run)
        if tiles_host.shape[0] == 0:  # M_tot = 0: no tile, no launch, an empty C
            return Prepared(launch=lambda: None, output=output, bm=BM, bn=BN,
                            resources=resources)
        tiles = to_device(np.ascontiguousarray(tiles_host, dtype=np.int32))
        # One block per tile, on the harness stream: the timing events bracket it.
        grid = int(tiles_host.shape[0])
        configured = kernel_module().k0_fp32[grid, THREADS, numba_stream()]
        args = tuple(as_numba_array(x) for x in (dev.a, dev.b, tiles, output))

        def run() -> None:
            configured(*args)

        return Prepared(launch=run, output=output, bm=BM, bn=BN, resources=resources,
                        keep_alive=[tiles, dev, args])
    # --8<-- [end:launch]


def runnable_k0() -> list[K0Fp32]:
    """``[K0Fp32()]`` where numba-cuda can compile it; else ``[]``, after printing the one line that
    says why and what to do, so that a chapter runs its other kernels without k0."""
    problem = numba_cuda_problem()
    if problem is not None:
        print(problem, flush=True)
        return []
    return [K0Fp32()]


# Names the by-name entry points (sanitizer and profiler targets) resolve; see variants/registry.py.
VARIANTS = {"k0": K0Fp32}
