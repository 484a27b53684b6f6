"""The NVRTC build layer without a GPU: the cache and its key, the ptxas report, compile errors,
the no-local-memory check, SASS and opcode counting, and the architecture a compile targets."""

from __future__ import annotations

import pytest

from moe_gemm.cuda import nvrtc
from moe_gemm.cuda.nvrtc import CompileError, compile_kernel, target_arch
from moe_gemm.cuda.ptxas import ResourceError, parse_ptxas_report
from moe_gemm.cuda.sass import function_sass, opcode_counts, sass, sass_report

TINY = r"""
template <int SCALE>
__global__ void scale(float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = SCALE * x[i] + OFFSET;
}
"""

# A large local array indexed at run time cannot live in registers: it goes to the stack frame.
LOCAL_ARRAY = r"""
extern "C" __global__ void local_array(float* x, int i) {
    float scratch[256];
    for (int j = 0; j < 256; ++j) scratch[j] = x[j * 7 % 1024];
    x[0] = scratch[i & 255];
}
"""

# 64 live values and a 24-register cap (ptxas's floor for sm_90a): real spills.
PRESSURE = r"""
extern "C" __global__ void pressure(float* x, int n) {
    float a[64];
    #pragma unroll
    for (int j = 0; j < 64; ++j) a[j] = x[j * n + threadIdx.x];
    float s = 0.0f;
    #pragma unroll
    for (int j = 0; j < 64; ++j) s += a[j] * a[63 - j] * x[j];
    x[threadIdx.x] = s;
}
"""


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    """An empty kernels/ folder and an empty cache, both private to the test."""
    folder = tmp_path / "kernels"
    folder.mkdir()
    monkeypatch.setattr(nvrtc, "KERNEL_DIR", folder)
    monkeypatch.setenv("MOE_GEMM_CACHE", str(tmp_path / "cache"))
    return folder


def _count_nvrtc_calls(monkeypatch) -> list:
    calls = []
    real = nvrtc._nvrtc_compile

    def counting(*args, **kwargs):
        calls.append(args[:4])
        return real(*args, **kwargs)

    monkeypatch.setattr(nvrtc, "_nvrtc_compile", counting)
    return calls


# ---- the cache ----------------------------------------------------------------------------------

def test_cache_hit_skips_nvrtc_and_returns_the_same_kernel(kernels, monkeypatch):
    (kernels / "tiny.cu").write_text(TINY)
    calls = _count_nvrtc_calls(monkeypatch)
    first = compile_kernel("tiny.cu", "scale<2>", arch="sm_90a", defines={"OFFSET": 1})
    again = compile_kernel("tiny.cu", "scale<2>", arch="sm_90a", defines={"OFFSET": 1})
    assert len(calls) == 1
    assert again.cubin == first.cubin and again.report == first.report and again.symbol == first.symbol


@pytest.mark.parametrize("change", ["source", "name", "arch", "defines", "options", "header"])
def test_cache_misses_when_any_part_of_the_key_changes(kernels, monkeypatch, change):
    (kernels / "tiny.cu").write_text('#include "common.cuh"\n' + TINY)
    (kernels / "common.cuh").write_text("// a header the kernel includes\n")
    base = {"name": "scale<2>", "arch": "sm_90a", "defines": {"OFFSET": 1}, "options": ()}
    compile_kernel("tiny.cu", base["name"], arch=base["arch"], defines=base["defines"], options=base["options"])
    calls = _count_nvrtc_calls(monkeypatch)
    changed = dict(base)
    if change == "source":
        (kernels / "tiny.cu").write_text('#include "common.cuh"\n' + TINY + "\n// edited\n")
    elif change == "name":
        changed["name"] = "scale<3>"
    elif change == "arch":
        changed["arch"] = "sm_80"
    elif change == "defines":
        changed["defines"] = {"OFFSET": 2}
    elif change == "options":
        changed["options"] = ("--allow-expensive-optimizations=true",)
    elif change == "header":
        (kernels / "common.cuh").write_text("// edited header\n")
    compile_kernel("tiny.cu", changed["name"], arch=changed["arch"], defines=changed["defines"],
                   options=changed["options"])
    assert len(calls) == 1, f"changing the {change} should recompile"


