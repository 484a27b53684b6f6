"""k6 without a GPU: every rung compiles for sm_90a without spills and within 227 KB, its SASS has the
instructions each rung is about, the host walk visits every tile once in the grouped order, the
chooser's cache and the refusals behave, and the kernel and the Python agree on what they share: the
shared-memory budget, the device walk's experts, the block size, the template parameters each
configuration instantiates and the parameters each launch passes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from moe_gemm.cuda.tensormap import TiledMap
from moe_gemm.variants.k6 import K6Persistent, ladder
from moe_gemm.variants.k6.config import (
    AUTO_CANDIDATES,
    CANDIDATES,
    ELEMENT_CODES,
    FUSED,
    FUSED_BACKWARD,
    LADDER,
    MAX_EXPERTS,
    NOT_YET_RUN,
    STATIC_SMEM_ALLOWANCE,
    THREADS,
    K6Config,
)
from moe_gemm.variants.k6.launch import arguments
from moe_gemm.variants.k6.walk import expert_units, unit_list
from moe_gemm.variants.sm90.config import SMEM_LIMIT

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
SOURCE = (KERNELS / "k6_persistent.cu").read_text()
DESCRIPTORS = (KERNELS / "descriptor_steps.cuh").read_text()  # the plans k6 and k7 step their descriptors by


@pytest.mark.parametrize("name", list(LADDER))
def test_every_rung_builds_without_spills_within_the_shared_memory(name):
    variant = K6Persistent(name)
    report = variant.compile("sm_90a").report
    assert report.spill_store_bytes == 0 and report.spill_load_bytes == 0
    assert report.static_smem_bytes + variant.config.dynamic_smem_bytes <= SMEM_LIMIT
    assert "C7520" not in variant.compile("sm_90a").log  # no serialized wgmma


@pytest.mark.parametrize("name", ["k6/pingpong-bn192", "k6/pingpong-cluster-bn192", "k6/pingpong-mcluster-bn192",
                                  "k6/coop256-cluster-bn128"])
def test_sass_has_what_the_rung_adds(name):
    from moe_gemm.cuda.sass import opcode_counts

    variant = K6Persistent(name)
    counts = opcode_counts(variant.compile("sm_90a").sass(),
                           ("HGMMA", "UTMASTG", "STSM", "USETMAXREG", "UTMALDG", "UCGABAR"))
    assert counts["HGMMA"] == 12  # (two m64 slices + one) x 4 k16 steps; the empty path has none
    assert counts["UTMASTG"] >= 1 and counts["STSM"] >= 16
    assert counts["USETMAXREG"] == 2
    assert counts["UTMALDG"] >= 2
    assert (counts["UCGABAR"] > 0) == (variant.config.cluster == 2)  # cluster barriers only in clusters


def test_the_walk_visits_every_tile_once_in_raster_groups():
    counts = np.array([0, 700, 130, 1, 0, 256])
    units = unit_list(counts, 2000, 128, 384, 4)
    assert len(units) == sum(-(-c // 128) for c in counts) * 6  # 6 units of 384 columns cover N = 2000
    assert len({tuple(u) for u in units}) == len(units)
    assert units[:, 2].min() >= 1 and units[:, 2].max() <= 128
    # within expert 1 (6 M tiles), group 4: M tiles 0-3 column by column, then 4-5
    order = expert_units(700, 6, 128, 4)
    assert order[:5].tolist() == [[0, 0], [1, 0], [2, 0], [3, 0], [0, 1]]
    assert order[24].tolist() == [4, 0] and order[25].tolist() == [5, 0]


def test_a_configuration_past_227_kb_is_refused():
    with pytest.raises(ValueError, match="shared memory"):
        K6Persistent("too-big", K6Config("cooperative", 256, stages=5, staging_boxes=4))
    with pytest.raises(ValueError, match="raster group"):
        unit_list(np.array([5]), 64, 128, 128, 0)


def test_the_chooser_chooses_among_ladder_rungs():
    assert set(AUTO_CANDIDATES) <= set(LADDER)
    assert all(v.config.schedule == "device" for v in ladder() if v.name in AUTO_CANDIDATES)


@pytest.mark.parametrize("name", list(FUSED))
def test_the_swiglu_epilogue_builds_with_its_exponentials(name):
    from moe_gemm.cuda.sass import opcode_counts

    variant = K6Persistent(name)
    compiled = variant.compile("sm_90a")
    assert compiled.report.spill_store_bytes == 0
    counts = opcode_counts(compiled.sass(), ("MUFU.EX2", "HGMMA", "UCGABAR"))
    assert counts["MUFU.EX2"] == 64  # silu's exp for 2 m64 slices x 32 output values per thread
    assert counts["HGMMA"] == 12
    assert (counts["UCGABAR"] > 0) == (variant.config.cluster == 2)  # the cluster rungs sync their pair


def test_the_swiglu_reference_pairs_each_gate_column_with_the_up_column_n_over_2_further():
    from moe_gemm.model.problem import problem_from_counts
    from moe_gemm.model.reference import reference_gemm, swiglu_reference

    problem = problem_from_counts(np.array([3, 2]), 64, 256, seed=1)
    full, act = reference_gemm(problem), swiglu_reference(problem)
    gate, up = full[:, 64:128], full[:, 192:256]  # the second 64-column gate block and its up block
    np.testing.assert_allclose(act[:, 64:128], gate / (1 + np.exp(-gate)) * up, rtol=1e-6)
    with pytest.raises(ValueError, match="multiple of 128"):
        swiglu_reference(problem_from_counts(np.array([3]), 64, 192))


def test_the_robust_rule_picks_the_rung_closest_to_the_best_on_both_routings(ladder_candidates):
    """Chapter 07's ladder at 16,384 rows, balanced and at s = 1.2 (one run): the M pair is the fastest
    candidate on balanced rows but more than 5% behind at s = 1.2; the robust rule takes the N pair, whose
    worse slowdown is smaller, under 6% at both."""
    from moe_gemm.chapter import chapter_module, recorded
    from moe_gemm.model.workloads import Workload
    from moe_gemm.variants.k6.auto import robust_choice

    data = recorded("07")
    if data is None:
        pytest.skip("no recorded results")
    run = chapter_module("07")
    ladder = run.of_part(data["records"], "ladder")
    timings = [{name: run.find(ladder, name, Workload(16384, skew))["median_ms"] for name in ladder_candidates}
               for skew in (0.0, 1.2)]
    balanced, skewed = ({name: ms / min(t.values()) for name, ms in t.items()} for t in timings)
    assert balanced["k6/pingpong-mcluster-bn192"] == 1.0 and skewed["k6/pingpong-mcluster-bn192"] > 1.05
    assert robust_choice(timings) == "k6/pingpong-cluster-bn192"
    worse = max(balanced["k6/pingpong-cluster-bn192"], skewed["k6/pingpong-cluster-bn192"])
    assert worse < min(1.06, skewed["k6/pingpong-mcluster-bn192"])
    assert robust_choice([{"a": 1.0, "b": 2.0}, {"b": 1.0}]) == "b"  # only candidates timed on both count
    with pytest.raises(ValueError, match="every routing"):
        robust_choice([{"a": 1.0}, {"b": 1.0}])


def test_k6_auto_tunes_through_the_shared_loop(monkeypatch, tmp_path):
    """K6Auto with the GPU replaced: each candidate timed on the routing at hand and on the skewed one
    (the problem rerouted once per routing), one that refuses the shape left out, the robust choice kept
    in the cache file and read back without timing."""
    from types import SimpleNamespace

    from moe_gemm.cuda.gpu import GpuInfo
    from moe_gemm.model.problem import problem_from_counts
    from moe_gemm.variants.k6 import auto

    problem = problem_from_counts(np.array([100, 28, 0, 128]), 64, 256)
    rerouted = []
    dev = SimpleNamespace(problem=problem, rerouted=lambda counts: rerouted.append(counts.tolist()) or "skewed")
    made_up = {"k6/pingpong-bn192": (1.0, 3.0), "k6/coop256-cluster-bn192": (1.1, 1.2)}
    timed = []

    def prepare(variant, routed):
        if variant.name == "k6/pingpong-bn128":
            raise ValueError("k6/pingpong-bn128 cannot take these inputs")
        return SimpleNamespace(launch=lambda: timed.append((variant.name, routed)))

    def median_ms(run):
        run()
        name, routed = timed[-1]
        return made_up.get(name, (9.0, 9.0))[1 if routed == "skewed" else 0]

    monkeypatch.setattr(auto, "require_sm90a", lambda name: GpuInfo("Test GPU", (9, 0), 132, 13000))
    monkeypatch.setattr(K6Persistent, "prepare", prepare)
    monkeypatch.setattr(auto, "median_ms", median_ms)
    chooser = auto.K6Auto(cache_file=tmp_path / "auto.json")
    chosen = chooser.choose(dev)
    assert chosen["choice"] == "k6/coop256-cluster-bn192" and chosen["tuning"] == "tuned"
    assert len(rerouted) == 1 and sum(rerouted[0]) == problem.tokens
    others = [name for name in AUTO_CANDIDATES if name != "k6/pingpong-bn128"]
    assert timed == [(name, dev) for name in others] + [(name, "skewed") for name in others]
    assert set(chosen["timings_ms"]) == set(others) and chosen["robust_skew"] == auto.ROBUST_SKEW
    assert chooser.choose(dev)["tuning"] == "cached" and len(timed) == 2 * len(others)
    key = auto.shape_key(problem.tokens, 4, 64, 256, "kn", "Test GPU")
    assert auto.recall(key, tmp_path / "auto.json")["choice"] == "k6/coop256-cluster-bn192"


# ---- what the kernel and the Python share -------------------------------------------------------

def entry_points() -> dict[str, tuple[list[tuple[str, str, str | None]], str]]:
    """The __global__ templates of kernels/k6_persistent.cu: name -> ([(kind, parameter, default)], attributes);
    default is None for a parameter without one."""
    found = re.findall(r"template <([^>]*)>\s*__global__ void (.*?)(\w+)\(K6_PARAMS[,)]", SOURCE, re.S)

    def parameter(text: str) -> tuple[str, str, str | None]:
        declaration, _, default = text.partition("=")
        kind, name = declaration.split()
        return kind, name, default.strip() or None

    return {name: ([parameter(p) for p in params.split(",")], attributes) for params, attributes, name in found}


def test_the_shared_memory_budget_is_the_kernels():
    """The kernel asserts ring + staging + alignment <= the block's limit less the static allowance."""
    budget = re.search(r"SWIZZLE_ALIGN <= (\d+) - (\d+),", SOURCE)
    assert (int(budget.group(1)), int(budget.group(2))) == (SMEM_LIMIT, STATIC_SMEM_ALLOWANCE)


