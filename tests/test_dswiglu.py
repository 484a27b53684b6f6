"""SwiGLU's backward fused into the dA GEMM (k6's "dswiglu" epilogue, moe_gemm.torch.fused_backward), without
a GPU: the kernel as compiled for sm_90a, its launch arguments, the rules and the validation record. The op's
fallback, which runs until the kernel passes its GPU tests (tests/test_dswiglu_gpu.py), is tested with the
experts' training function (tests/test_experts.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from moe_gemm.core.paths import KERNEL_DIR
from moe_gemm.cuda.sass import opcode_counts
from moe_gemm.cuda.tensormap import TiledMap
from moe_gemm.measure import validation
from moe_gemm.torch import rules
from moe_gemm.torch.kernels import NOT_YET_RUN
from moe_gemm.variants.k6 import K6Persistent
from moe_gemm.variants.k6.config import FUSED_BACKWARD
from moe_gemm.variants.k6.launch import arguments

CONFIG = FUSED_BACKWARD["k6/dswiglu-bn128"]


@pytest.mark.parametrize("element", ["bf16", "fp16"])
def test_the_fused_backward_builds_with_its_register_epilogue(element):
    """No spills and no serialized wgmma; the epilogue as designed: per thread, 2 m64 slices x 32 accumulator
    pairs, each pair one exponential per element, two 4-byte loads (gate, up) and three 4-byte stores (dgate,
    dup, act), nothing through shared memory or TMA on the way out."""
    compiled = K6Persistent("k6/dswiglu-bn128", CONFIG.replace(element=element, out=element)).compile("sm_90a")
    assert compiled.report.spill_store_bytes == 0 and "C7520" not in compiled.log
    counts = opcode_counts(compiled.sass(), ("HGMMA", "MUFU.EX2", "LDG", "STG", "STSM", "UTMASTG"))
    pairs = 2 * 32
    assert counts["HGMMA"] == 12  # as k6/swiglu-bn128: the main loop's wgmmas for one and for two m64 slices
    assert counts["MUFU.EX2"] == 2 * pairs
    assert counts["STG"] == 3 * pairs
    assert counts["LDG"] == 2 * pairs + 1  # and the device walk's load of the expert ends
    assert counts["STSM"] == counts["UTMASTG"] == 0


def test_the_entry_takes_k6_params_then_the_pre_activation_and_the_activation():
    source = (KERNEL_DIR / "k6_persistent.cu").read_text()
    entry = re.search(r"k6_persistent_dswiglu\(K6_PARAMS,(.*?)\)\s*\{", source, re.S).group(1)
    assert [p.split()[-1] for p in entry.split(",")] == ["preact", "act"]
    args = arguments(CONFIG, 0x10000, 0x20000, 0x30000, 0x40004, 1000, 8, 1024, 768, preact_address=0x50000,
                     act_address=0x60000)
    assert args[-2:] == (0x50000, 0x60000) and isinstance(args[-3], np.int32) and int(args[-3]) == 768
    assert isinstance(args[2], TiledMap) and args[2].dims[0] == 2 * 768  # C is dh [M_tot, 2I]


def test_only_the_fused_backward_takes_the_extra_addresses():
    with pytest.raises(ValueError, match="dswiglu"):
        arguments(CONFIG, 0x10000, 0x20000, 0x30000, 0x40004, 1000, 8, 1024, 768)
    with pytest.raises(ValueError, match="dswiglu"):
        arguments(CONFIG.replace(epilogue="none"), 0x10000, 0x20000, 0x30000, 0x40004, 1000, 8, 1024, 768,
                  preact_address=0x50000, act_address=0x60000)


def operands(b_strides: tuple[int, int, int], out_dtype: str = "bfloat16") -> rules.Operands:
    """dY [4096, 1024] and W_down [8, 768, 1024] seen as b = w_down.transpose(1, 2) [8, 1024, 768]."""
    return rules.Operands(a_shape=(4096, 1024), a_strides=(1024, 1), a_dtype="bfloat16", b_shape=(8, 1024, 768),
                          b_strides=b_strides, b_dtype="bfloat16", offs_shape=(8,), offs_dtype="int32",
                          out_dtype=out_dtype)


def test_the_rules_admit_w_down_as_stored_only():
    admitted = rules.route(operands((768 * 1024, 1, 1024)), epilogue="dswiglu")
    assert admitted.kernel == "k6" and admitted.b_layout == "nk"
    row_major = rules.route(operands((1024 * 768, 768, 1)), epilogue="dswiglu")
    assert row_major.kernel == "torch" and "as stored" in row_major.reason
    fp32_out = rules.route(operands((768 * 1024, 1, 1024), "float32"), epilogue="dswiglu")
    assert fp32_out.kernel == "torch" and "operands' dtype" in fp32_out.reason


def test_a_kernel_not_yet_run_is_left_out_of_the_record_and_named_by_status(capsys, monkeypatch):
    monkeypatch.setattr(validation, "NOT_YET_RUN", frozenset({"torch/dswiglu"}))
    configurations = validation.kernel_configurations()
    assert not any(name.startswith("torch/dswiglu") for name in configurations)
    assert {"torch/dswiglu-bf16", "torch/dswiglu-fp16"} <= set(validation.OTHER_KERNELS)
    validation.main(["status"])
    assert "not yet run on a GPU" in capsys.readouterr().out
    monkeypatch.setattr(validation, "NOT_YET_RUN", NOT_YET_RUN)  # as it stands: both passed on a GPU
    assert {"torch/dswiglu-bf16", "torch/dswiglu-fp16"} <= set(validation.kernel_configurations())
    assert all(any(name == p or name.startswith(f"{p}-") for name in validation.OTHER_KERNELS) for p in NOT_YET_RUN)


def test_the_op_launches_the_fused_kernel_only_where_it_was_measured_faster():
    """LAUNCH_FUSED against chapter 09's measurement of it (the H100 run): the fused launch beats the dA GEMM then
    the separate pass only where it costs less than one pass over the GEMM alone."""
    from moe_gemm.measure.results import recorded
    from moe_gemm.measure.training import fused_backward_extra

    pytest.importorskip("torch")
    from moe_gemm.torch.fused_backward import LAUNCH_FUSED

    rows = (recorded("09", "h100") or {}).get("fused_backward")
    assert rows, "chapter 09 has no measurement of the fused backward"
    assert LAUNCH_FUSED == all(fused_backward_extra(r) < 1 for r in rows)


PREFETCH = FUSED_BACKWARD["k6/dswiglu-prefetch-bn128"]


@pytest.mark.parametrize("element", ["bf16", "fp16"])
def test_the_prefetching_twin_reads_h_from_shared_memory_that_tma_filled(element):
    """The same epilogue with h prefetched (k6::PrefetchH): its 128 loads per thread come from shared memory (LDS)
    instead of global memory (only the device walk's LDG is left), four more TMA loads per tile (h's boxes), no
    spills or serialized wgmma, and a ring of four stages beside h's 64 KB within the block's shared memory."""
    plain = K6Persistent("k6/dswiglu-bn128", CONFIG.replace(element=element, out=element)).compile("sm_90a")
    compiled = K6Persistent("k6/dswiglu-prefetch-bn128", PREFETCH.replace(element=element, out=element)).compile(
        "sm_90a")
    assert compiled.report.spill_store_bytes == 0 and "C7520" not in compiled.log
    names = ("LDG", "LDS", "UTMALDG", "STG", "MUFU.EX2")
    mine, theirs = opcode_counts(compiled.sass(), names), opcode_counts(plain.sass(), names)
    pairs = 2 * 32
    assert mine["LDG"] == 1 and mine["LDS"] - theirs["LDS"] == 2 * pairs  # gate and up of every pair
    assert mine["UTMALDG"] - theirs["UTMALDG"] == 4  # h's two gate and two up boxes, one call site each
    assert mine["STG"] == theirs["STG"] == 3 * pairs and mine["MUFU.EX2"] == theirs["MUFU.EX2"]
    assert PREFETCH.h_buffer_bytes == 128 * 256 * 2 + 16
    assert compiled.report.static_smem_bytes + PREFETCH.dynamic_smem_bytes <= 232448
    assert PREFETCH.stages == 4 and CONFIG.replace(stages=4, prefetch_h=True) == PREFETCH


def test_the_prefetching_twin_takes_a_tensor_map_of_h_in_boxes_of_128_rows_by_64_columns():
    args = arguments(PREFETCH, 0x10000, 0x20000, 0x30000, 0x40004, 1000, 8, 1024, 768, preact_address=0x50000,
                     act_address=0x60000)
    h_map = args[-2]
    assert isinstance(h_map, TiledMap) and h_map.address == 0x50000 and args[-1] == 0x60000
    assert h_map.dims == (2 * 768, 1000) and h_map.box == (64, 128) and h_map.swizzle_bytes == 128
    with pytest.raises(ValueError, match="ping-pong tiles without a cluster"):
        CONFIG.replace(mode="cooperative", prefetch_h=True)
    with pytest.raises(ValueError, match="ping-pong tiles without a cluster"):
        FUSED_BACKWARD["k6/dswiglu-bn128"].replace(epilogue="none", prefetch_h=True)


def test_the_epilogue_reads_h_where_tma_wrote_it():
    """kernels/wgmma_config.cuh's swizzled_128b, as written there, is TMA's 128-byte swizzle
    (moe_gemm.cuda.descriptors.swizzle): chunk c of row r of a 1 KB-aligned box 128 bytes wide."""
    from moe_gemm.cuda.descriptors import swizzle

    header = (KERNEL_DIR / "wgmma_config.cuh").read_text()
    assert "return box + row * 128 + ((chunk ^ (row % 8)) << 4);" in header
    for row in range(128):
        for chunk in range(8):
            assert swizzle(row * 128 + 16 * chunk, 128) == row * 128 + ((chunk ^ (row % 8)) << 4)


def test_the_raster_walked_fused_backward_is_the_same_kernel_with_another_launch_argument():
    """k6/dswiglu-g8-bn128 compiles to k6/dswiglu-bn128's kernel (same instance, so the same source hash) and
    differs only in the raster group the launch passes; it passed its GPU run under its own record name (admitted
    on an H100), and the dswiglu part times it under its own key."""
    from moe_gemm.measure.training import FUSED_KEYS
    from moe_gemm.torch.kernels import FUSED_BACKWARD_RECORDS, NOT_YET_RUN

    plain, g8 = FUSED_BACKWARD["k6/dswiglu-bn128"], FUSED_BACKWARD["k6/dswiglu-g8-bn128"]
    assert (plain.group, g8.group) == (1, 8) and plain.replace(group=8) == g8
    assert plain.kernel_name == g8.kernel_name
    assert FUSED_BACKWARD_RECORDS["k6/dswiglu-g8-bn128"] not in NOT_YET_RUN
    assert "torch/dswiglu-g8-bf16" not in validation.pending_kernels("torch")
    assert set(FUSED_KEYS) == set(FUSED_BACKWARD) and len(set(FUSED_KEYS.values())) == len(FUSED_KEYS)


HINTS = FUSED_BACKWARD["k6/dswiglu-hints-g8-bn128"]


@pytest.mark.parametrize("element", ["bf16", "fp16"])
def test_the_l2_hints_twin_loads_w_down_evict_last_and_h_evict_first(element):
    """k6/dswiglu-hints-g8-bn128 is the raster-walked fused kernel with L2 eviction priorities (ptx.cuh, l2_hints):
    every TMA load of B (W_down) carries a cache policy (UTMALDG.3D with a desc operand, against none in the plain
    kernel), the epilogue's 128 loads of h are evict-first (LDG.E.EF: ld.global.cs.nc), and nothing else moves:
    the same 192 stores (not hinted: st.global.cs took the epilogue past its registers), the A load unhinted, no
    spills, no serialized wgmma."""
    plain = K6Persistent("k6/dswiglu-g8-bn128", FUSED_BACKWARD["k6/dswiglu-g8-bn128"].replace(
        element=element, out=element)).compile("sm_90a")
    hinted = K6Persistent("k6/dswiglu-hints-g8-bn128", HINTS.replace(element=element, out=element)).compile("sm_90a")
    assert hinted.report.spill_store_bytes == 0 and "C7520" not in hinted.log
    pairs = 2 * 32

    def memory(compiled) -> dict[str, int]:
        lines = compiled.sass().splitlines()
        return {"tma_b": sum(1 for line in lines if "UTMALDG.3D" in line),
                "tma_b_hinted": sum(1 for line in lines if "UTMALDG.3D" in line and "desc[" in line),
                "tma_a_hinted": sum(1 for line in lines if "UTMALDG.2D" in line and "desc[" in line),
                "ldg_evict_first": sum(1 for line in lines if re.search(r"\bLDG\.E\.EF\b", line)),
                "stg": sum(1 for line in lines if re.search(r"\bSTG\.", line)),
                "stg_evict_first": sum(1 for line in lines if re.search(r"\bSTG\.E\.EF\b", line))}

    mine, theirs = memory(hinted), memory(plain)
    assert mine["tma_b"] == mine["tma_b_hinted"] == theirs["tma_b"] > 0 and theirs["tma_b_hinted"] == 0
    assert mine["tma_a_hinted"] == 0
    assert mine["ldg_evict_first"] == 2 * pairs and theirs["ldg_evict_first"] == 0
    assert mine["stg"] == theirs["stg"] == 3 * pairs and mine["stg_evict_first"] == 0


def test_the_l2_hints_are_a_rung_of_the_raster_walked_fused_backward_not_yet_run():
    """The twin differs from k6/dswiglu-g8-bn128 in the template's trailing L2_HINTS alone; the other fused
    kernels keep their instance names (so their validation records); the hints are refused where h is prefetched
    (no epilogue loads to mark) and outside the SwiGLU backward; it passed its GPU run on an H100."""
    from moe_gemm.measure.training import FUSED_KEYS
    from moe_gemm.torch.kernels import FUSED_BACKWARD_RECORDS

    assert HINTS == FUSED_BACKWARD["k6/dswiglu-g8-bn128"].replace(l2_hints=True)
    assert HINTS.kernel_name == "k6_persistent_dswiglu<0, 6, 0, true>"
    assert CONFIG.kernel_name == "k6_persistent_dswiglu<0, 6, 0>" and HINTS.label.endswith("L2 hints")
    with pytest.raises(ValueError, match="L2 hints"):
        PREFETCH.replace(l2_hints=True)
    with pytest.raises(ValueError, match="L2 hints"):
        CONFIG.replace(epilogue="none", b_layout="kn", l2_hints=True)
    assert FUSED_BACKWARD_RECORDS["k6/dswiglu-hints-g8-bn128"] not in NOT_YET_RUN
    assert {"torch/dswiglu-hints-g8-bf16", "torch/dswiglu-hints-g8-fp16"} <= set(validation.kernel_configurations())
    assert FUSED_KEYS["k6/dswiglu-hints-g8-bn128"] == "fused_hints_g8"


PAIR = FUSED_BACKWARD["k6/dswiglu-mcluster-bn128"]


@pytest.mark.parametrize("element", ["bf16", "fp16"])
def test_the_m_pair_multicasts_w_down_and_keeps_the_epilogue(element):
    """k6/dswiglu-mcluster-bn128 is the fused kernel in a cluster of two blocks along M (k6_persistent_dswiglu_
    cluster2): W_down's boxes are loaded by multicast (UTMALDG.3D.MULTICAST, none in the single-block kernel), the
    cluster meets at its barriers, and the epilogue is the single-block kernel's (the same 128 loads of h, 192
    stores, 128 exponentials); no spills, no serialized wgmma."""
    from moe_gemm.cuda.sass import function_sass, opcode_counts

    def counts(name, config):
        compiled = K6Persistent(name, config.replace(element=element, out=element)).compile("sm_90a")
        assert compiled.report.spill_store_bytes == 0 and "C7520" not in compiled.log, name
        return opcode_counts(function_sass(compiled.sass(), compiled.symbol),
                             ("UTMALDG.3D.MULTICAST", "UCGABAR_ARV", "LDG", "STG", "MUFU.EX2", "HGMMA"))

    single, pair = counts("k6/dswiglu-bn128", CONFIG), counts("k6/dswiglu-mcluster-bn128", PAIR)
    assert single["UTMALDG.3D.MULTICAST"] == 0 < pair["UTMALDG.3D.MULTICAST"] and pair["UCGABAR_ARV"] > 0
    for op in ("LDG", "STG", "MUFU.EX2", "HGMMA"):
        assert pair[op] == single[op], op


def test_the_m_pair_is_its_own_entry_point_and_admitted():
    """The cluster needs a kernel whose cluster dimensions are compiled in: the configuration names the cluster
    entry (a cluster along N, or with L2 hints, is refused: W_down is what the pair shares); the other fused
    kernels keep their names; it passed its GPU tests on an H100 (admitted: recorded in both element types, out of
    NOT_YET_RUN) and the dswiglu part times it under its own key."""
    from moe_gemm.measure.training import FUSED_KEYS
    from moe_gemm.torch.kernels import FUSED_BACKWARD_RECORDS

    assert PAIR == CONFIG.replace(cluster=2, cluster_along="m")
    assert PAIR.kernel_name == "k6_persistent_dswiglu_cluster2<0, 6, 0>" and PAIR.unit_rows == 2 * CONFIG.bm
    assert PAIR.label == "128x128 pingpong 2x1 s6"
    for wrong in ({"cluster_along": "n"}, {"l2_hints": True}):
        with pytest.raises(ValueError, match="cluster is two blocks along M"):
            PAIR.replace(**wrong)
    assert FUSED_BACKWARD_RECORDS["k6/dswiglu-mcluster-bn128"] not in NOT_YET_RUN
    assert {"torch/dswiglu-mcluster-bf16", "torch/dswiglu-mcluster-fp16"} <= set(validation.kernel_configurations())
    assert FUSED_KEYS["k6/dswiglu-mcluster-bn128"] == "fused_mcluster"


def test_each_fused_configuration_has_its_record_name_and_runs_once_admitted(monkeypatch):
    pytest.importorskip("torch")
    from moe_gemm.torch import fused_backward
    from moe_gemm.torch.fused_backward import CONFIG as OP_CONFIG
    from moe_gemm.torch.fused_backward import has_run
    from moe_gemm.torch.kernels import FUSED_BACKWARD_RECORDS

    assert set(FUSED_BACKWARD_RECORDS) == set(FUSED_BACKWARD)  # every fused configuration has its record name
    assert FUSED_BACKWARD_RECORDS[OP_CONFIG] == "torch/dswiglu" and has_run(OP_CONFIG)
    assert FUSED_BACKWARD_RECORDS["k6/dswiglu-prefetch-bn128"] == "torch/dswiglu-prefetch"
    assert has_run("k6/dswiglu-prefetch-bn128")  # admitted on an H100
    assert "torch/dswiglu-prefetch-bf16" in validation.kernel_configurations()
    monkeypatch.setattr(fused_backward, "NOT_YET_RUN", frozenset({"torch/dswiglu-prefetch"}))  # before it was
    monkeypatch.setattr(validation, "NOT_YET_RUN", frozenset({"torch/dswiglu-prefetch"}))
    assert not has_run("k6/dswiglu-prefetch-bn128") and has_run(OP_CONFIG)
    assert not any(n.startswith("torch/dswiglu-prefetch") for n in validation.kernel_configurations())
