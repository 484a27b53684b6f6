"""Compile the CUDA C++ kernels in ``kernels/`` at run time with NVRTC, and look inside them.

* :func:`compile_kernel` turns one kernel of one source file into a CUBIN for one exact
  architecture (``sm_90a`` on the H200; any of sm_80 / sm_90a / sm_100a / sm_103a without a
  GPU), with compile-time parameters passed as template arguments or ``-D`` defines.
* ptxas's ``-v`` report is parsed into a :class:`~moe_gemm.bench.Resources`-ready
  :class:`ResourceReport` (registers, shared memory, spills, stack frame).
* :func:`sass` disassembles the CUBIN with ``cuobjdump`` (the PyPI wheel's, so no CUDA toolkit
  is needed) and :func:`opcode_counts` counts the instructions a chapter is about.
* Results are cached on disk, keyed by the source, every header in ``kernels/``, the options,
  the architecture and the NVRTC version; a cache hit skips NVRTC entirely.
* :func:`launch` launches through cuda.core, or through ``cuLaunchKernel`` when an argument
  (a TMA tensor map) has to be passed by value as a 128-byte struct.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .results import REPO_ROOT, nvrtc_version

KERNEL_DIR = REPO_ROOT / "kernels"
ARCHES = ("sm_80", "sm_90a", "sm_100a", "sm_103a")
DEFAULT_SMEM_LIMIT = 48 * 1024  # more dynamic shared memory than this needs an explicit opt-in


INCLUDED_SOURCE = re.compile(r'^#include "([\w.]+\.cu)"', re.MULTILINE)


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries the file name and NVRTC's log."""


class ResourceError(RuntimeError):
    """A kernel spills registers or uses local memory, which this project does not accept."""