def test_the_static_allowance_is_the_largest_static_shared_memory_rounded_up():
    static = [K6Persistent(name, config).compile("sm_90a").report.static_smem_bytes
              for name, config in {**LADDER, **FUSED, **FUSED_BACKWARD}.items()]
    assert max(static) <= STATIC_SMEM_ALLOWANCE < max(static) + 256


def test_the_device_walk_and_the_block_are_the_kernels():
    walk = (KERNELS / "tile_walk.cuh").read_text()
    assert int(re.search(r"\bMAX_EXPERTS = (\d+)", walk).group(1)) == MAX_EXPERTS
    warpgroup = int(re.search(r"constexpr int WARPGROUP = (\d+);", (KERNELS / "wgmma_config.cuh").read_text()).group(1))
    entries = entry_points()
    assert sorted(entries) == ["k6_persistent", "k6_persistent_cluster2", "k6_persistent_dswiglu",
                               "k6_persistent_dswiglu_cluster2", "k6_persistent_dswiglu_prefetch",
                               "k6_persistent_swiglu", "k6_persistent_swiglu_cluster2"]
    for name, (_, attributes) in entries.items():
        warpgroups = re.search(r"__launch_bounds__\((\d+) \* sm90::WARPGROUP, 1\)", attributes)
        assert warpgroups and int(warpgroups.group(1)) * warpgroup == THREADS, name
        assert ("__cluster_dims__(2, 1, 1)" in attributes) == name.endswith("_cluster2"), name


