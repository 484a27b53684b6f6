"""Compile the CUDA C++ kernels in ``kernels/`` at run time with NVRTC, with a disk cache.

:func:`compile_kernel` turns one kernel of one source file into a CUBIN for one exact
architecture (``sm_90a`` on the H200; any of sm_80 / sm_90a / sm_100a / sm_103a without a GPU),
with compile-time parameters passed as template arguments or ``-D`` defines. Results are cached
on disk, keyed by every file the source reaches through ``#include`` (however deep), the options,
the architecture and the NVRTC version; a cache hit skips NVRTC entirely.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from moe_gemm.core.paths import KERNEL_DIR
from moe_gemm.cuda.ptxas import ResourceError, ResourceReport, parse_ptxas_report
from moe_gemm.cuda.sources import closure_digest

ARCHES = ("sm_80", "sm_90a", "sm_100a", "sm_103a")


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries the file name and NVRTC's log."""


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
        from moe_gemm.cuda.sass import sass

        return sass(self.cubin, tool)

    def require_no_spills(self) -> CompiledKernel:
        r = self.report
        if r.spill_bytes or r.stack_frame_bytes:
            raise ResourceError(
                f"{self.name} ({self.arch}) uses local memory: {r.stack_frame_bytes} bytes stack frame, "
                f"{r.spill_store_bytes} bytes spill stores, {r.spill_load_bytes} bytes spill loads")
        return self


def nvrtc_version() -> str:
    """The NVRTC release, e.g. '13.0': part of the cache key and of every results file's provenance."""
    try:
        from cuda.bindings import nvrtc

        _, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"
    except Exception:  # noqa: BLE001 - provenance is best effort
        return "unknown"


def cache_dir() -> Path:
    root = (os.environ.get("MOE_GEMM_CACHE")
            or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moe_gemm")
    return Path(root) / "nvrtc"


def _define_flags(defines: Mapping[str, Any]) -> list[str]:
    return [f"{key}={int(value) if isinstance(value, bool) else value}" for key, value in sorted(defines.items())]


# The options every compile gets (see _nvrtc_compile); part of the cache key, so changing them
# here invalidates every cached CUBIN.
FIXED_OPTIONS = ("std=c++17", "lineinfo", "ptxas=-v,--warn-on-spills")


def _cache_key(source_file: str, name: str, arch: str, defines: list[str], options: tuple[str, ...],
               kernel_dir: Path) -> str:
    digest = hashlib.sha256()
    for part in (closure_digest(source_file, kernel_dir), name, arch, nvrtc_version(), *FIXED_OPTIONS, *defines,
                 *options):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:32]


def target_arch(arch: str | None = None) -> str:
    """``arch`` if named, else the running GPU's (``sm_90a`` on an H200); ValueError with no GPU."""
    if arch is not None:
        return arch
    from moe_gemm.cuda.gpu import detect_gpu

    gpu = detect_gpu()
    if gpu is None:
        raise ValueError(f"no GPU here: name the architecture to compile for (one of {', '.join(ARCHES)})")
    return gpu.arch


def compile_kernel(
    source_file: str, name: str, *, arch: str | None = None, defines: Mapping[str, Any] | None = None,
    options: Iterable[str] = (), use_cache: bool = True, kernel_dir: Path | None = None,
) -> CompiledKernel:
    """Compile kernel ``name`` (a template instantiation is fine) of ``kernels/<source_file>``
    for ``arch``, or for the running GPU's architecture when ``arch`` is None. ``kernel_dir``: another
    copy of the kernels (the validation record's carry-over compiles an earlier commit's); None: kernels/."""
    kernel_dir = KERNEL_DIR if kernel_dir is None else kernel_dir
    arch = target_arch(arch)
    if arch not in ARCHES and not re.fullmatch(r"sm_\d+a?", arch):
        raise ValueError(f"arch must look like sm_90a (known: {', '.join(ARCHES)}), got {arch!r}")
    path = kernel_dir / source_file
    if not path.is_file():
        raise ValueError(f"no kernel source {path}")
    source = path.read_text()
    define_flags, options = _define_flags(defines or {}), tuple(options)
    cache_file = cache_dir() / f"{_cache_key(source_file, name, arch, define_flags, options, kernel_dir)}.json"
    if use_cache and cache_file.is_file():
        meta = json.loads(cache_file.read_text())
        return CompiledKernel(source_file, name, meta["symbol"], arch, cache_file.with_suffix(".cubin").read_bytes(),
                              ResourceReport(**meta["report"]), meta["log"])
    compiled = _nvrtc_compile(source, source_file, name, arch, define_flags, options, kernel_dir)
    _store(cache_file, compiled)
    return compiled


def _compiler_cache_off() -> dict[str, bool]:
    """ProgramOptions' switch for NVRTC's own compile cache (--no-cache), where this cuda.core has it.

    Seen on the GPU machine (cuda.core 1.2.0, NVRTC 13.0), never here: a program compiled a second time, in the same
    process or another, even under an extra unused -D macro, came back with an empty log, so without the ptxas
    report that compile_kernel parses. NVRTC's compile cache is the likely cause (an unused macro leaves the
    preprocessed program, and so a cache's key, unchanged); compile_kernel's own cache already keeps each report,
    so NVRTC's is turned off. Not yet run on the GPU machine."""
    from cuda.core import ProgramOptions

    return {"no_cache": True} if "no_cache" in getattr(ProgramOptions, "__dataclass_fields__", {}) else {}


def _nvrtc_compile(source: str, source_file: str, name: str, arch: str, defines: list[str],
                   options: tuple[str, ...], kernel_dir: Path) -> CompiledKernel:
    from cuda.core import Program, ProgramOptions

    program_options = ProgramOptions(
        arch=arch, std="c++17", name=source_file, include_path=[str(kernel_dir)],
        define_macro=defines or None, lineinfo=True,
        # one flag per ptxas option; -v makes ptxas print the resource report into the log
        ptxas_options=["-v", "--warn-on-spills", *options],
        **_compiler_cache_off(),
    )
    log = io.StringIO()
    try:
        code = Program(source, "c++", program_options).compile("cubin", name_expressions=[name], logs=log)
    except Exception as error:  # noqa: BLE001 - cuda.core's NVRTCError has no public name; re-raise with file and log
        raise CompileError(f"NVRTC failed to compile {name} from kernels/{source_file} for {arch}:\n"
                           f"{log.getvalue()}\n{error}") from None
    symbol = code.symbol_mapping.get(name, name)
    symbol = symbol.decode() if isinstance(symbol, bytes) else symbol
    text = log.getvalue()
    return CompiledKernel(source_file, name, symbol, arch, bytes(code.code), parse_ptxas_report(text, symbol), text)


def _store(cache_file: Path, compiled: CompiledKernel) -> None:
    """Write the cubin, then the .json whose presence means the entry is whole. Each file is written
    under a name of its own and renamed into place: processes compiling in parallel (the GPU validation
    runs 16 pytest processes on one cache) may store the same entry at once, and a reader that found
    the .json must never read a cubin another writer has truncated (seen: CUDA_ERROR_INVALID_IMAGE)."""
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    meta = {"symbol": compiled.symbol, "report": asdict(compiled.report), "log": compiled.log}
    for path, data in ((cache_file.with_suffix(".cubin"), compiled.cubin), (cache_file, json.dumps(meta).encode())):
        fd, tmp = tempfile.mkstemp(dir=cache_file.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
