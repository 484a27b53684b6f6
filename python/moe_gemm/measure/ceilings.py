"""Measured ceilings: the fastest each path of the GPU goes here, measured in the same run.

A chapter's %SOL is only as honest as its ceiling, and a datasheet peak is not one: clocks,
power and the instruction a kernel actually uses all matter. So each chapter that needs a
ceiling measures it, with the same event timing as the kernels:

* :func:`copy_tbps`: device-to-device ``cuMemcpyDtoDAsync`` of about 2 GB, read + write bytes
  counted (the roofline's bandwidth);
* :func:`dense_bf16_tflops`: ``torch.matmul`` 8192^3 in bf16 (cuBLAS; the roofline's FLOP rate);
* :func:`ffma_tflops`: register-only FP32 FFMA chains (``kernels/ceiling_ffma.cu``), k0's ceiling;
* :func:`mma_sync_tflops`: register-only bf16 ``mma.sync`` m16n8k16 (``kernels/ceiling_mma_sync.cu``),
  the ceiling of k1 and k2, which issue exactly that instruction.

:func:`measure_ceilings` returns them as records named ``ceiling/...`` for a results file.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moe_gemm.cuda.timing import time_launches

COPY_BYTES = 2 * 1024**3  # large enough that the L2 (60 MB) plays no part
DENSE_SIZE = 8192
BLOCKS_PER_SM = 4  # 4 x 256 threads: 8 warps per scheduler for the register-only kernels
FFMA_CHAINS = 8  # must match CEILING_FFMA_CHAINS in kernels/ceiling_ffma.cu
FFMA_ITERATIONS = 100_000
MMA_CHAINS = 8  # must match CEILING_MMA_CHAINS in kernels/ceiling_mma_sync.cu
MMA_ITERATIONS = 20_000
MMA_FLOP = 2 * 16 * 8 * 16
THREADS = 256


def copy_tbps(nbytes: int = COPY_BYTES, **timing: int) -> float:
    """Device-to-device copy bandwidth in TB/s, counting the bytes read and the bytes written."""
    from cuda.bindings import driver

    from moe_gemm.cuda.device import DeviceArray, check_driver, stream_handle

    src, dst = DeviceArray((nbytes,), np.uint8), DeviceArray((nbytes,), np.uint8)
    check_driver(driver.cuMemsetD8Async(src.ptr, 0x5A, nbytes, stream_handle()))  # touch every page

    def copy(_: int) -> None:
        check_driver(driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, stream_handle()))

    result = time_launches(copy, **{"warmup": 3, "iterations": 20, **timing})
    return 2 * nbytes / (result.median_ms * 1e-3) / 1e12


def dense_bf16_tflops(size: int = DENSE_SIZE, **timing: int) -> float | None:
    """cuBLAS bf16 GEMM (``torch.matmul``, size^3, random data) in TFLOP/s; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    from moe_gemm.cuda.device import cuda_device, stream_handle

    cuda_device()
    with torch.cuda.stream(torch.cuda.ExternalStream(stream_handle())):
        generator = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=generator)
        b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=generator)
        c = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
        result = time_launches(lambda _: torch.matmul(a, b, out=c), **{"warmup": 10, "iterations": 50, **timing})
    return 2 * size**3 / (result.median_ms * 1e-3) / 1e12


def _register_only(source: str, name: str, flop_per_thread: float, *extra: Any, **timing: int) -> float:
    """Launch a register-only kernel on every SM and return its FLOP rate in TFLOP/s."""
    from moe_gemm.cuda.device import DeviceArray
    from moe_gemm.cuda.gpu import detect_gpu
    from moe_gemm.cuda.launch import launch
    from moe_gemm.cuda.nvrtc import compile_kernel

    gpu = detect_gpu()
    if gpu is None:
        raise ValueError("the register-only ceilings need an NVIDIA GPU")
    kernel = compile_kernel(source, name, arch=gpu.arch).require_no_spills()
    blocks = gpu.sm_count * BLOCKS_PER_SM
    out = DeviceArray((blocks * THREADS,), np.float32)
    result = time_launches(lambda _: launch(kernel, blocks, THREADS, 0, out.ptr, *extra),
                           **{"warmup": 3, "iterations": 10, **timing})
    return flop_per_thread * blocks * THREADS / (result.median_ms * 1e-3) / 1e12


def ffma_tflops(steps: int = FFMA_ITERATIONS, **timing: int) -> float:
    """FP32 FFMA throughput of the CUDA cores, in TFLOP/s (``steps`` trips of the kernel's loop)."""
    return _register_only("ceiling_ffma.cu", "ceiling_ffma", 2.0 * FFMA_CHAINS * steps,
                          np.int32(steps), np.float32(0.9999), np.float32(1e-3), **timing)


def mma_sync_tflops(steps: int = MMA_ITERATIONS, **timing: int) -> float:
    """bf16 mma.sync m16n8k16 throughput with fp32 accumulation, in TFLOP/s (``steps`` loop trips)."""
    per_warp = MMA_FLOP * MMA_CHAINS * steps
    return _register_only("ceiling_mma_sync.cu", "ceiling_mma_sync", per_warp / 32,
                          np.int32(steps), np.uint32(0x9E3779B9), **timing)


def roofline_ceilings() -> list[dict[str, Any]]:
    """The roofline's two ceilings, measured now: the device copy and, where torch is installed,
    cuBLAS bf16 at DENSE_SIZE (records ``{"variant": "ceiling/...", ...}``)."""
    records: list[dict[str, Any]] = [{"variant": "ceiling/copy", "tbps": copy_tbps(), "bytes": 2 * COPY_BYTES}]
    dense = dense_bf16_tflops()
    if dense is not None:
        records.append({"variant": "ceiling/dense_bf16", "tflops": dense, "size": DENSE_SIZE})
    return records


def measure_ceilings() -> list[dict[str, Any]]:
    """Every ceiling this GPU can measure: the roofline's two, then the FFMA and mma.sync peaks."""
    records = roofline_ceilings()
    records.append({"variant": "ceiling/ffma", "tflops": ffma_tflops()})
    records.append({"variant": "ceiling/mma_sync", "tflops": mma_sync_tflops()})
    return records


def ceiling_value(ceilings: list[dict[str, Any]], name: str) -> float | None:
    """The number of one ceiling record (TFLOP/s, or TB/s for the copy), if measured."""
    for record in ceilings:
        if record.get("variant") == f"ceiling/{name}":
            return record.get("tflops", record.get("tbps"))
    return None