def test_a_header_the_kernel_does_not_include_leaves_the_cache_alone(kernels, monkeypatch):
    (kernels / "tiny.cu").write_text(TINY)
    compile_kernel("tiny.cu", "scale<2>", arch="sm_90a", defines={"OFFSET": 1})
    (kernels / "unrelated.cuh").write_text("// another kernel's header\n")
    calls = _count_nvrtc_calls(monkeypatch)
    compile_kernel("tiny.cu", "scale<2>", arch="sm_90a", defines={"OFFSET": 1})
    assert not calls


def test_cache_key_includes_the_nvrtc_version(kernels, monkeypatch):
    (kernels / "tiny.cu").write_text(TINY)
    key = nvrtc._cache_key("tiny.cu", "k", "sm_90a", [], (), kernels)
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: "99.9")
    assert nvrtc._cache_key("tiny.cu", "k", "sm_90a", [], (), kernels) != key


def test_a_header_two_includes_away_rebuilds_the_kernel(kernels, monkeypatch):
    """tiny.cu includes outer.cuh, which includes inner.cuh: editing inner.cuh must recompile."""
    (kernels / "inner.cuh").write_text("#pragma once\n#define OFFSET 1\n")
    (kernels / "outer.cuh").write_text('#pragma once\n#include "inner.cuh"\n')
    (kernels / "tiny.cu").write_text('#include "outer.cuh"\n' + TINY)
    first = compile_kernel("tiny.cu", "scale<2>", arch="sm_90a")
    calls = _count_nvrtc_calls(monkeypatch)
    assert compile_kernel("tiny.cu", "scale<2>", arch="sm_90a").cubin == first.cubin and not calls
    (kernels / "inner.cuh").write_text("#pragma once\n#define OFFSET 2\n")
    second = compile_kernel("tiny.cu", "scale<2>", arch="sm_90a")
    assert len(calls) == 1, "an edit two includes down must miss the cache"
    assert second.cubin != first.cubin


def test_use_cache_false_always_compiles(kernels, monkeypatch):
    (kernels / "tiny.cu").write_text(TINY)
    calls = _count_nvrtc_calls(monkeypatch)
    for _ in range(2):
        compile_kernel("tiny.cu", "scale<2>", arch="sm_90a", defines={"OFFSET": 1}, use_cache=False)
    assert len(calls) == 2


# ---- the ptxas report ---------------------------------------------------------------------------