def test_every_kernel_name_fills_its_template_in_order():
    """Each configuration's kernel_name against the C++ template it instantiates: as many arguments as
    the template has parameters, each of the parameter's kind and holding the configuration's value."""
    entries = entry_points()
    used = set()
    for name, config in {**LADDER, **FUSED, **FUSED_BACKWARD}.items():
        entry, values = re.fullmatch(r"(\w+)<(.*)>", config.kernel_name).groups()
        parameters, _ = entries[entry]
        values = [v.strip() for v in values.split(",")]
        # the name may leave out trailing parameters that have defaults (PDL), which then hold them
        assert len(values) <= len(parameters) and all(d is not None for _, _, d in parameters[len(values):]), name
        values += [d for _, _, d in parameters[len(values):]]
        wanted = {"MODE": 0 if config.mode == "pingpong" else 1, "BN": config.bn, "STAGES": config.stages,
                  "B_K_MAJOR": config.b_layout == "nk", "STAGING_BOXES": config.staging_boxes,
                  "DEVICE_SCHEDULE": config.schedule == "device", "ALONG_M": config.cluster_along == "m",
                  "IN": ELEMENT_CODES[config.element], "OUT": ELEMENT_CODES[config.out], "PDL": config.pdl,
                  "PRIVATE_RINGS": config.private_rings, "PRODUCER_TAIL": config.producer_tail,
                  "CURSOR": config.cursor, "LIST_UNITS": config.listed, "L2_HINTS": config.l2_hints,
                  "RASTER_N": config.raster == "n"}
        for (kind, parameter, _), value in zip(parameters, values):
            given = {"true": True, "false": False}[value] if kind == "bool" else int(value)
            assert given == wanted[parameter] and type(given) is type(wanted[parameter]), (name, parameter, value)
        used.add(entry)
    assert used == set(entries)  # every entry point is some configuration's


