"""k1 without a GPU: every configuration compiles for sm_80 and sm_90a with no local memory and
the instructions the chapter is about; the register caps give the residency the chapter
describes; the fragment addresses meet the mma.sync layouts; bad inputs are refused."""

from __future__ import annotations

import re

import numpy as np
import pytest

from moe_gemm.cuda.gpu import GpuInfo
from moe_gemm.cuda.sass import opcode_counts
from moe_gemm.model.occupancy import residency
from moe_gemm.variants import k1, registry
from moe_gemm.variants.k1 import CONFIGS, SASS_OPCODES, K1MmaSync, all_configs, check_inputs
from moe_gemm.variants.k1.fragments import k1_address, ldmatrix_x4_delivers, mma_a, mma_b, mma_c

ARCHES = ("sm_80", "sm_90a")
def _id(config):
    return K1MmaSync(*config).name.removeprefix("k1/")


@pytest.fixture(scope="module", params=[(arch, c) for arch in ARCHES for c in CONFIGS],
                ids=lambda p: f"{p[0]}-{_id(p[1])}")
def compiled(request):
    arch, config = request.param
    variant = K1MmaSync(*config)
    return variant, variant.compile(arch)


def test_compiles_without_local_memory(compiled):
    _, kernel = compiled
    r = kernel.report
    assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0 and r.stack_frame_bytes == 0, kernel.log


def test_sass_holds_mma_ldmatrix_and_cp_async(compiled):
    _, kernel = compiled
    counts = opcode_counts(kernel.sass(), SASS_OPCODES)
    assert all(counts[op] > 0 for op in SASS_OPCODES), counts
    assert "HMMA.16816.F32.BF16" in SASS_OPCODES and "LDGSTS" in SASS_OPCODES


