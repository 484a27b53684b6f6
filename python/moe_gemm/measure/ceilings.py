"""Measured ceilings: the fastest each path of the GPU goes here, measured in the same run.

A chapter's %SOL is only as honest as its ceiling, and a datasheet peak is not one: clocks,
power and the instruction a kernel actually uses all matter. So each chapter that needs a
ceiling measures it, with the same event timing as the kernels:

* :func:`copy_tbps`: device-to-device ``cuMemcpyDtoDAsync`` of about 2 GB, read + write bytes
  counted (the roofline's bandwidth);
* :func:`dense_bf16_tflops`: ``torch.matmul`` 8192^3 in bf16 (cuBLAS; the roofline's FLOP rate);
* :func:`ffma_tflops`: register-only FP32 FFMA chains (``kernels/ceiling_ffma.cu``), k0's ceiling;
* :func:`mma_sync_tflops`: register-only bf16 ``mma.sync`` m16n8k16 (``kernels/ceiling_mma_sync.cu``),
  the ceiling of k1 and k2, which issue exactly that instruction;
* :func:`wgmma_tflops`: bf16 ``wgmma`` m64n256k16 on operands held in shared memory, nothing else in
  the loop (``kernels/ceiling_wgmma.cu``): the tensor pipe's peak on Hopper, the ceiling of k3 onward
  and the compute side of the roofline;
* :func:`wgmma_e4m3_tflops`: the same with fp8 e4m3 ``wgmma`` m64n256k32 (``kernels/ceiling_wgmma_e4m3.cu``),
  the compute side of chapter 10's FP8 roofline.

:func:`measure_ceilings` returns them as records named ``ceiling/...``. The roofline every chapter
and page uses is drawn from one record of them per GPU, ``ceilings/<gpu>.json``, written by
``python -m moe_gemm.measure.ceilings`` on that GPU (:func:`roofline_basis`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moe_gemm.core.cli import chapter_parser, run_main
from moe_gemm.core.paths import REPO_ROOT
from moe_gemm.cuda.timing import time_launches
from moe_gemm.measure.results import RECORDED_GPU, load_results, write_results
from moe_gemm.model.roofline import RooflineBasis

COPY_BYTES = 2 * 1024**3  # large enough that the L2 (60 MB) plays no part
DENSE_SIZE = 8192
BLOCKS_PER_SM = 4  # 4 x 256 threads: 8 warps per scheduler for the register-only kernels
FFMA_CHAINS = 8  # must match CEILING_FFMA_CHAINS in kernels/ceiling_ffma.cu
FFMA_ITERATIONS = 100_000
MMA_CHAINS = 8  # must match CEILING_MMA_CHAINS in kernels/ceiling_mma_sync.cu
MMA_ITERATIONS = 20_000
MMA_FLOP = 2 * 16 * 8 * 16
THREADS = 256
WGMMA_N = 256  # must match CEILING_WGMMA_N in kernels/ceiling_wgmma.cuh
WGMMA_K16 = 4  # must match CEILING_WGMMA_K16
WGMMA_WARPGROUPS = 2  # must match CEILING_WGMMA_WARPGROUPS
WGMMA_ITERATIONS = 20_000
CEILINGS_DIR = REPO_ROOT / "ceilings"


@dataclass(frozen=True)
class CeilingKernel:
    """A microbenchmark kernel of kernels/: its file, its name, and the instruction it times."""

    source: str
    name: str
    instruction: str  # the SASS mnemonic prefix it must compile to
    arches: tuple[str, ...]  # what it runs on: mma.sync from sm_80, wgmma on sm_90a only


CEILING_KERNELS = {
    "ceiling/ffma": CeilingKernel("ceiling_ffma.cu", "ceiling_ffma", "FFMA", ("sm_80", "sm_90a")),
    "ceiling/mma_sync": CeilingKernel("ceiling_mma_sync.cu", "ceiling_mma_sync", "HMMA.16816.F32.BF16",
                                      ("sm_80", "sm_90a")),
    "ceiling/wgmma": CeilingKernel("ceiling_wgmma.cu", "ceiling_wgmma", "HGMMA", ("sm_90a",)),
    "ceiling/wgmma_e4m3": CeilingKernel("ceiling_wgmma_e4m3.cu", "ceiling_wgmma_e4m3", "QGMMA", ("sm_90a",)),
}


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


def _register_only(source: str, name: str, flop_per_thread: float, *extra: Any, blocks_per_sm: int = BLOCKS_PER_SM,
                   threads: int = THREADS, **timing: int) -> float:
    """Launch a microbenchmark kernel on every SM and return its FLOP rate in TFLOP/s."""
    from moe_gemm.cuda.device import DeviceArray
    from moe_gemm.cuda.gpu import detect_gpu
    from moe_gemm.cuda.launch import launch
    from moe_gemm.cuda.nvrtc import compile_kernel

    gpu = detect_gpu()
    if gpu is None:
        raise ValueError("the register-only ceilings need an NVIDIA GPU")
    kernel = compile_kernel(source, name, arch=gpu.arch).require_no_spills()
    blocks = gpu.sm_count * blocks_per_sm
    out = DeviceArray((blocks * threads,), np.float32)
    result = time_launches(lambda _: launch(kernel, blocks, threads, 0, out.ptr, *extra),
                           **{"warmup": 3, "iterations": 10, **timing})
    return flop_per_thread * blocks * threads / (result.median_ms * 1e-3) / 1e12


def ffma_tflops(steps: int = FFMA_ITERATIONS, **timing: int) -> float:
    """FP32 FFMA throughput of the CUDA cores, in TFLOP/s (``steps`` trips of the kernel's loop)."""
    return _register_only("ceiling_ffma.cu", "ceiling_ffma", 2.0 * FFMA_CHAINS * steps,
                          np.int32(steps), np.float32(0.9999), np.float32(1e-3), **timing)


def mma_sync_tflops(steps: int = MMA_ITERATIONS, **timing: int) -> float:
    """bf16 mma.sync m16n8k16 throughput with fp32 accumulation, in TFLOP/s (``steps`` loop trips)."""
    per_warp = MMA_FLOP * MMA_CHAINS * steps
    return _register_only("ceiling_mma_sync.cu", "ceiling_mma_sync", per_warp / 32,
                          np.int32(steps), np.uint32(0x9E3779B9), **timing)


def wgmma_tflops(steps: int = WGMMA_ITERATIONS, **timing: int) -> float:
    """bf16 wgmma m64n256k16 throughput with fp32 accumulation, in TFLOP/s: one block of two
    warpgroups per SM (each with a 64 x 256 accumulator of 128 registers per thread)."""
    from moe_gemm.cuda.descriptors import operand_plan

    per_warpgroup = 2 * 64 * WGMMA_N * 16 * WGMMA_K16 * steps
    return _register_only("ceiling_wgmma.cu", "ceiling_wgmma", per_warpgroup / 128, np.int32(steps),
                          np.uint64(operand_plan("K").bits), blocks_per_sm=1, threads=128 * WGMMA_WARPGROUPS,
                          **timing)


def wgmma_e4m3_tflops(steps: int = WGMMA_ITERATIONS, **timing: int) -> float:
    """fp8 e4m3 wgmma m64n256k32 throughput with fp32 accumulators, in TFLOP/s: the same loop with twice the
    K per instruction (chapter 10's roofline)."""
    from moe_gemm.cuda.descriptors import operand_plan

    per_warpgroup = 2 * 64 * WGMMA_N * 32 * WGMMA_K16 * steps
    return _register_only("ceiling_wgmma_e4m3.cu", "ceiling_wgmma_e4m3", per_warpgroup / 128, np.int32(steps),
                          np.uint64(operand_plan("K").bits), blocks_per_sm=1, threads=128 * WGMMA_WARPGROUPS,
                          **timing)


def roofline_ceilings() -> list[dict[str, Any]]:
    """The roofline's two ceilings, measured now: the device copy and, where torch is installed,
    cuBLAS bf16 at DENSE_SIZE (records ``{"variant": "ceiling/...", ...}``)."""
    records: list[dict[str, Any]] = [{"variant": "ceiling/copy", "tbps": copy_tbps(), "bytes": 2 * COPY_BYTES}]
    dense = dense_bf16_tflops()
    if dense is not None:
        records.append({"variant": "ceiling/dense_bf16", "tflops": dense, "size": DENSE_SIZE})
    return records


def measure_ceilings() -> list[dict[str, Any]]:
    """Every ceiling this GPU can measure: copy and cuBLAS, then FFMA, mma.sync and (sm_90a) wgmma in bf16 and
    in fp8 e4m3."""
    from moe_gemm.cuda.gpu import detect_gpu

    records = roofline_ceilings()
    records.append({"variant": "ceiling/ffma", "tflops": ffma_tflops()})
    records.append({"variant": "ceiling/mma_sync", "tflops": mma_sync_tflops()})
    gpu = detect_gpu()
    if gpu is not None and gpu.arch == "sm_90a":
        records.append({"variant": "ceiling/wgmma", "tflops": wgmma_tflops()})
        records.append({"variant": "ceiling/wgmma_e4m3", "tflops": wgmma_e4m3_tflops()})
    return records


def ceiling_value(ceilings: list[dict[str, Any]], name: str) -> float | None:
    """The number of one ceiling record (TFLOP/s, or TB/s for the copy), if measured."""
    for record in ceilings:
        if record.get("variant") == f"ceiling/{name}":
            return record.get("tflops", record.get("tbps"))
    return None


# --------------------------------------------------------------------------- the one record per GPU

def ceilings_path(gpu_slug: str = RECORDED_GPU, root: Path = REPO_ROOT) -> Path:
    return root / CEILINGS_DIR.name / f"{gpu_slug}.json"


def recorded_ceilings(gpu_slug: str = RECORDED_GPU, root: Path = REPO_ROOT) -> list[dict[str, Any]] | None:
    path = ceilings_path(gpu_slug, root)
    return load_results(path)["ceilings"] if path.is_file() else None


def roofline_basis(gpu_slug: str = RECORDED_GPU, root: Path = REPO_ROOT) -> RooflineBasis:
    """The roofline of ``gpu_slug``'s ceilings record: the tensor pipe's peak (wgmma on Hopper; mma.sync
    on a GPU without wgmma) and the device copy.

    ValueError naming the command that makes the record when there is none."""
    records = recorded_ceilings(gpu_slug, root) or []
    instruction = "wgmma" if ceiling_value(records, "wgmma") is not None else "mma_sync"
    tensor, copy = ceiling_value(records, instruction), ceiling_value(records, "copy")
    if tensor is None or copy is None:
        raise ValueError(f"no tensor-pipe and copy ceilings recorded for {gpu_slug} in "
                         f"{ceilings_path(gpu_slug, root)}: on that GPU, run python -m moe_gemm.measure.ceilings")
    return RooflineBasis(tensor, copy, f"{instruction.replace('_', '.')} peak and device copy measured on the "
                                       f"{gpu_slug.upper()} (ceilings/{gpu_slug}.json)",
                         fp8_tensor_tflops=ceiling_value(records, "wgmma_e4m3"))


def record_ceilings(gpu: Any) -> Path:
    """Measure every ceiling of ``gpu`` now and write ceilings/<gpu>.json."""
    from moe_gemm.measure.provenance import provenance

    return write_results(ceilings_path(gpu.slug), [], provenance(gpu), extra={"ceilings": measure_ceilings()})


def basis_for(gpu: Any) -> RooflineBasis:
    """The roofline of the GPU a chapter runs on: its ceilings record, measured first if it has none."""
    if ceiling_value(recorded_ceilings(gpu.slug) or [], "copy") is None:
        from moe_gemm.measure.check import progress

        progress(f"[ceilings] none recorded for {gpu.name}: measuring them (python -m moe_gemm.measure.ceilings)")
        record_ceilings(gpu)
    return roofline_basis(gpu.slug)


def main(argv: Sequence[str] | None = None) -> int:
    parser = chapter_parser("Measure every ceiling of this GPU and write ceilings/<gpu>.json, the record every "
                            "chapter's roofline reads.", prog="python -m moe_gemm.measure.ceilings")
    parser.parse_args(argv)
    from moe_gemm.cuda.gpu import detect_gpu

    gpu = detect_gpu()
    if gpu is None:
        print("the ceilings are measured on a GPU; none was found", file=sys.stderr)
        return 2
    path = record_ceilings(gpu)
    for record in recorded_ceilings(gpu.slug):
        value = record.get("tflops", record.get("tbps"))
        print(f"{record['variant']:<20} {value:10.2f} {'TB/s' if 'tbps' in record else 'TFLOP/s'}")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    run_main(main)