CANNED_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z3fooILi64EEvPf' for 'sm_90a'
ptxas info    : Function properties for _Z3fooILi64EEvPf
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 27648 bytes smem, 384 bytes cmem[0]
ptxas info    : Compiling entry function '_Z3barv' for 'sm_90a'
ptxas info    : Function properties for _Z3barv
ptxas         .     40 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 352 bytes cmem[0]
ptxas info    : Compile time = 12.3 ms
"""


def test_report_parses_each_function_on_its_own():
    foo = parse_ptxas_report(CANNED_LOG, "_Z3fooILi64EEvPf")
    assert (foo.registers, foo.static_smem_bytes, foo.barriers) == (64, 27648, 1)
    assert (foo.stack_frame_bytes, foo.spill_bytes) == (0, 0)
    bar = parse_ptxas_report(CANNED_LOG, "_Z3barv")
    assert (bar.registers, bar.static_smem_bytes, bar.barriers) == (255, 0, 0)
    assert (bar.stack_frame_bytes, bar.spill_store_bytes, bar.spill_load_bytes, bar.spill_bytes) == (40, 24, 16, 40)


def test_report_for_a_missing_function_is_an_error():
    with pytest.raises(ValueError, match="no entry for"):
        parse_ptxas_report(CANNED_LOG, "_Z7missingv")


def test_report_comes_back_from_a_real_compile(kernels):
    (kernels / "tiny.cu").write_text(TINY)
    kernel = compile_kernel("tiny.cu", "scale<4>", arch="sm_90a", defines={"OFFSET": 0})
    assert "Used" in kernel.log and kernel.symbol in kernel.log
    assert 0 < kernel.report.registers < 32 and kernel.report.spill_bytes == 0


# ---- errors and the no-local-memory rule ---------------------------------------------------------

def test_compile_error_names_the_file_and_carries_the_log(kernels):
    (kernels / "broken.cu").write_text("__global__ void broken(float* x) { x[0] = not_declared_anywhere; }\n")
    with pytest.raises(CompileError) as raised:
        compile_kernel("broken.cu", "broken", arch="sm_90a")
    message = str(raised.value)
    assert "kernels/broken.cu" in message and "broken.cu(1)" in message
    assert "not_declared_anywhere" in message and "sm_90a" in message


def test_a_missing_source_is_a_value_error(kernels):
    with pytest.raises(ValueError, match="no kernel source"):
        compile_kernel("absent.cu", "absent", arch="sm_90a")


def test_a_malformed_arch_is_a_value_error(kernels):
    (kernels / "tiny.cu").write_text(TINY)
    with pytest.raises(ValueError, match="arch must look like"):
        compile_kernel("tiny.cu", "scale<2>", arch="hopper", defines={"OFFSET": 1})


def test_local_memory_array_is_refused(kernels):
    (kernels / "local.cu").write_text(LOCAL_ARRAY)
    kernel = compile_kernel("local.cu", "local_array", arch="sm_90a")
    assert kernel.report.stack_frame_bytes >= 1024
    with pytest.raises(ResourceError, match="local memory"):
        kernel.require_no_spills()


def test_register_spills_are_refused(kernels):
    (kernels / "pressure.cu").write_text(PRESSURE)
    kernel = compile_kernel("pressure.cu", "pressure", arch="sm_90a", options=("--maxrregcount=16",))
    assert kernel.report.spill_store_bytes > 0 and kernel.report.spill_load_bytes > 0
    with pytest.raises(ResourceError, match="spill stores"):
        kernel.require_no_spills()


def test_a_clean_kernel_passes_the_check(kernels):
    (kernels / "tiny.cu").write_text(TINY)
    kernel = compile_kernel("tiny.cu", "scale<2>", arch="sm_80", defines={"OFFSET": 1})
    assert kernel.require_no_spills() is kernel


# ---- SASS -----------------------------------------------------------------------------------------

CANNED_SASS = """\
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   HMMA.16816.F32.BF16 R16, R12, R36, R16 ;
        /*0020*/              @!P5 LDGSTS.E.BYPASS.128 [R42+0x1400], desc[UR10][R54.64], !P0 ;
        /*0030*/               @P0 LDSM.16.MT88.4 R36, [R2] ;
        /*0040*/                   LDSM.16.M88.4 R12, [R3] ;
        /*0050*/              @!UP1 ULDC UR6, c[0x0][0x234] ;
        /*0060*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0070*/                   EXIT ;