def test_mma_count_matches_the_warp_tile(compiled):
    """Per K slice each warp issues (BM/32) x 4 x 2 MMAs; the main loop holds whole slices of them."""
    variant, kernel = compiled
    per_slice = (variant.bm // 32) * 4 * 2
    hmma = opcode_counts(kernel.sass(), ["HMMA.16816.F32.BF16"])["HMMA.16816.F32.BF16"]
    assert hmma % per_slice == 0 and hmma >= per_slice


def test_shared_memory_is_the_padded_stages(compiled):
    variant, kernel = compiled
    a_stage = variant.bm * (32 + 8) * 2
    b_stage = 32 * (128 + 8) * 2
    assert kernel.report.static_smem_bytes == 0  # every stage lives in dynamic shared memory
    assert variant.dynamic_smem_bytes == variant.stages * (a_stage + b_stage)
    assert variant.resources(kernel.arch).smem_bytes == variant.dynamic_smem_bytes


# The blocks per SM each configuration was written for (__launch_bounds__ caps its registers).
# Keys are (BM, FRAG_DB, STAGES); BM = 32 gets four, not six: ptxas 13.0 spills at 40 or 48 registers.
DESIGNED_BLOCKS = {(32, False, 2): 4, (64, False, 2): 4, (128, False, 2): 2, (32, True, 2): 4, (64, True, 2): 3,
                   (128, True, 2): 1, (32, False, 3): 4, (64, False, 3): 4, (128, False, 3): 2}


@pytest.mark.parametrize("config", CONFIGS, ids=_id)
def test_residency_is_what_the_register_caps_promise(config):
    variant = K1MmaSync(*config)
    resources = variant.resources("sm_90a")
    fit = residency(resources.registers, 8, resources.smem_bytes)
    assert resources.warps_per_block == 8
    assert fit.blocks == DESIGNED_BLOCKS[config] and fit.limiter == "registers", (resources, fit)


def test_frag_db_changes_the_main_loop():
    """The experiment is real: FRAG_DB's SASS is not the default's under another name."""
    def body(kernel):
        return [re.sub(r"/\*[0-9a-f]+\*/", "", line).strip() for line in kernel.sass().splitlines() if "/*" in line]

    plain, double = K1MmaSync(64).compile("sm_90a"), K1MmaSync(64, True).compile("sm_90a")
    assert body(plain) != body(double)
    assert double.report.registers > plain.report.registers


# ---- fragments: ldmatrix meets mma.sync -----------------------------------------------------------

def test_ldmatrix_x4_delivers_the_mma_a_fragment():
    delivered = ldmatrix_x4_delivers(k1_address, trans=False)
    for lane in range(32):
        for reg in range(4):
            for half in range(2):
                assert delivered[(lane, reg, half)] == mma_a(lane, reg, half)


def test_ldmatrix_x4_trans_delivers_two_mma_b_fragments():
    delivered = ldmatrix_x4_delivers(k1_address, trans=True)
    for lane in range(32):
        for reg in range(2):
            for half in range(2):
                k, n = mma_b(lane, reg, half)
                assert delivered[(lane, reg, half)] == (k, n)  # registers 0, 1: columns 0-7
                assert delivered[(lane, reg + 2, half)] == (k, n + 8)  # registers 2, 3: columns 8-15


def test_each_layout_covers_its_tile_exactly_once():
    a = {mma_a(lane, reg, half) for lane in range(32) for reg in range(4) for half in range(2)}
    b = {mma_b(lane, reg, half) for lane in range(32) for reg in range(2) for half in range(2)}
    c = {mma_c(lane, i) for lane in range(32) for i in range(4)}
    assert a == {(r, k) for r in range(16) for k in range(16)}
    assert b == {(k, n) for k in range(16) for n in range(8)}
    assert c == {(r, n) for r in range(16) for n in range(8)}


def test_the_a_layout_table_has_one_column_per_register_pair():
    """A register holds two bf16 neighbours in k: eight columns, which fit the page at 1400 px."""
    from moe_gemm.variants.k1.fragments import a_layout_markdown

    lines = a_layout_markdown().splitlines()
    assert lines[0] == "| row \\ k | 0, 1 | 2, 3 | 4, 5 | 6, 7 | 8, 9 | 10, 11 | 12, 13 | 14, 15 |"
    assert lines[2] == "| 0 | L0.a0 | L1.a0 | L2.a0 | L3.a0 | L0.a2 | L1.a2 | L2.a2 | L3.a2 |"
    assert lines[10] == "| 8 | L0.a1 | L1.a1 | L2.a1 | L3.a1 | L0.a3 | L1.a3 | L2.a3 | L3.a3 |"
    assert len(lines) == 2 + 16


def test_padded_rows_make_ldmatrix_conflict_free():
    """The eight 16-byte rows one ldmatrix phase reads fall on eight different bank groups."""
    for row_bytes in ((32 + 8) * 2, (128 + 8) * 2):
        groups = {(r * row_bytes // 16) % 8 for r in range(8)}
        assert len(groups) == 8
    for row_bytes in (32 * 2, 128 * 2):  # unpadded: every row starts on the same bank group
        assert len({(r * row_bytes // 16) % 8 for r in range(8)}) < 8


# ---- the wrapper's checks ----------------------------------------------------------------------------

@pytest.mark.parametrize("bm", [16, 48, 256, True, "64"])
def test_bm_must_be_32_64_or_128(bm):
    with pytest.raises(ValueError, match="BM must be one of"):
        K1MmaSync(bm)


def test_frag_db_must_be_a_bool():
    with pytest.raises(ValueError, match="frag_db"):
        K1MmaSync(64, frag_db=1)


def test_names():
    assert [v.name for v in all_configs()] == ["k1/bm32", "k1/bm32-fragdb", "k1/bm64", "k1/bm64-fragdb",
                                               "k1/bm128", "k1/bm128-fragdb", "k1/bm32-s3", "k1/bm64-s3",
                                               "k1/bm128-s3"]
    assert K1MmaSync(64).kernel_name == "k1_mma_sync<64, 2, false>"
    assert K1MmaSync(64, stages=3).kernel_name == "k1_mma_sync<64, 3, false>"


@pytest.mark.parametrize(("bm", "frag_db", "stages", "rule"), [
    (64, False, 4, "stages must be one of"),
    (64, True, 3, "exactly two stages"),
])
def test_bad_stage_choices_are_refused(bm, frag_db, stages, rule):
    with pytest.raises(ValueError, match=rule):
        K1MmaSync(bm, frag_db, stages)


@pytest.mark.parametrize(("K", "N", "addresses", "rule"), [
    (48, 200, {}, "K to be a positive multiple of BK = 32"),
    (1000, 200, {}, "K to be a positive multiple of BK = 32"),
    (0, 200, {}, "K to be a positive multiple of BK = 32"),
    (128, 100, {}, "N to be a multiple of 8"),
    (128, 200, {"a_address": 0x1008}, "A to start on a 16-byte boundary"),
    (128, 200, {"b_address": 0x1002}, "B to start on a 16-byte boundary"),
    (128, 200, {"c_address": 0x1002}, "C to start on a 4-byte boundary"),
])
def test_inputs_the_kernel_cannot_take(K, N, addresses, rule):
    with pytest.raises(ValueError, match=rule):
        check_inputs(K, N, **addresses)


def test_inputs_the_kernel_takes():
    check_inputs(1024, 2688, 0x1000, 0x2000, 0x3004)
    check_inputs(32, 8)


class _FakeArray:
    def __init__(self, host: np.ndarray, ptr: int = 0x10000) -> None:
        self.shape, self.dtype, self.ptr = host.shape, host.dtype, ptr


class _FakeDeviceProblem:
    """Enough of a DeviceProblem for prepare() to reach its checks: nothing here touches a GPU."""

    def __init__(self, problem) -> None:
        self.problem = problem
        self.a, self.b = _FakeArray(problem.a), _FakeArray(problem.b)

    def new_output(self):
        raise AssertionError("prepare() allocated an output before refusing the inputs")


def _problem(K=128, N=200):
    from moe_gemm.model.problem import problem_from_counts

    return problem_from_counts(np.array([40, 90]), K, N, values="integer", seed=1)


def test_prepare_refuses_a_gpu_older_than_sm80_before_any_launch(monkeypatch):
    turing = GpuInfo(name="Tesla T4", compute_capability=(7, 5), sm_count=40, driver_version=13000)
    monkeypatch.setattr(k1, "detect_gpu", lambda: turing)
    with pytest.raises(ValueError, match="sm_80 or newer"):
        K1MmaSync(64).prepare(_FakeDeviceProblem(_problem()))


def test_prepare_refuses_no_gpu(monkeypatch):
    monkeypatch.setattr(k1, "detect_gpu", lambda: None)
    with pytest.raises(ValueError, match="needs an NVIDIA GPU"):
        K1MmaSync(32).prepare(_FakeDeviceProblem(_problem()))


def test_prepare_refuses_bad_shapes_before_looking_for_a_gpu(monkeypatch):
    monkeypatch.setattr(k1, "detect_gpu", lambda: pytest.fail("checked the GPU before the shapes"))
    with pytest.raises(ValueError, match="multiple of BK = 32"):
        K1MmaSync(128).prepare(_FakeDeviceProblem(_problem(K=96 + 8)))
    with pytest.raises(ValueError, match="N to be a multiple of 8"):
        K1MmaSync(128).prepare(_FakeDeviceProblem(_problem(N=204)))


def test_prepare_refuses_a_device_array_of_the_wrong_dtype(monkeypatch):
    monkeypatch.setattr(k1, "detect_gpu", lambda: pytest.fail("checked the GPU before the arrays"))
    dev = _FakeDeviceProblem(_problem())
    dev.a.dtype = np.dtype(np.float32)
    with pytest.raises(ValueError, match="A as bf16"):
        K1MmaSync(64).prepare(dev)


# ---- the registry ------------------------------------------------------------------------------------

def test_registry_names_every_k1_configuration():
    assert registry.names("k1") == [v.name for v in all_configs()]
    assert "k1" in registry.families()
    variant = registry.get("k1/bm64-fragdb")
    assert isinstance(variant, K1MmaSync) and (variant.bm, variant.frag_db) == (64, True)
    assert [v.name for v in registry.resolve(["k1/bm128", "k1"])][:2] == ["k1/bm128", "k1/bm32"]


def test_registry_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown variant 'k1/bm48'"):
        registry.get("k1/bm48")
    with pytest.raises(ValueError, match="no variant family 'k9'"):
        registry.get("k9/anything")