@dataclass(frozen=True)
class ResourceReport:
    """ptxas -v for one kernel."""

    registers: int
    static_smem_bytes: int
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    barriers: int

    @property
    def spill_bytes(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes


_REPORT_PATTERNS = {
    "registers": r"Used (\d+) registers",
    "static_smem_bytes": r"(\d+) bytes smem",
    "stack_frame_bytes": r"(\d+) bytes stack frame",
    "spill_store_bytes": r"(\d+) bytes spill stores",
    "spill_load_bytes": r"(\d+) bytes spill loads",
    "barriers": r"used (\d+) barriers",
}


def parse_ptxas_report(log: str, function: str) -> ResourceReport:
    """Pick ``function``'s lines out of a ptxas -v log (absent fields mean 0)."""
    start = log.find(f"Function properties for {function}")
    if start < 0:
        start = log.find(f"Compiling entry function '{function}'")
    if start < 0:
        raise ValueError(f"ptxas report has no entry for {function!r}:\n{log}")
    following = log.find("Compiling entry function", start + 1)
    block = log[start: following if following > 0 else len(log)]
    values = {key: int(m.group(1)) if (m := re.search(pattern, block)) else 0
              for key, pattern in _REPORT_PATTERNS.items()}
    return ResourceReport(**values)


@dataclass(frozen=True)
class CompiledKernel:
    """One kernel, compiled for one architecture."""

    source: str  # file name under kernels/
    name: str  # the C++ name expression, e.g. "k1_mma_sync<64, false>"
    symbol: str  # its mangled name in the CUBIN
    arch: str
    cubin: bytes
    report: ResourceReport
    log: str

    def sass(self, tool: str = "cuobjdump") -> str:
        return sass(self.cubin, tool)

    def require_no_spills(self) -> CompiledKernel:
        r = self.report
        if r.spill_bytes or r.stack_frame_bytes:
            raise ResourceError(
                f"{self.name} ({self.arch}) uses local memory: {r.stack_frame_bytes} bytes stack frame, "
                f"{r.spill_store_bytes} bytes spill stores, {r.spill_load_bytes} bytes spill loads")
        return self


def _cache_dir() -> Path:
    root = os.environ.get("MOE_GEMM_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moe_gemm"
    return Path(root) / "nvrtc"


def _define_flags(defines: Mapping[str, Any]) -> list[str]:
    return [f"{key}={int(value) if isinstance(value, bool) else value}" for key, value in sorted(defines.items())]


# The options every compile gets (see _nvrtc_compile); part of the cache key, so changing them
# here invalidates every cached CUBIN.
FIXED_OPTIONS = ("std=c++17", "lineinfo", "ptxas=-v,--warn-on-spills")


def _cache_key(source: str, name: str, arch: str, defines: list[str], options: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for part in (source, name, arch, nvrtc_version(), *FIXED_OPTIONS, *defines, *options):
        digest.update(part.encode() + b"\0")
    for header in sorted(KERNEL_DIR.glob("*.cuh")):  # every header a kernel may include
        digest.update(header.name.encode() + header.read_bytes())
    for included in INCLUDED_SOURCE.findall(source):  # another kernel's source (k5 builds on k3)
        digest.update(included.encode() + (KERNEL_DIR / included).read_bytes())
    return digest.hexdigest()[:32]


def target_arch(arch: str | None = None) -> str:
    """``arch`` if named, else the running GPU's (``sm_90a`` on an H200); ValueError with no GPU."""
    if arch is not None:
        return arch
    from .gpu import detect_gpu

    gpu = detect_gpu()
    if gpu is None:
        raise ValueError(f"no GPU here: name the architecture to compile for (one of {', '.join(ARCHES)})")
    return gpu.arch


def compile_kernel(
    source_file: str, name: str, *, arch: str | None = None, defines: Mapping[str, Any] | None = None,
    options: Iterable[str] = (), use_cache: bool = True,
) -> CompiledKernel:
    """Compile kernel ``name`` (a template instantiation is fine) of ``kernels/<source_file>``
    for ``arch``, or for the running GPU's architecture when ``arch`` is None."""
    arch = target_arch(arch)
    if arch not in ARCHES and not re.fullmatch(r"sm_\d+a?", arch):
        raise ValueError(f"arch must look like sm_90a (known: {', '.join(ARCHES)}), got {arch!r}")
    path = KERNEL_DIR / source_file
    if not path.is_file():
        raise ValueError(f"no kernel source {path}")
    source = path.read_text()
    define_flags, options = _define_flags(defines or {}), tuple(options)
    cache_file = _cache_dir() / f"{_cache_key(source, name, arch, define_flags, options)}.json"
    if use_cache and cache_file.is_file():
        meta = json.loads(cache_file.read_text())
        return CompiledKernel(source_file, name, meta["symbol"], arch, cache_file.with_suffix(".cubin").read_bytes(),
                              ResourceReport(**meta["report"]), meta["log"])
    compiled = _nvrtc_compile(source, source_file, name, arch, define_flags, options)
    _store(cache_file, compiled)
    return compiled


def _nvrtc_compile(source: str, source_file: str, name: str, arch: str, defines: list[str],
                   options: tuple[str, ...]) -> CompiledKernel:
    from cuda.core import Program, ProgramOptions

    program_options = ProgramOptions(
        arch=arch, std="c++17", name=source_file, include_path=[str(KERNEL_DIR)],
        define_macro=defines or None, lineinfo=True,
        # one flag per ptxas option; -v makes ptxas print the resource report into the log
        ptxas_options=["-v", "--warn-on-spills", *options],
    )
    log = io.StringIO()
    try:
        code = Program(source, "c++", program_options).compile("cubin", name_expressions=[name], logs=log)
    except Exception as error:  # cuda.core raises a generic error; re-raise with file and log
        raise CompileError(f"NVRTC failed to compile {name} from kernels/{source_file} for {arch}:\n"
                           f"{log.getvalue()}\n{error}") from None
    symbol = code.symbol_mapping.get(name, name)
    symbol = symbol.decode() if isinstance(symbol, bytes) else symbol
    text = log.getvalue()
    return CompiledKernel(source_file, name, symbol, arch, bytes(code.code), parse_ptxas_report(text, symbol), text)


def _store(cache_file: Path, compiled: CompiledKernel) -> None:
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.with_suffix(".cubin").write_bytes(compiled.cubin)
    meta = {"symbol": compiled.symbol, "report": asdict(compiled.report), "log": compiled.log}
    tmp = cache_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, cache_file)  # the .json appears last: its presence means the entry is whole


# --------------------------------------------------------------------------- SASS


def _tool(name: str) -> str:
    """A CUDA binary tool: the PyPI wheel's copy first (no toolkit needed), then PATH."""
    try:
        import nvidia

        for root in nvidia.__path__:
            for candidate in Path(root).glob(f"cu*/bin/{name}"):
                if os.access(candidate, os.X_OK):
                    return str(candidate)
    except ImportError:
        pass
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found: pip install nvidia-cuda-{name}")
    return found


def sass(cubin: bytes, tool: str = "cuobjdump") -> str:
    """The CUBIN's SASS: ``cuobjdump -sass``, or ``nvdisasm -c`` (which also labels branch targets)."""
    commands = {"cuobjdump": ["-sass"], "nvdisasm": ["-c"]}
    if tool not in commands:
        raise ValueError(f"tool must be one of {sorted(commands)}, got {tool!r}")
    scratch = _cache_dir() / f"sass-{os.getpid()}-{hashlib.sha256(cubin).hexdigest()[:16]}.cubin"
    scratch.parent.mkdir(parents=True, exist_ok=True)
    scratch.write_bytes(cubin)
    try:
        return subprocess.run([_tool(tool), *commands[tool], str(scratch)], capture_output=True, text=True,
                              check=True).stdout
    finally:
        scratch.unlink(missing_ok=True)


def opcode_counts(sass_text: str, opcodes: Iterable[str]) -> dict[str, int]:
    """Static count of instructions whose mnemonic starts with each prefix (e.g. 'HMMA.16816.F32.BF16')."""
    mnemonics = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass_text)
    return {op: sum(m.startswith(op) for m in mnemonics) for op in opcodes}


def sass_report(compiled: CompiledKernel, opcodes: Iterable[str] = ()) -> dict[str, Any]:
    """One row of a compile report: ptxas's resource report and static counts of ``opcodes``."""
    r = compiled.report
    return {"kernel": compiled.name, "arch": compiled.arch, "registers": r.registers,
            "static_smem_bytes": r.static_smem_bytes, "spill_bytes": r.spill_bytes,
            "stack_frame_bytes": r.stack_frame_bytes, **opcode_counts(compiled.sass(), opcodes)}


# --------------------------------------------------------------------------- loading and launching


class TensorMapArg:
    """A 128-byte CUtensorMap passed by value (a __grid_constant__ kernel parameter)."""

    def __init__(self, tensor_map: Any) -> None:
        self.tensor_map = tensor_map  # a cuda.bindings driver.CUtensorMap

    @property
    def address(self) -> int:
        return int(self.tensor_map.getPtr())


@functools.cache
def _loaded(cubin: bytes, symbol: str):
    from cuda.core import ObjectCode

    from .device import cuda_device

    cuda_device()
    return ObjectCode.from_cubin(cubin).get_kernel(symbol)


@functools.cache
def _allow_dynamic_smem(kernel, nbytes: int) -> None:
    """Opt in once per kernel and size (cached: launches in a timing loop skip the call)."""
    from cuda.bindings import driver

    from .device import check_driver, cuda_device

    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check_driver(driver.cuKernelSetAttribute(attribute, nbytes, kernel.handle, cuda_device().device_id))


@functools.cache
def prefer_shared_memory(compiled: CompiledKernel, percent: int = 100) -> None:
    """Ask for ``percent`` of the unified L1/shared-memory array as shared memory (a hint the
    driver may override), so the carveout it picks never limits resident blocks below what the
    registers allow. Once per kernel: cached."""
    from cuda.bindings import driver

    from .device import check_driver, cuda_device

    kernel = _loaded(compiled.cubin, compiled.symbol)
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    check_driver(driver.cuKernelSetAttribute(attribute, percent, kernel.handle, cuda_device().device_id))


def max_active_clusters(compiled: CompiledKernel, block: int, smem_bytes: int, cluster: int) -> int | None:
    """How many clusters of ``cluster`` blocks the driver says can be resident at once (a persistent
    cluster grid larger than that would run its last clusters after the first ones finish); None
    where the driver cannot say. Clusters live inside one GPC, so this can be less than
    SMs / cluster when a GPC has an odd number of usable SMs."""
    from cuda.bindings import driver

    from .device import check_driver, stream_handle

    kernel = _loaded(compiled.cubin, compiled.symbol)
    if smem_bytes > DEFAULT_SMEM_LIMIT:
        _allow_dynamic_smem(kernel, smem_bytes)
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = cluster, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes = smem_bytes
    config.hStream = driver.CUstream(stream_handle())
    config.numAttrs = 0  # the kernel's __cluster_dims__ gives the size
    try:
        return int(check_driver(driver.cuOccupancyMaxActiveClusters(driver.CUfunction(int(kernel.handle)), config)))
    except (RuntimeError, TypeError, ValueError):
        return None


def _driver_launch(kernel, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, args: tuple) -> None:
    """cuLaunchKernel with kernelParams built by hand: one pointer per argument's bytes."""
    from cuda.bindings import driver

    from .device import check_driver, stream_handle

    holders: list[Any] = []
    for arg in args:
        if isinstance(arg, TensorMapArg):
            holders.append(arg)
        elif isinstance(arg, np.generic):
            holders.append(np.array([arg]))
        elif isinstance(arg, int):  # device pointers
            holders.append(np.array([arg], dtype=np.uint64))
        else:
            raise TypeError(f"cannot pass {type(arg).__name__} to a kernel")
    pointers = np.array([h.address if isinstance(h, TensorMapArg) else h.ctypes.data for h in holders],
                        dtype=np.uint64)
    check_driver(driver.cuLaunchKernel(driver.CUfunction(int(kernel.handle)), *grid, *block, smem,
                                       driver.CUstream(stream_handle()), pointers.ctypes.data, 0))


def launch(compiled: CompiledKernel, grid: int | tuple[int, ...], block: int | tuple[int, ...], smem_bytes: int,
           *args: Any) -> None:
    """Enqueue ``compiled`` on the harness stream. Pointers as int, scalars as numpy scalars."""
    from cuda.core import LaunchConfig
    from cuda.core import launch as core_launch

    from .device import harness_stream

    kernel = _loaded(compiled.cubin, compiled.symbol)
    if smem_bytes > DEFAULT_SMEM_LIMIT:
        _allow_dynamic_smem(kernel, smem_bytes)
    grid3 = tuple(grid) + (1,) * (3 - len(grid)) if isinstance(grid, tuple) else (grid, 1, 1)
    block3 = tuple(block) + (1,) * (3 - len(block)) if isinstance(block, tuple) else (block, 1, 1)
    if any(isinstance(arg, TensorMapArg) for arg in args):
        _driver_launch(kernel, grid3, block3, smem_bytes, args)
    else:
        core_launch(harness_stream(), LaunchConfig(grid=grid3, block=block3, shmem_size=smem_bytes), kernel, *args)
