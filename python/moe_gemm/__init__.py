"""moe_gemm: the shared harness of the ragged-M grouped GEMM tutorial.

Every chapter imports what it needs from here: routing and problems, the flat tile list and
eta, the occupancy and issue model, the numpy reference, results files with provenance,
GPU detection and the figure style. GPU-side modules (build, device, timing, peers) import
cuda-python lazily, so everything else works on machines with no GPU.
"""

from .problem import BF16, Problem, make_problem, problem_from_counts, useful_flops
from .reference import REL_TOLERANCE, Check, check_output, reference_gemm, relative_error
from .routing import expert_counts, expert_offsets, routing_summary
from .tiles import eta, eta_estimate, scheduled_flops, tile_count, tile_list

SEED = {"experts": 64, "tokens": 16384, "K": 1024, "N": 2688}

__all__ = [
    "BF16", "SEED", "REL_TOLERANCE", "Check", "Problem", "check_output", "eta", "eta_estimate",
    "expert_counts", "expert_offsets", "make_problem", "problem_from_counts", "reference_gemm",
    "relative_error", "routing_summary", "scheduled_flops", "tile_count", "tile_list", "useful_flops",
]
