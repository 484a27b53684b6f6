"""k4 without a Blackwell GPU: every configuration compiles for sm_100a and sm_103a with no local
memory and with the tcgen05 path in its SASS, the occupancy model's reading of it, the refusals
before launch, and chapter 05's run.py saying that k4 was not run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from moe_gemm.core.chapters import chapter_module
from moe_gemm.cuda.gpu import GpuInfo
from moe_gemm.cuda.sass import opcode_counts
from moe_gemm.model.occupancy import residency
from moe_gemm.variants import k4

CHAPTER = Path(__file__).resolve().parents[1] / "chapters" / "05"
OPCODES = ("UTCHMMA", "UTCBAR", "LDTM", "UTMALDG", "SYNCS.EXCH", "SYNCS.PHASECHK", "SYNCS.ARRIVE.TRANS64.A1T0",
           "UTCATOMSWS", "HGMMA", "HMMA", "LDSM", "STG.E.128")


@pytest.fixture(scope="module", params=[(n, a) for n in k4.CONFIGS for a in k4.ARCHES], ids="-".join)
def compiled(request):
    name, arch = request.param
    variant = k4.K4Tcgen05(name)
    kernel = variant.compile(arch)
    return variant, arch, kernel, opcode_counts(kernel.sass(), OPCODES)


def test_compiles_without_local_memory(compiled):
    _, _, kernel, _ = compiled
    report = kernel.report
    assert report.spill_bytes == 0 and report.stack_frame_bytes == 0, kernel.log


def test_the_accumulator_is_not_in_registers(compiled):
    variant, _, kernel, _ = compiled
    # Held in registers, one 128 x BN fp32 accumulator over the 128 epilogue threads would take BN
    # registers per thread on its own; k4 reads 32 columns at a time out of tensor memory.
    assert kernel.report.registers < min(variant.bn, 96)


def test_sass_has_the_tcgen05_path(compiled):
    variant, _, _, counts = compiled
    assert counts["UTCHMMA"] == 64 // 16, counts  # one tcgen05.mma per k16 step of a stage, unrolled
    assert counts["UTCBAR"] == 2, counts  # commits: to empty[s] per stage, to tmem_full[b] per tile
    assert counts["LDTM"] == variant.bn // 32, counts  # one tcgen05.ld.32x32b.x32 per 32 columns, unrolled
    assert counts["UTMALDG"] == 2, counts  # A's 2-D box and the loop over B's 3-D boxes
    assert counts["SYNCS.EXCH"] == 2 * variant.config.stages + 2 * k4.ACCUMULATORS, counts  # every mbarrier.init
    assert counts["SYNCS.PHASECHK"] >= 4, counts  # waits: empty, full, tmem_empty, tmem_full
    assert counts["SYNCS.ARRIVE.TRANS64.A1T0"] == 1, counts  # the epilogue's arrival on tmem_empty
    assert counts["UTCATOMSWS"] >= 2, counts  # tcgen05.alloc and tcgen05.dealloc
    assert counts["STG.E.128"] == variant.bn // 8, counts  # 16-byte bf16 stores, 8 columns each
    assert counts["HGMMA"] == counts["HMMA"] == counts["LDSM"] == 0, counts  # no wgmma, mma.sync or ldmatrix


def test_static_shared_memory_is_the_barriers_and_the_tmem_address(compiled):
    variant, _, kernel, _ = compiled
    barriers = 8 * (2 * variant.config.stages + 2 * k4.ACCUMULATORS)
    assert barriers + 4 <= kernel.report.static_smem_bytes < barriers + 4 + 16


def test_resources_and_residency(compiled):
    variant, arch, kernel, _ = compiled
    resources = variant.resources(arch)
    assert resources.warps_per_block == k4.WARPS_PER_BLOCK == 6
    assert resources.smem_bytes == kernel.report.static_smem_bytes + variant.dynamic_smem_bytes
    fit = residency(resources.registers, 6, resources.smem_bytes)
    # The ring binds, not the registers: tensor memory took the accumulators off the register file.
    assert fit.by_smem == 1 < fit.by_registers
    assert variant.blocks_per_sm(resources.registers, resources.smem_bytes) == 1


def test_configurations():
    assert list(k4.CONFIGS) == ["k4/bn128", "k4/bn192", "k4/bn256", "k4/bn192-kmajor"]
    for config in k4.CONFIGS.values():
        assert config.dynamic_smem_bytes <= 227 * 1024
        assert config.tmem_columns >= k4.ACCUMULATORS * config.bn
    assert [k4.tmem_blocks(k4.CONFIGS[n]) for n in ("k4/bn128", "k4/bn256")] == [2, 1]
    assert k4.K4Tcgen05("k4/bn192-kmajor").kernel_name == "k4_tcgen05<192, 5, true>"
    with pytest.raises(ValueError, match="unknown k4 variant"):
        k4.K4Tcgen05("k4/bn96")


def test_registry_names_resolve():
    from moe_gemm.variants.registry import get, names

    assert names("k4") == list(k4.CONFIGS)
    assert get("k4/bn256").bn == 256 and get("k4/bn256").kernel_function == "k4_tcgen05"


# --------------------------------------------------------------------------- refusals before launch

@pytest.mark.parametrize(("K", "N", "rule"), [
    (100, 2688, "K to be a multiple of 8"),
    (1024, 2690, "N to be a multiple of 8"),
    (1000, 2688, "multiple of BK = 64"),
    (0, 2688, "K to be a positive multiple of BK = 64"),
])
def test_shapes_the_kernel_cannot_take(K, N, rule):
    with pytest.raises(ValueError, match=rule):
        k4.check_inputs(K, N)


@pytest.mark.parametrize("offset", [2, 8])
def test_misaligned_pointers(offset):
    with pytest.raises(ValueError, match="A to start on a 16-byte boundary"):
        k4.check_inputs(1024, 2688, 0x7F0000000000 + offset, 0x7F1000000000)
    with pytest.raises(ValueError, match="B to start on a 16-byte boundary"):
        k4.check_inputs(1024, 2688, 0x7F0000000000, 0x7F1000000000 + offset)


def test_good_inputs_pass():
    k4.check_inputs(1024, 2688, 0x7F0000000000, 0x7F1000000010)
    k4.check_inputs(64, 72)


def gpu(name: str, capability: tuple[int, int]) -> GpuInfo:
    return GpuInfo(name=name, compute_capability=capability, sm_count=132, driver_version=13000)


@pytest.mark.parametrize("capability", [(9, 0), (8, 0), (12, 0), (10, 1), (11, 0)])
def test_other_gpus_are_refused(capability):
    with pytest.raises(ValueError, match="needs compute capability 10.x"):
        k4.require_sm100("k4/bn192", gpu("Some GPU", capability))


def test_no_gpu_is_refused():
    with pytest.raises(ValueError, match="needs an NVIDIA GPU"):
        k4.require_sm100("k4/bn192", None)


@pytest.mark.parametrize("capability", [(10, 0), (10, 3)])
def test_blackwell_is_accepted(capability):
    assert k4.require_sm100("k4/bn192", gpu("NVIDIA B300", capability)).compute_capability == capability


# --------------------------------------------------------------------------- chapter 05's run.py

def test_run_py_on_an_h200_compiles_and_says_k4_was_not_run(monkeypatch, capsys):
    import moe_gemm.cuda.gpu

    monkeypatch.setattr(moe_gemm.cuda.gpu, "detect_gpu", lambda ordinal=0: gpu("NVIDIA H200", (9, 0)))
    assert chapter_module("05").main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("k4 is not run here because NVIDIA H200 is sm_90 and ")
    assert "needs compute capability 10.x" in out
    assert out.rstrip().splitlines()[-1].startswith("k4 is not run here: the tables above are the compiler's report")
    for text in ("sm_100a", "sm_103a", *k4.CONFIGS, "UTCHMMA", "UTCBAR", "LDTM", "UTMALDG", "SYNCS", "TMEM cols"):
        assert text in out, text
    assert out.count("regs: registers per thread") == 2  # a legend under each table


def test_run_py_as_a_program_without_blackwell_exits_0():
    from moe_gemm.cuda.gpu import detect_gpu

    if detect_gpu() is not None and detect_gpu().compute_capability in k4.SUPPORTED_CAPABILITIES:
        pytest.skip("a Blackwell GPU is here: run.py would check and time k4")
    proc = subprocess.run([sys.executable, str(CHAPTER / "run.py")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "k4 is not run here" in proc.stdout


def test_figures_are_generated_without_a_gpu(tmp_path):
    figures = chapter_module("05", "figures")
    written = {p.name for p in figures.write_outputs(tmp_path)}
    assert written == {"compile_report_sm100a.md", "compile_report_sm103a.md", "descriptors.md", "descriptors.png",
                       "residency.md", "estimate.md"}
    estimate = (tmp_path / "05" / "estimate.md").read_text()
    assert "model" in estimate and "not measurements" in estimate
    rows = figures.estimate_rows()
    # The page's reading of the model: a multiple of the seed's k2 everywhere, memory-bound at 2,048 rows.
    assert [r["bound"] for r in rows] == ["tensor cores", "tensor cores", "HBM"]
    assert all(r["estimate"] >= 2 * r["seed_k2"] for r in rows)


def test_k4_loads_its_operands_through_chapter_04s_tensor_maps():
    """k4's prepare() builds A and B maps with sm90.maps.operand_maps; on the CPU the maps' own rules are checked."""
    from moe_gemm.variants.sm90.maps import operand_maps

    for name, config in k4.CONFIGS.items():
        a_map, b_map = operand_maps(config.bm, config.b_layout, 0x10000, 0x20000, 1000, 8, 1024, 2688)
        assert a_map.box == (64, 128), name  # 64 of K x BM = 128 rows
        assert b_map.box == (64, 64, 1), name
        assert b_map.name == ("B" if config.b_layout == "kn" else "B^T"), name
