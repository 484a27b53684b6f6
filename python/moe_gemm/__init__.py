"""moe_gemm: the shared harness of the ragged-M grouped GEMM tutorial.

The harness is in layers, each importing only from the ones below it:

    core/      repository paths, argument checks, text tables, command-line plumbing
    model/     the problem on paper: routing, problems, tiles and eta, the numpy reference, edge
               cases, the occupancy and issue model, the roofline, the workloads (the seed's once)
    cuda/      the GPU plumbing: device buffers, NVRTC build and cache, ptxas and SASS reports,
               launch, TMA tensor maps, shared-memory descriptors, timing, the Variant protocol
    variants/  one package per kernel step (k0 ... k5) and the peers, each with its own helpers
    measure/   checking and timing variants, the run loop, ceilings, results files and provenance,
               profiler and sanitizer targets, the record of kernels validated on the GPU
    site/      what readers see: result tables, the docs pages' macros, figure style, reports
    chapter    the one module a chapter's run.py and figures.py import

This package's face re-exports the model (no GPU needed). GPU-side modules import cuda-python
lazily, so everything else works on machines with no GPU.
"""

from moe_gemm.model.problem import BF16, Problem, make_problem, problem_from_counts, useful_flops
from moe_gemm.model.reference import REL_TOLERANCES, Check, check_output, reference_gemm, relative_error
from moe_gemm.model.routing import expert_counts, expert_offsets, routing_summary
from moe_gemm.model.tiles import eta, eta_estimate, scheduled_flops, tile_count, tile_list
from moe_gemm.model.workloads import SEED, Workload

__all__ = [
    "BF16", "SEED", "REL_TOLERANCES", "Check", "Problem", "check_output", "eta", "eta_estimate",
    "expert_counts", "expert_offsets", "make_problem", "problem_from_counts", "reference_gemm",
    "relative_error", "routing_summary", "scheduled_flops", "tile_count", "tile_list", "useful_flops",
    "Workload",
]