def test_the_element_codes_are_the_kernels():
    """K6Config's element names map to kernels/epilogues.cuh's sm90::Element values, and a configuration's
    types reach its kernel name as the IN and OUT arguments."""
    enum = re.search(r"enum Element : int \{ BF16 = (\d), F16 = (\d), F32 = (\d) \};",
                     (KERNELS / "epilogues.cuh").read_text())
    assert tuple(map(int, enum.groups())) == (ELEMENT_CODES["bf16"], ELEMENT_CODES["fp16"], ELEMENT_CODES["fp32"])
    typed = LADDER["k6/pingpong-bn128"].replace(element="fp16", out="fp32")
    assert typed.kernel_name.endswith(", 1, 2>") and typed.label.endswith("fp16->fp32")
    with pytest.raises(ValueError, match="bf16 or fp16 operands"):
        LADDER["k6/pingpong-bn128"].replace(element="fp32")


@pytest.mark.parametrize("name", ["k6/pingpong-bn128", "k6/pingpong-mcluster-bn192", "k6/pingpong-cluster-bn192-kmajor",
                                  "k6/swiglu-coop256-cluster"])
@pytest.mark.parametrize("types", [("fp16", "fp16"), ("bf16", "fp32"), ("fp16", "fp32")])
def test_every_type_builds_with_its_wgmma_and_its_stores(name, types):
    """fp16 operands: HGMMA without the .BF16 suffix (fp16 is the default type); an fp32 C: 8-byte register
    stores and no staging (no STSM, no TMA store); a 16-bit C keeps the staged TMA-store epilogue."""
    from moe_gemm.cuda.sass import opcode_counts

    config = {**LADDER, **FUSED}[name].replace(element=types[0], out=types[1])
    kernel = K6Persistent(name, config).compile("sm_90a")
    assert kernel.report.spill_store_bytes == 0 and "C7520" not in kernel.log
    sass = kernel.sass()
    wgmmas = set(re.findall(r"HGMMA\.64x\d+x16\.F32(\.BF16)?", sass))
    assert wgmmas == ({""} if types[0] == "fp16" else {".BF16"})
    counts = opcode_counts(sass, ("STSM", "UTMASTG", "STG.E.64"))
    fp32 = types[1] == "fp32"
    assert (counts["STSM"] == 0 and counts["UTMASTG"] == 0) == fp32 and (counts["STG.E.64"] > 0) == fp32


def test_the_descriptor_constants_are_the_hosts_plans():
    """k6 (and k7) build their descriptors from compile-time plans; they are what moe_gemm.cuda.descriptors derives
    from the ISA's layout rules for the 128-byte-swizzled boxes (and what k3 and k5 get at run time)."""
    from moe_gemm.cuda.descriptors import operand_plan

    for name, major in (("K_MAJOR_PLAN", "K"), ("MN_MAJOR_PLAN", "MN")):
        bits, k16, mn64 = re.search(rf"constexpr OperandPlan {name}\{{(0x[0-9a-f]+)ull, (\d+), (\d+)\}};",
                                    DESCRIPTORS).groups()
        plan = operand_plan(major)
        assert (int(bits, 16), int(k16), int(mn64)) == (plan.bits, plan.k16_bytes, plan.mn64_bytes), name


# The main loop's instructions per k-step and warp, for two m64 slices (8 HGMMA) and one (4): with the
# descriptors rebuilt from a run-time plan at every wgmma it was 134 and 93 at the M-pair cluster rung.
MAIN_LOOP_LIMIT = {8: 80, 4: 70}


