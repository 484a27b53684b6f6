"""The cost model without a GPU: wave quantization and first reads from DRAM as the kernel walks
its list, the memory floor, the calibration fit recovering the costs it was given, and the two
policy choices (per routing, and the routing-independent rule of the device schedule)."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.model.routing import expert_counts
from moe_gemm.variants.k5.cost_model import (
    COST_KEYS,
    Calibration,
    Prediction,
    calibration_from_times,
    calibration_routings,
    calibration_rows,
    choose_policy,
    compulsory_bytes,
    greedy_policy,
    makespan,
    nominal_calibration,
    predict,
    tile_times,
)
from moe_gemm.variants.k5.mixed_tiles import FIXED_128, Policy, mixed_tile_list

COSTS = {"M128": 8.0, "M64": 9.0, "SWAP16": 3.0, "SWAP32": 4.0, "SWAP48": 5.0, "SWAP64": 6.5}


def calibration(costs=COSTS, overhead=10.0, copy_tbps=4.0) -> Calibration:
    return Calibration(dict(costs), overhead, copy_tbps)


def test_makespan_is_the_busiest_block_with_tile_i_on_block_i_mod_grid():
    assert makespan(np.array([1.0, 2.0, 3.0]), grid=2) == 4.0  # block 0: tiles 0 and 2
    assert makespan(np.array([1.0, 2.0, 3.0]), grid=3) == 3.0
    assert makespan(np.array([]), grid=4) == 0.0


def test_a_tile_waits_for_dram_only_where_it_first_reads_weights():
    cal = calibration(copy_tbps=0.01)  # 10 GB/s over 2 blocks: 5 KB per microsecond per block
    tiles = mixed_tile_list(np.array([256]), 192, FIXED_128)  # two M128 tiles on the same 192 columns
    times = tile_times(tiles, cal, grid=2, K=1024)
    dram = 3 * 64 * 1024 * 2 / 5e3  # three fresh 64-column boxes of K = 1024
    assert times[0] == pytest.approx(max(COSTS["M128"], dram)) and times[0] > COSTS["M128"]
    assert times[1] == COSTS["M128"]  # the same boxes: in L2 by now
    assert tile_times(tiles, cal, grid=2, K=512)[1] == COSTS["M128"] / 2  # costs scale with K


def test_the_memory_floor_bounds_every_prediction():
    assert Prediction(compute_us=10.0, memory_us=50.0, overhead_us=5.0).total_us == 50.0
    assert Prediction(compute_us=100.0, memory_us=50.0, overhead_us=5.0).bound == "compute"
    counts = np.array([8] * 64)  # every tile reads its weights first: the DRAM share bounds each one
    prediction = predict(mixed_tile_list(counts, 2688, FIXED_128), counts, calibration(), 132, 1024, 2688)
    assert prediction.compute_us >= prediction.memory_us * 0.9
    assert compulsory_bytes(np.array([0, 5]), 64, 32) == 2 * (5 * (64 + 32) + 64 * 32)  # empty experts' B: not read


def test_the_calibration_fit_recovers_the_costs_that_made_the_times():
    truth = calibration(overhead=12.0, copy_tbps=4.2)
    times = {}
    for name, (counts, policy) in calibration_routings().items():
        tiles = mixed_tile_list(counts, 2688, policy)
        times[name] = 12.0 + makespan(tile_times(tiles, truth, 132, 1024), 132)
    fitted = calibration_from_times(times, 4.2, 1024, 2688, 132, measurements=[])
    assert fitted.overhead_us == pytest.approx(12.0, abs=1e-6)
    for key in COST_KEYS:
        assert fitted.tile_us[key] == pytest.approx(COSTS[key], abs=1e-6), key
    assert calibration_rows() == 64 * 512  # the longest list: four full tiles per expert


def test_a_cheap_swap_tile_is_chosen_for_tiny_remainders_and_an_expensive_one_is_not():
    counts = np.array([256 + 9] * 64)  # every expert: two full tiles and a 9-row remainder
    cheap = calibration({**COSTS, "SWAP16": 0.5})
    dear = calibration({**COSTS, "SWAP16": 20.0, "SWAP32": 20.0, "SWAP48": 20.0, "SWAP64": 20.0, "M64": 20.0})
    assert choose_policy(counts, 1024, 2688, cheap, 132)[0].swap_max >= 16
    assert choose_policy(counts, 1024, 2688, dear, 132)[0] == FIXED_128


def test_the_greedy_rule_follows_the_cost_per_remainder():
    # per remainder: M128 8 x 14 = 112; SWAP16 3 x 21 = 63, SWAP32 84, SWAP48 105, SWAP64 136.5; M64 126
    assert greedy_policy(calibration(), 2688) == Policy(48, 48)
    assert greedy_policy(calibration({**COSTS, "M64": 5.0}), 2688) == Policy(16, 64)  # M64: 70
    assert greedy_policy(calibration({**COSTS, "SWAP16": 9.0}), 2688) == FIXED_128


def test_calibrations_round_trip_and_the_nominal_one_is_complete():
    cal = calibration()
    assert Calibration.from_record(cal.as_record()) == cal
    assert set(nominal_calibration().tile_us) == set(COST_KEYS)
    with pytest.raises(KeyError):
        calibration({"M128": 1.0}).cost(2, 16, 1024)  # no SWAP16 entry


def test_predictions_at_the_seed_shape_are_ordered_by_work():
    cal = nominal_calibration()
    small, big = (predict(mixed_tile_list(c, 2688, FIXED_128), c, cal, 132, 1024, 2688).total_us
                  for c in (expert_counts(64, 4096, 0.0), expert_counts(64, 65536, 0.0)))
    assert big > 3 * small