"""


def test_opcode_counts_see_through_predicates():
    counts = opcode_counts(CANNED_SASS, ["HMMA.16816.F32.BF16", "LDSM", "LDSM.16.MT88", "LDGSTS", "ULDC", "BAR",
                                         "FFMA"])
    assert counts == {"HMMA.16816.F32.BF16": 1, "LDSM": 2, "LDSM.16.MT88": 1, "LDGSTS": 1, "ULDC": 1, "BAR": 1,
                      "FFMA": 0}


def test_function_sass_picks_one_function_of_a_module():
    """A module of several extern "C" kernels (k8_quantize.cu's three) disassembles as one text; counting one
    kernel's instructions needs its part alone."""
    two = ("\t\tFunction : first\n        /*0000*/ FFMA R1, R2, R3, R4 ;\n        /*0010*/ EXIT ;\n"
           "\t\tFunction : second\n        /*0000*/ HMMA.16816.F32.BF16 R0, R4, R8, R0 ;\n        /*0010*/ EXIT ;\n")
    assert opcode_counts(function_sass(two, "first"), ["FFMA", "HMMA"]) == {"FFMA": 1, "HMMA": 0}
    assert opcode_counts(function_sass(two, "second"), ["FFMA", "HMMA"]) == {"FFMA": 0, "HMMA": 1}
    assert function_sass(CANNED_SASS, "anything") == CANNED_SASS  # one function: the whole text
    with pytest.raises(ValueError, match="no function third"):
        function_sass(two, "third")


@pytest.mark.parametrize("tool", ["cuobjdump", "nvdisasm"])
def test_sass_from_either_tool(kernels, tool):
    (kernels / "tiny.cu").write_text(TINY)
    kernel = compile_kernel("tiny.cu", "scale<2>", arch="sm_90a", defines={"OFFSET": 1})
    text = kernel.sass(tool)
    counts = opcode_counts(text, ["EXIT", "STG"])
    assert counts["EXIT"] >= 1 and counts["STG"] == 1


def test_unknown_disassembler_is_refused():
    with pytest.raises(ValueError, match="tool must be one of"):
        sass(b"", tool="objdump")


def test_sass_report_row(kernels):
    (kernels / "tiny.cu").write_text(TINY)
    kernel = compile_kernel("tiny.cu", "scale<2>", arch="sm_90a", defines={"OFFSET": 1})
    row = sass_report(kernel, ["STG", "HMMA"])
    assert row["kernel"] == "scale<2>" and row["arch"] == "sm_90a"
    assert row["registers"] == kernel.report.registers and row["spill_bytes"] == 0
    assert (row["STG"], row["HMMA"]) == (1, 0)


# ---- which architecture ---------------------------------------------------------------------------

def test_target_arch_without_a_gpu_needs_a_name(monkeypatch):
    import moe_gemm.cuda.gpu

    monkeypatch.setattr(moe_gemm.cuda.gpu, "detect_gpu", lambda: None)
    assert target_arch("sm_100a") == "sm_100a"
    with pytest.raises(ValueError, match="name the architecture"):
        target_arch(None)


def test_target_arch_is_the_running_gpus(monkeypatch):
    import moe_gemm.cuda.gpu
    from moe_gemm.cuda.gpu import GpuInfo

    h200 = GpuInfo(name="NVIDIA H200", compute_capability=(9, 0), sm_count=132, driver_version=13000)
    monkeypatch.setattr(moe_gemm.cuda.gpu, "detect_gpu", lambda: h200)
    assert target_arch(None) == "sm_90a"


def test_the_cache_writes_each_file_whole_under_a_name_of_its_own(tmp_path, monkeypatch):
    """Processes sharing a cache may store one entry at once: each file is renamed into place whole, so
    a reader never meets a truncated cubin (the GPU validation once read one: CUDA_ERROR_INVALID_IMAGE)."""
    import os

    from moe_gemm.cuda import nvrtc

    renamed = []
    monkeypatch.setattr(nvrtc.os, "replace", lambda src, dst: (renamed.append((src, dst)), os.rename(src, dst)))
    report = nvrtc.ResourceReport(40, 0, 0, 0, 0, 1)
    compiled = nvrtc.CompiledKernel("k.cu", "k", "k", "sm_90a", b"\x7fELF" * 100, report, "")
    nvrtc._store(tmp_path / "entry.json", compiled)
    assert [os.path.basename(dst) for _, dst in renamed] == ["entry.cubin", "entry.json"]  # the .json last
    assert all(src != dst and src.endswith(".tmp") for src, dst in renamed)
    assert (tmp_path / "entry.cubin").read_bytes() == compiled.cubin and not list(tmp_path.glob("*.tmp"))


def test_nvrtcs_own_cache_is_off_so_every_compile_returns_its_ptxas_report(kernels, monkeypatch):
    """compile_kernel passes --no-cache (NVRTC's own cache answered repeated compiles on the GPU machine with an
    empty log); the same program compiled twice without our cache reports its registers both times."""
    from cuda.core import ProgramOptions

    if "no_cache" not in ProgramOptions.__dataclass_fields__:
        pytest.skip("this cuda.core has no no_cache option")
    assert nvrtc._compiler_cache_off() == {"no_cache": True}
    (kernels / "tiny.cu").write_text(TINY)
    first, second = (compile_kernel("tiny.cu", "scale<3>", arch="sm_90a", defines={"OFFSET": 1}, use_cache=False)
                     for _ in range(2))
    assert first.report == second.report and first.report.registers > 0 and first.symbol in second.log