@pytest.mark.parametrize("name", ["k6/pingpong-mcluster-bn192", "k6/pingpong-bn192", "k6/coop256-cluster-bn128",
                                  "k6/pingpong-cluster-bn192-kmajor", "k6/swiglu-coop256-cluster"])
def test_the_main_loop_adds_constant_steps_to_two_descriptors(name):
    from moe_gemm.cuda.sass import main_loop_instructions

    sass = K6Persistent(name).compile("sm_90a").sass()
    for wgmmas, limit in MAIN_LOOP_LIMIT.items():
        assert main_loop_instructions(sass, wgmmas) <= limit, (name, wgmmas)


def test_the_arguments_are_k6_params_in_number_kind_and_order():
    macro = re.search(r"#define K6_PARAMS(.*?)\n\n", SOURCE, re.S).group(1)
    parameters = [p.split() for p in re.sub(r"/\*.*?\*/|\\", " ", macro).split(",")]

    def kind(declaration: list[str]) -> str:
        text = " ".join(declaration[:-1])
        if "CUtensorMap" in text:
            return "tensor map"
        if "OperandPlan" in text:
            return "plan"
        return "pointer" if "*" in text else text  # 'int'

    config = LADDER["k6/pingpong-cluster-bn192-host"]
    args = arguments(config, 0x10000, 0x20000, 0x30000, 0x40004, 1000, 64, 1024, 2688, 0x50000, 37)
    kinds = ["tensor map" if isinstance(arg, TiledMap)
             else "int" if isinstance(arg, np.int32) else "pointer" if type(arg) is int else repr(arg) for arg in args]
    assert kinds == [kind(p) for p in parameters]
    by_name = dict(zip((p[-1] for p in parameters), args))
    assert {name: by_name[name] for name in ("C", "units_list", "num_units", "ends", "experts", "group", "K", "N")} \
        == {"C": 0x30000, "units_list": 0x50000, "num_units": 37, "ends": 0x40004, "experts": 64, "group": 1,
            "K": 1024, "N": 2688}


@pytest.mark.parametrize(("ends", "tokens", "offsets"), [
    ((3, 7, 10), 10, (0, 3, 7, 10)),  # well formed: unchanged
    ((3, 7, 8), 10, (0, 3, 7, 8)),  # the last end short of M_tot: rows 8, 9 belong to no expert
    ((7, 3, 10), 10, (0, 7, 7, 10)),  # decreasing: expert 1 gets no rows
    ((-5, 4, 99), 10, (0, 0, 4, 10)),  # negative and beyond M_tot: clamped
    ((50, 2, -1), 10, (0, 10, 10, 10)),
])
def test_the_device_walk_clamps_any_ends_into_the_tensors(ends, tokens, offsets):
    from moe_gemm.variants.k6.walk import walked_offsets

    assert walked_offsets(np.array(ends), tokens).tolist() == list(offsets)


def test_the_device_walk_clamps_in_the_kernel_as_its_mirror_does():
    """kernels/tile_walk.cuh clamps each end to [0, tokens] and takes the running maximum before it counts
    a unit: the mirror above is only right while the kernel does both."""
    walk = (KERNELS / "tile_walk.cuh").read_text()
    assert "min(max(ends[e], 0), tokens)" in walk
    assert "max(offsets[e + 1], high)" in walk and "end = max(end, up)" in walk



def _producer_opcodes(sass: str) -> list[str]:
    """The producer warpgroup's opcodes, in listing order: the SASS after its setmaxnreg.dec (USETMAXREG.DEALLOC)."""
    from moe_gemm.cuda.sass import mnemonics

    return mnemonics(sass[sass.index("USETMAXREG.DEALLOC"):])


def test_the_producer_looks_a_unit_up_before_it_waits_for_a_free_stage():
    """What chapter 07's page reads from the compile of the rung k6/auto chose at the walk's misses: the device
    walk's per-unit lookup (the binary search's shared-memory loads and the divisions' reciprocals, MUFU.RCP) is
    placed ahead of the producer's first wait on a stage's empty barrier (SYNCS.PHASECHK), as the host list's
    load of the unit (LDG) is, so both run while the producer would be waiting for the consumers anyway."""
    device = LADDER["k6/pingpong-mcluster-bn192"]
    for config, lookup in ((device, ("LDS", "MUFU.RCP")), (device.replace(schedule="host"), ("LDG.E.128.CONSTANT",))):
        ops = _producer_opcodes(K6Persistent("k6/pingpong-mcluster-bn192", config).compile("sm_90a").sass())
        wait = ops.index("SYNCS.PHASECHK.TRANS64.TRYWAIT")
        for op in lookup:
            assert op in ops[:wait], (config.schedule, op)
        assert "UTMALDG.2D" in ops[wait:]  # the unit's A load follows the wait

