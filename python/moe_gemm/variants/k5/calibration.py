"""Calibrating chapter 06's cost model on the GPU: every remainder shape timed in context.
"""

from __future__ import annotations

from moe_gemm.cuda.device import DeviceProblem
from moe_gemm.model.workloads import SEED_K, SEED_N
from moe_gemm.variants.k5 import K5Adaptive, slots
from moe_gemm.variants.k5.cost_model import Calibration
from moe_gemm.variants.k5.mixed_tiles import mixed_tile_list


def calibrate(copy_tbps: float, iterations: int = 30) -> Calibration:
    """Time every list of cost_model.calibration_routings at the seed shape (E = 64, K = 1024,
    N = 2688) and fit the per-shape costs and the overhead (cost_model.calibration_from_times)."""
    from moe_gemm.cuda.timing import time_launches
    from moe_gemm.model.problem import make_problem
    from moe_gemm.variants.k5.cost_model import (
        CALIBRATION_EXPERTS,
        calibration_from_times,
        calibration_routings,
        calibration_rows,
    )

    problem = make_problem(CALIBRATION_EXPERTS, calibration_rows(), SEED_K, SEED_N, seed=0)
    dev = DeviceProblem(problem)
    variant = K5Adaptive("k5/m128")
    grid = slots(variant)
    times, measurements = {}, []
    for name, (counts, policy) in calibration_routings().items():
        tiles = mixed_tile_list(counts, problem.N, policy)  # rows from 0: the problem has enough of them
        output = dev.new_output()
        run, keep, _ = variant._launch(dev, output, policy, grid, tiles)
        timing = time_launches(lambda _: run(), warmup=5, iterations=iterations)
        times[name] = timing.median_ms * 1e3
        measurements.append({"list": name, "rows_per_expert": int(counts[0]), "policy": policy.label,
                             "tiles": len(tiles), "grid": grid, "median_us": times[name],
                             "min_us": timing.min_ms * 1e3, "max_us": timing.max_ms * 1e3})
        del keep, output
    return calibration_from_times(times, copy_tbps, problem.K, problem.N, grid, measurements)
