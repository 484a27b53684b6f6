"""The run loop every chapter uses: check each variant against the reference, then time it.

:func:`run_checks` runs every variant on the edge cases (exact, on integer-valued inputs) and on
two random problems; :func:`run_variants` checks and times every variant on every workload, the
peers beside the kernels on the same uploaded inputs, and returns results records.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from moe_gemm.cuda.device import DeviceProblem
from moe_gemm.cuda.variant import Variant
from moe_gemm.measure.check import input_sets, measure, progress, verify
from moe_gemm.model.edge_cases import edge_cases
from moe_gemm.model.problem import BF16_OPERANDS, OperandFormat, Problem, RaggedAxis, make_problem
from moe_gemm.model.workloads import SEED_EXPERTS, SEED_K, SEED_N, Workload


def check_cases(seed: int, ragged: RaggedAxis = "M",
                fmt: OperandFormat = BF16_OPERANDS) -> list[tuple[str, Problem, bool]]:
    """(name, problem, exact): every edge case on integer-valued inputs, then two random problems; the
    forward's (ragged M, in operand format ``fmt``) or the weight gradient's (ragged K)."""
    cases = [(case.name, case.exact_problem(seed=seed), True) for case in edge_cases(ragged, fmt)]
    prefix = ("random" if ragged == "M" else "dB: random") + ("" if fmt == BF16_OPERANDS else f" {fmt}")
    cases += [(f"{prefix}, 1,000 rows s=1.2, E=8, K=1024, N=384",
               make_problem(8, 1000, 1024, 384, 1.2, seed=seed, ragged=ragged, fmt=fmt), False),
              (f"{prefix}, 2,048 rows s=0, seed shape",
               make_problem(SEED_EXPERTS, 2048, SEED_K, SEED_N, 0.0, seed=seed, ragged=ragged, fmt=fmt), False)]
    return cases


def run_checks(variants: Sequence[Variant], seed: int = 0, ragged: RaggedAxis = "M",
               fmt: OperandFormat = BF16_OPERANDS) -> list[dict[str, Any]]:
    """Every variant on every :func:`check_cases` problem (of the ``ragged`` kind, in format ``fmt``): exact bit
    for bit, or within the tolerance.

    Each case is uploaded once and every variant runs on the same device buffers (the seed-shape
    case alone is 352 MB of B); the results come back grouped by variant."""
    results = []
    for name, problem, exact in check_cases(seed, ragged, fmt):
        progress(f"[checks] {name}")
        dev = DeviceProblem(problem)
        for variant in variants:
            check = verify(variant, dev, exact=exact)
            results.append({"variant": variant.name, "case": name, "exact": exact, "passed": check.passed,
                            "rel_error": check.rel_error, "mismatches": check.mismatches,
                            "nonfinite": check.nonfinite, "result": check.describe()})
        del dev
    order = {variant.name: i for i, variant in enumerate(variants)}
    return sorted(results, key=lambda r: order[r["variant"]])  # stable: cases keep their order


def failed_variants(checks: Sequence[dict[str, Any]]) -> list[str]:
    """The variants with a failed check among :func:`run_checks`' results, sorted."""
    return sorted({c["variant"] for c in checks if not c["passed"]})


def run_variants(variants: Sequence[Variant], workloads: Sequence[Workload], rounds: int = 1,
                 **timing: int) -> list[dict[str, Any]]:
    """Check and time every variant on every workload; a variant that cannot take a workload is skipped.

    Each workload's inputs are drawn fresh and uploaded once, and every variant (peers
    included) runs on those same buffers, so the ratios in the table compare like with like.

    With ``rounds`` > 1 the timing is repeated in interleaved rounds (A B C, A B C, ...), each
    variant prepared afresh every round (new output and list allocations), and a record keeps the
    median of its rounds' medians and every round's median (``round_medians_ms``): a slow spell of
    the GPU, or an unlucky allocation, then shows as spread instead of as a ratio.
    """
    records = []
    for workload in workloads:
        progress(f"[{workload.label}] drawing and uploading inputs")
        sets = input_sets(workload.problem)
        checks: dict[str, Any] = {}
        rounds_of: dict[str, list[dict[str, Any]]] = {}
        for round_ in range(rounds):
            for variant in variants:
                if round_ == 0:
                    progress(f"[{workload.label}] {variant.name}: check, then time")
                    try:
                        check = verify(variant, sets[0])
                    except ValueError as unsupported:  # raised before any launch: the variant cannot take this input
                        progress(f"[{workload.label}] {variant.name}: skipped ({unsupported})")
                        continue
                    if not check.passed and variant.name.startswith("peer/"):
                        # a peer's wrong answer is reported and left untimed; ours stops the run (measure raises)
                        progress(f"[{workload.label}] {variant.name}: WRONG ANSWER, not timed ({check.describe()})")
                        continue
                    checks[variant.name] = check
                if variant.name in checks:
                    rounds_of.setdefault(variant.name, []).append(
                        measure(variant, sets, check=checks[variant.name], **timing))
        records += [measured[0] if rounds == 1 else _merge_rounds(measured) for measured in rounds_of.values()]
        del sets
    return records


def _merge_rounds(measured: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One record from a variant's records of several rounds: the median of their medians."""
    medians = [r["median_ms"] for r in measured]
    record = dict(measured[0])
    record.update(median_ms=statistics.median(medians), min_ms=min(r["min_ms"] for r in measured),
                  max_ms=max(r["max_ms"] for r in measured), round_medians_ms=medians, rounds=len(medians))
    scale = measured[0]["median_ms"] / record["median_ms"]
    record["useful_tflops"] = measured[0]["useful_tflops"] * scale
    if "scheduled_tflops" in record:
        record["scheduled_tflops"] = measured[0]["scheduled_tflops"] * scale
    return record