@pytest.mark.parametrize("seed", range(6))
def test_the_walks_cursor_finds_the_units_the_list_holds(seed):
    """The cursor's mirror (walk.cursor_walk, kernels/tile_walk.cuh's Walk::unit with a Cursor) against the host
    list for blocks of persistent grids: many experts, a third of them empty, raster groups of one to eight M tiles,
    strides below and above the units of one group; the GPU tests hold the kernel to the host list."""
    from moe_gemm.variants.k6.walk import cursor_walk, unit_list

    rng = np.random.default_rng(seed)
    for _ in range(40):
        experts = int(rng.integers(1, 60))
        counts = rng.integers(0, 3000, experts) * (rng.random(experts) > 0.3)
        N, group, stride = int(rng.integers(1, 3000)), int(rng.choice([1, 2, 3, 8])), int(rng.integers(1, 200))
        every = unit_list(counts, N, 256, 192, group)
        for first in {0, int(rng.integers(0, stride)), stride - 1}:
            np.testing.assert_array_equal(cursor_walk(counts, N, 256, 192, group, first, stride), every[first::stride])


def test_the_cursor_rung_is_the_m_pair_with_the_cursor():
    """k6/pingpong-mcluster-bn192-cursor differs from the M pair in the template's CURSOR alone; the cursor belongs
    to the plain GEMM's device walk (the host list has no lookup to shorten)."""
    cursor, pair = LADDER["k6/pingpong-mcluster-bn192-cursor"], LADDER["k6/pingpong-mcluster-bn192"]
    assert cursor == pair.replace(cursor=True) and cursor.kernel_name.endswith(", false, false, true>")
    for wrong in ({"schedule": "host"}, {"epilogue": "swiglu", "bn": 128}):
        with pytest.raises(ValueError, match="cursor"):
            cursor.replace(**wrong)


def test_the_listed_rung_reads_its_units_from_shared_memory_before_its_first_wait():
    """k6/pingpong-mcluster-bn192-listed is the M pair with LIST_UNITS: 2 KB more dynamic shared memory (the list,
    within the limit), no spills, and its producer's first unit comes from a 16-byte shared-memory load ahead of
    its first wait for a free stage, where the plain walk's producer has none."""
    from moe_gemm.variants.k6.config import LISTED, STATIC_SMEM_ALLOWANCE
    from moe_gemm.variants.sm90.config import SMEM_LIMIT

    listed, pair = LADDER["k6/pingpong-mcluster-bn192-listed"], LADDER["k6/pingpong-mcluster-bn192"]
    assert listed == pair.replace(listed=True) and listed.dynamic_smem_bytes == pair.dynamic_smem_bytes + 16 * LISTED
    assert listed.dynamic_smem_bytes + STATIC_SMEM_ALLOWANCE <= SMEM_LIMIT
    for config, has_list in ((listed, True), (pair, False)):
        compiled = K6Persistent("k6/pingpong-mcluster-bn192", config).compile("sm_90a")
        assert compiled.report.spill_store_bytes == 0
        ops = _producer_opcodes(compiled.sass())
        assert ("LDS.128" in ops[:ops.index("SYNCS.PHASECHK.TRANS64.TRYWAIT")]) == has_list
    for wrong in ({"schedule": "host"}, {"epilogue": "swiglu", "bn": 128}):
        with pytest.raises(ValueError, match="unit list"):
            listed.replace(**wrong)


# ---- (h) programmatic dependent launch --------------------------------------------------------------------------

GLOBAL_MEMORY_OPCODES = ("LDG", "STG", "UTMALDG", "UTMASTG")


def _first_offsets(sass: str) -> dict[str, list[int]]:
    """Each opcode's offsets in the listing (its first word: LDG.E.64 counts as LDG)."""
    found: dict[str, list[int]] = {}
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            found.setdefault(m.group(2), []).append(int(m.group(1), 16))
    return found


