"""k5: adaptive tile shapes in one persistent wgmma launch (kernels/k5_adaptive.cu), chapter 06.

======================  ===========================================================================
``k5/host``             the cost model (moe_gemm.cost_model) picks the remainder policy for this
                        routing; the host builds the tile list, expert-major as k3's
``k5/host-lpt``         the same tiles longest kind first (the ordering experiment)
``k5/device``           the launch takes only the device offsets: every block builds the schedule
                        with a prefix sum over the experts, under the routing-independent greedy
                        policy (a device-scheduled launch cannot see the counts)
``k5/device-graph``     the same launch captured once in a CUDA graph and replayed
``k5/m128``, ``k5/m64``, ``k5/swap``  one fixed policy each (remainders in M128, M64 or SWAP
                        tiles): the checks cover every tile kind on every edge case
======================  ===========================================================================

Refused before any launch, with a ValueError naming the rule: what k3 refuses (K, N multiples of
8, K of 64, 16-byte alignment, a GPU other than sm_90a), and more than 256 experts for the device
schedule, whose prefix sums live in shared memory.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..bench import Prepared
from ..build import TensorMapArg, launch, prefer_shared_memory
from ..cost_model import Calibration, Prediction, choose_policy, greedy_policy, nominal_calibration, predict
from ..device import DeviceArray, DeviceProblem, check_driver, stream_handle, to_device
from ..mixed_tiles import BM, BN, FIXED_128, Order, Policy, kind_counts, mixed_eta, mixed_tile_list
from ..descriptors import tma_write_box
from ..tensormap import TiledMap, matrix_map
from .compiled import NamedConfigVariant
from .k3 import BK, SWIZZLE_ALIGN, K3Config, check_inputs, operand_maps, output_map, plan_argument, plans, require_sm90a

SOURCE = "k5_adaptive.cu"
KERNEL_FUNCTION = "k5_adaptive"
MAX_EXPERTS = 256  # kernels/k5_adaptive.cu, k5::MAX_EXPERTS
STAGES = 4  # 4 x 40 KB of ring + 48 KB of C staging: k3/tmastore-bn192's budget
TOKEN_BOX_ROWS = 16  # the A boxes of M64 and SWAP tiles
# The TMA boxes and descriptor plans: A in 128-row boxes as k3/tmastore-bn192 loads it, B as given.
MAPS = K3Config(bm=BM, bn=BN, consumers=2, stages=STAGES, b_layout="kn", tma_store=True)
POLICY_DTYPE = np.dtype([("swap_max", "<i4"), ("m64_max", "<i4")])
Schedule = Literal["host", "device"]
PolicyChoice = Literal["model", "greedy"] | Policy


@dataclass(frozen=True)
class K5Config:
    schedule: Schedule
    policy: PolicyChoice  # a fixed Policy, the cost model's choice per routing, or the greedy rule
    order: Order = "expert"
    graph: bool = False  # replay one captured CUDA graph instead of launching

    @property
    def kernel_name(self) -> str:
        return f"{KERNEL_FUNCTION}<{STAGES}, {'true' if self.schedule == 'device' else 'false'}>"

    @property
    def dynamic_smem_bytes(self) -> int:
        stage = (BM + BN) * BK * 2  # an M128 stage, the widest: A 128 x 64 and B 64 x 192
        return STAGES * stage + BM * BN * 2 + SWIZZLE_ALIGN  # ring, C staging, alignment slack


VARIANT_CONFIGS: dict[str, K5Config] = {
    "k5/host": K5Config("host", "model"),
    "k5/host-lpt": K5Config("host", "model", order="kind"),
    "k5/device": K5Config("device", "greedy"),
    "k5/device-graph": K5Config("device", "greedy", graph=True),
    "k5/m128": K5Config("host", FIXED_128),
    "k5/m64": K5Config("host", Policy(0, 64)),
    "k5/swap": K5Config("host", Policy(64, 64)),
}
CHECKED = ("k5/m128", "k5/m64", "k5/swap", "k5/host", "k5/device", "k5/device-graph")
# compute-sanitizer's set: each tile kind's code path, the cost model's mixed list, the device schedule.
SANITIZED = ("k5/m64", "k5/swap", "k5/host", "k5/device")


# --8<-- [start:tensor_maps]
def tensor_maps(a_address: int, b_address: int, c_address: int, tokens: int, experts: int, K: int,  # noqa: N803
                N: int) -> tuple[TiledMap, ...]:  # noqa: N803
    """A in 128-row boxes (M128 tiles), A again in 16-row boxes (M64 tiles take four; a SWAP tile
    only the tokens it has, rounded up to 16), B [E, K, N] and C as k3 maps them."""
    a_map, b_map = operand_maps(MAPS, a_address, b_address, tokens, experts, K, N)
    tokens_map = matrix_map("A (tokens)", a_address, rows=tokens, cols=K, box_rows=TOKEN_BOX_ROWS, box_cols=BK)
    return a_map, tokens_map, b_map, output_map(c_address, tokens, N)
# --8<-- [end:tensor_maps]


# --8<-- [start:mirror]
def swap_stage_image(tokens: np.ndarray, weights: np.ndarray, stage: int) -> tuple[np.ndarray, int]:
    """Shared memory after a SWAP tile's TMA boxes for one K step landed in ring stage ``stage``:
    ``tokens`` [TN, 64] (TN a multiple of 16) in 16-row boxes from the stage's start, ``weights`` the
    logical B tile [64, 128] (K x N) in two 64 x 64 boxes after the stage's A part. Mirrors
    kernels/k5_adaptive.cu, produce(). Returns the bytes and the stage's address."""
    stage_bytes = (BM + BN) * BK * 2
    smem = np.zeros(SWIZZLE_ALIGN + (stage + 1) * stage_bytes, dtype=np.uint8)
    base = SWIZZLE_ALIGN + stage * stage_bytes
    for box in range(tokens.shape[0] // TOKEN_BOX_ROWS):
        tma_write_box(smem, base + box * TOKEN_BOX_ROWS * BK * 2, tokens[box * TOKEN_BOX_ROWS:(box + 1) * TOKEN_BOX_ROWS], 128)
    for box in range(weights.shape[1] // 64):
        tma_write_box(smem, base + BM * BK * 2 + box * 64 * BK * 2, weights[:, box * 64:(box + 1) * 64], 128)
    return smem, base


def swap_descriptors(base: int):
    """(warpgroup, k16 step, weight-operand descriptor, token-operand descriptor) of a SWAP stage at
    ``base``. Mirrors swap_tile(): the weights, read MN-major as the wgmma's A, start at warpgroup
    w's 64-column box; the tokens, read K-major as its B, start at the stage."""
    plan_k, plan_mn = plans(MAPS)
    for warpgroup in range(2):
        weights = base + BM * BK * 2 + warpgroup * 64 * BK * 2
        for kk in range(BK // 16):
            yield warpgroup, kk, plan_mn.descriptor(weights, 0, kk), plan_k.descriptor(base, 0, kk)
# --8<-- [end:mirror]


def policy_argument(policy: Policy) -> np.void:
    return np.array([(policy.swap_max, policy.m64_max)], dtype=POLICY_DTYPE)[0]


class Graph:
    """One launch captured on the harness stream as a CUDA graph, replayed by ``launch()``."""

    def __init__(self, enqueue) -> None:
        from cuda.bindings import driver

        stream = driver.CUstream(stream_handle())
        check_driver(driver.cuStreamBeginCapture(stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        enqueue()
        self.graph = check_driver(driver.cuStreamEndCapture(stream))
        self.exec = check_driver(driver.cuGraphInstantiate(self.graph, 0))

    def launch(self) -> None:
        from cuda.bindings import driver

        check_driver(driver.cuGraphLaunch(self.exec, driver.CUstream(stream_handle())))

    def __del__(self) -> None:
        from cuda.bindings import driver

        driver.cuGraphExecDestroy(self.exec)
        driver.cuGraphDestroy(self.graph)


class K5Adaptive(NamedConfigVariant):
    """One of chapter 06's variants: ``K5Adaptive("k5/host", calibration)``."""

    kernel_function = KERNEL_FUNCTION
    source = SOURCE
    configs = VARIANT_CONFIGS
    family = "k5"
    warps_per_block = 12

    def __init__(self, name: str, calibration: Calibration | None = None) -> None:
        super().__init__(name)
        self.calibration = calibration or nominal_calibration()
        self._chosen: dict[tuple, tuple[Calibration, Policy]] = {}

    def policy_for(self, counts: np.ndarray, K: int, N: int, grid: int) -> Policy:  # noqa: N803
        choice = self.config.policy
        if isinstance(choice, Policy):
            return choice
        if choice == "greedy":
            return greedy_policy(self.calibration, N)
        # The harness prepares once per check, input set and timing round; the model's choice (seconds
        # of Python at 65,536 rows) depends only on the routing and the calibration, so it is kept.
        key = (np.asarray(counts, dtype=np.int64).tobytes(), K, N, grid)
        cached = self._chosen.get(key)
        if cached is None or cached[0] is not self.calibration:
            cached = (self.calibration, choose_policy(counts, K, N, self.calibration, grid)[0])
            self._chosen[key] = cached
        return cached[1]

    def prediction(self, counts: np.ndarray, K: int, N: int, grid: int) -> tuple[Policy, Prediction]:  # noqa: N803
        policy = self.policy_for(counts, K, N, grid)
        tiles = mixed_tile_list(counts, N, policy, self.config.order)
        return policy, predict(tiles, counts, self.calibration, grid, K, N)

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem = dev.problem
        self.require_bf16_inputs(dev)
        check_inputs(problem.K, problem.N, dev.a.ptr, dev.b.ptr)
        if self.config.schedule == "device" and problem.experts > MAX_EXPERTS:
            raise ValueError(f"{self.name}: the device schedule takes at most {MAX_EXPERTS} experts "
                             f"(its prefix sums live in shared memory), got {problem.experts}")
        gpu = require_sm90a(self.name)
        resources = self.resources(gpu.arch)
        output = dev.new_output()
        if problem.tokens == 0:  # a tensor map cannot describe 0 rows; DeviceLayer covers M_tot = 0
            return Prepared(launch=lambda: None, output=output, resources=resources)
        slots = gpu.sm_count * resources.blocks_per_sm
        policy = self.policy_for(problem.counts, problem.K, problem.N, slots)
        launch_fn, keep, info = self._launch(dev, output, policy, slots)
        info.update({"policy": policy.label, "swap_max": policy.swap_max, "m64_max": policy.m64_max,
                     "eta": mixed_eta(problem.counts, policy)})
        # bm / bn stay None: the harness's eta and tile count assume one tile shape; info has the mixed ones
        return Prepared(launch=launch_fn, output=output, resources=resources, keep_alive=keep, launch_info=info)

    def _launch(self, dev: DeviceProblem, output: DeviceArray, policy: Policy, slots: int,
                tiles_host: np.ndarray | None = None, grid: int | None = None):
        problem = dev.problem
        kernel = self.compile()
        prefer_shared_memory(kernel)
        maps = tuple(TensorMapArg(m.encode()) for m in tensor_maps(dev.a.ptr, dev.b.ptr, output.ptr, problem.tokens,
                                                                   problem.experts, problem.K, problem.N))
        plan_k, plan_mn = plans(MAPS)
        if tiles_host is None:
            tiles_host = mixed_tile_list(problem.counts, problem.N, policy, self.config.order)
        if self.config.schedule == "host":
            tiles = to_device(tiles_host if len(tiles_host) else np.zeros((1, 4), dtype=np.int32))
            tiles_ptr, count = tiles.ptr, len(tiles_host)
            grid = grid or max(1, min(len(tiles_host), slots))
        else:  # the kernel finds its tiles: no list, one block per SM slot whatever the routing
            tiles, tiles_ptr, count, grid = None, 0, 0, grid or slots
        args = (*maps, output.ptr, tiles_ptr, np.int32(count), dev.offsets.ptr, np.int32(problem.experts),
                policy_argument(policy), np.int32(problem.K), np.int32(problem.N), plan_argument(plan_k),
                plan_argument(plan_mn))
        threads, smem = self.warps_per_block * 32, self.dynamic_smem_bytes

        def run() -> None:
            launch(kernel, grid, threads, smem, *args)

        keep: list[Any] = [tiles, maps, dev, output]
        if self.config.graph:
            graph = Graph(run)
            keep.append(graph)
            run = graph.launch  # noqa: F811 - the replay replaces the launch
        info = {"grid": grid, "tiles": len(tiles_host), "schedule": self.config.schedule,
                "order": self.config.order, "tile_kinds": kind_counts(tiles_host)}
        return run, keep, info


def slots(variant: K5Adaptive) -> int:
    """Blocks a persistent k5 launch runs: one per SM (a 384-thread block takes all registers)."""
    gpu = require_sm90a(variant.name)
    return gpu.sm_count * variant.resources(gpu.arch).blocks_per_sm


def calibrate(copy_tbps: float, iterations: int = 30) -> Calibration:
    """Time every list of cost_model.calibration_routings at the seed shape (E = 64, K = 1024,
    N = 2688) and fit the per-shape costs and the overhead (cost_model.calibration_from_times)."""
    from ..cost_model import CALIBRATION_EXPERTS, calibration_from_times, calibration_routings, calibration_rows
    from ..problem import make_problem
    from ..timing import time_launches

    problem = make_problem(CALIBRATION_EXPERTS, calibration_rows(), 1024, 2688, seed=0)
    dev = DeviceProblem(problem)
    variant = K5Adaptive("k5/m128")
    grid = slots(variant)
    times, measurements = {}, []
    for name, (counts, policy) in calibration_routings().items():
        tiles = mixed_tile_list(counts, problem.N, policy)  # rows from 0: the problem has enough of them
        output = dev.new_output()
        run, keep, _ = variant._launch(dev, output, policy, grid, tiles)  # noqa: SLF001
        timing = time_launches(lambda _: run(), warmup=5, iterations=iterations)
        times[name] = timing.median_ms * 1e3
        measurements.append({"list": name, "rows_per_expert": int(counts[0]), "policy": policy.label,
                             "tiles": len(tiles), "grid": grid, "median_us": times[name],
                             "min_us": timing.min_ms * 1e3, "max_us": timing.max_ms * 1e3})
        del keep, output
    return calibration_from_times(times, copy_tbps, problem.K, problem.N, grid, measurements)


@dataclass
class DeviceLayer:
    """A device-scheduled k5 launch over fixed buffers of ``capacity`` rows, captured once in a CUDA
    graph, as an MoE layer would run it: each call writes a new routing's rows of A and its offsets
    into the buffers (the router's job on a real GPU), replays the graph and returns C's real rows.
    The graph never changes; only the offsets it reads do."""

    b: np.ndarray  # [E, K, N] bf16
    capacity: int
    calibration: Calibration | None = None
    _state: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from ..problem import BF16, Problem

        experts, K, N = self.b.shape  # noqa: N806
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1 row (a tensor map needs one), got {self.capacity}")
        counts = np.zeros(experts, dtype=np.int64)
        counts[0] = self.capacity  # the capture's routing; the graph never looks at it again
        dev = DeviceProblem(Problem(a=np.zeros((self.capacity, K), dtype=BF16), b=self.b, counts=counts))
        variant = K5Adaptive("k5/device-graph", self.calibration)
        self._state.update(dev=dev, prepared=variant.prepare(dev), experts=experts)

    def __call__(self, a: np.ndarray, counts: np.ndarray) -> np.ndarray:
        from ..device import BF16_NAN_BITS, synchronize
        from ..routing import expert_offsets

        tokens = int(np.sum(counts))
        if tokens > self.capacity or a.shape[0] != tokens:
            raise ValueError(f"the routing has {tokens} rows and A {a.shape[0]}; the layer holds {self.capacity}")
        state = self._state
        offsets = expert_offsets(np.asarray(counts, dtype=np.int64)).astype(np.int32)
        if offsets.size != state["experts"] + 1:
            raise ValueError(f"counts must have {state['experts']} entries, got {offsets.size - 1}")
        dev, prepared = state["dev"], state["prepared"]
        if tokens:
            dev.a.view(0, a.shape, a.dtype).upload(np.ascontiguousarray(a))
        dev.offsets.upload(offsets)
        prepared.output.fill_u16(BF16_NAN_BITS)
        prepared.launch()
        synchronize()
        return prepared.output.download()[:tokens]


    def replay(self) -> None:
        """Replay the graph on whatever routing the buffers hold (for timing)."""
        self._state["prepared"].launch()


VARIANTS = {name: functools.partial(K5Adaptive, name) for name in VARIANT_CONFIGS}