@pytest.mark.parametrize("name", [n for n, c in LADDER.items() if c.pdl])
def test_a_pdl_rung_waits_once_after_its_barriers_and_before_any_global_memory(name):
    """griddepcontrol.wait is ACQBULK in SASS and launch_dependents PREEXIT: one of each; the wait after the
    mbarrier inits (SYNCS), which overlap the launch before, and ahead of every load and store of global memory
    (the expert ends' LDG, A's and B's TMA loads, C's stores) in the listing; its twin without PDL has neither."""
    offsets = _first_offsets(K6Persistent(name).compile("sm_90a").sass())
    assert len(offsets["ACQBULK"]) == 1 and len(offsets["PREEXIT"]) == 1
    wait = offsets["ACQBULK"][0]
    assert min(offsets["SYNCS"]) < wait
    assert all(min(offsets[op]) > wait for op in GLOBAL_MEMORY_OPCODES if op in offsets)
    twin = name.removesuffix("-pdl")
    assert LADDER[twin] == LADDER[name].replace(pdl=False)
    plain = _first_offsets(K6Persistent(twin).compile("sm_90a").sass())
    assert "ACQBULK" not in plain and "PREEXIT" not in plain


def test_a_pdl_rung_is_the_same_instance_with_one_more_template_argument():
    config = LADDER["k6/pingpong-mcluster-bn192-pdl"]
    assert config.kernel_name == LADDER["k6/pingpong-mcluster-bn192"].kernel_name[:-1] + ", true>"
    assert config.label.endswith(" pdl")
    with pytest.raises(ValueError, match="plain GEMM"):
        FUSED["k6/swiglu-bn128"].replace(pdl=True)


def test_a_programmatic_launch_carries_the_stream_serialization_attribute():
    from cuda.bindings import driver

    from moe_gemm.cuda.launch import programmatic_launch_config

    config = programmatic_launch_config((132, 1, 1), (384, 1, 1), 204_800, 0)
    assert config.numAttrs == 1 and (config.gridDimX, config.blockDimX, config.sharedMemBytes) == (132, 384, 204_800)
    attribute = config.attrs[0]
    assert attribute.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attribute.value.programmaticStreamSerializationAllowed == 1


def test_rungs_not_yet_run_are_compiled_but_neither_run_nor_recorded():
    from moe_gemm.core.chapters import chapter_module
    from moe_gemm.measure import validation

    assert NOT_YET_RUN <= set(LADDER) and {r.name for r in ladder()} >= NOT_YET_RUN  # compiled, in the report
    assert not NOT_YET_RUN & set(chapter_module("07").ladder_names())  # not checked or timed by the chapter
    assert not NOT_YET_RUN & set(validation.kernel_configurations())  # not in the validation record's scope
    assert not NOT_YET_RUN & set(AUTO_CANDIDATES)  # nor among what k6/auto (and so the op) launches


def test_the_fused_backwards_tile_on_the_raster_walk_is_its_kernel_with_another_launch_argument():
    """k6/pingpong-bn128-g8 (chapter 09's test of the raster walk on a plain GEMM) launches k6/pingpong-bn128's
    kernel with a raster group of 8: the same instance name, so the same machine code; its GPU tests have passed
    (it is in the validation record), and chapter 09 profiles it at the Mixtral-like dA cell."""
    import json

    from moe_gemm.core.chapters import chapter_module
    from moe_gemm.core.paths import KERNEL_DIR
    from moe_gemm.variants.k6.config import NOT_YET_RUN

    tile, raster = LADDER["k6/pingpong-bn128"], LADDER["k6/pingpong-bn128-g8"]
    assert raster == tile.replace(group=8) and raster.kernel_name == tile.kernel_name
    assert raster.label == "128x128 pingpong g8 s6" and "k6/pingpong-bn128-g8" not in NOT_YET_RUN
    assert "k6/pingpong-bn128-g8" in json.loads((KERNEL_DIR / "validated.json").read_text())["kernels"]
    run = chapter_module("09")
    assert {"k6/pingpong-bn128-g8", "k6/dswiglu-hints-g8-bn128"} <= set(run.PROFILED[run.DA_CELL])


def test_private_staging_rings_drop_the_epilogues_turns_and_a_stage():
    """k6/pingpong-bn192-rings: a ring of three staging boxes per ping-pong warpgroup (as cooperative tiles have),
    so the epilogue-order barrier's sync and arrive leave the SASS and the ring of stages shrinks to four."""
    from moe_gemm.cuda.sass import opcode_counts

    rings, shared = LADDER["k6/pingpong-bn192-rings"], LADDER["k6/pingpong-bn192"]
    assert rings == shared.replace(stages=4, staging_boxes=3, private_rings=True)
    assert rings.dynamic_smem_bytes == 4 * (128 + 192) * 64 * 2 + 2 * 3 * 64 * 64 * 2 + 1024
    counts = {name: opcode_counts(K6Persistent(name).compile("sm_90a").sass(), ("BAR", "UTMASTG", "STSM"))
              for name in ("k6/pingpong-bn192-rings", "k6/pingpong-bn192")}
    assert counts["k6/pingpong-bn192"]["BAR"] - counts["k6/pingpong-bn192-rings"]["BAR"] == 2
    assert counts["k6/pingpong-bn192"]["STSM"] == counts["k6/pingpong-bn192-rings"]["STSM"]
    for wrong in ({"mode": "cooperative"}, {"epilogue": "swiglu", "bn": 128}, {"cluster": 2}):
        with pytest.raises(ValueError, match="private staging rings"):
            rings.replace(**wrong)


def test_the_producer_tail_replaces_the_closing_cluster_barrier():
    """k6/pingpong-mcluster-bn192-tail: of the two cluster barriers (arrive and wait each) only the opening one
    is left, and the producer's tail adds its waits on the ring's empty barriers; everything else is the M pair's."""
    from moe_gemm.cuda.sass import opcode_counts

    tail, pair = LADDER["k6/pingpong-mcluster-bn192-tail"], LADDER["k6/pingpong-mcluster-bn192"]
    assert tail == pair.replace(producer_tail=True) and tail.dynamic_smem_bytes == pair.dynamic_smem_bytes
    counts = {name: opcode_counts(K6Persistent(name).compile("sm_90a").sass(), ("UCGABAR", "HGMMA", "UTMALDG"))
              for name in ("k6/pingpong-mcluster-bn192-tail", "k6/pingpong-mcluster-bn192")}
    assert counts["k6/pingpong-mcluster-bn192"]["UCGABAR"] == 2 * counts["k6/pingpong-mcluster-bn192-tail"]["UCGABAR"]
    assert counts["k6/pingpong-mcluster-bn192"]["HGMMA"] == counts["k6/pingpong-mcluster-bn192-tail"]["HGMMA"]
    for wrong in ({"cluster": 1}, {"epilogue": "swiglu", "bn": 128}):
        with pytest.raises(ValueError, match="producer tail"):
            tail.replace(**wrong)


def test_the_walk_along_n_is_quacks_order_and_visits_every_unit_once():
    """The raster along N (walk.expert_units with raster "n", kernels/tile_walk.cuh's Walk<.., true>): groups of
    `group` columns of units, the expert's M units walked inside each group with its columns fastest, every other
    group from the last M unit up, a narrow last group; every unit once. Only the plain GEMM's device walk takes it."""
    order = expert_units(700, 20, 128, 8, "n")  # 6 M units, columns 0-7, 8-15 and a narrow 16-19
    assert len(order) == 6 * 20 and len({tuple(u) for u in order}) == 120
    assert order[:9].tolist() == [[0, n] for n in range(8)] + [[1, 0]]
    assert order[48:50].tolist() == [[5, 8], [5, 9]] and order[95].tolist() == [0, 15]
    assert order[96:101].tolist() == [[0, 16], [0, 17], [0, 18], [0, 19], [1, 16]]
    assert np.array_equal(expert_units(700, 20, 128, 1, "n")[:7], [[0, 0], [1, 0], [2, 0], [3, 0], [4, 0], [5, 0],
                                                                   [5, 1]])
    units = unit_list(np.array([300, 0, 700]), 2000, 256, 384, 8, "n")
    assert len(units) == 2 * 6 + 3 * 6 and set(units[:, 0]) == {0, 2}
    rung = LADDER["k6/coop256-cluster-bn192-n8"]
    assert rung == LADDER["k6/coop256-cluster-bn192-g8"].replace(raster="n") and rung.label.endswith("n8 s3")
    assert rung.kernel_name.endswith(", false, false, false, false, true>")  # RASTER_N, the last template argument
    assert LADDER["k6/coop256-cluster-bn192-g8"].kernel_name.endswith(", 0, 0>")  # the other rungs' names unchanged
    for wrong in ({"cursor": True}, {"listed": True}, {"schedule": "host"}):
        with pytest.raises(ValueError, match="raster along N"):
            rung.replace(**wrong)
    # admitted on an H100: a candidate of k6/auto's, with no unit-list twin (it looks units up one by one)
    name = "k6/coop256-cluster-bn192-n8"
    assert name not in NOT_YET_RUN and name in CANDIDATES and name in AUTO_CANDIDATES
    assert f"{name}-listed" not in LADDER
