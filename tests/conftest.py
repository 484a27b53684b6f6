"""Tests marked ``gpu`` run only where an NVIDIA GPU is present; elsewhere they skip cleanly. Under
``MOE_GEMM_ADMIT=only`` (``validation run --admit``'s second pass) only the tests of the kernels not yet run on a
GPU are collected."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("MOE_GEMM_ADMIT") == "only":  # `validation run --admit`'s second pass: the kernels not yet run
        from moe_gemm.measure.validation import keep_for_admission

        kept = {item.nodeid for item in items if keep_for_admission(item.nodeid)}
        deselected = [item for item in items if item.nodeid not in kept]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if item.nodeid in kept]
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    from moe_gemm.cuda.gpu import detect_gpu  # asks the driver only when some test needs the answer

    if detect_gpu() is not None:
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def sm90a():
    """The GPU, where it runs sm_90a code (k3 and k5: wgmma and setmaxnreg exist only in that target,
    whose code runs on no other architecture); the test is skipped anywhere else."""
    from moe_gemm.cuda.gpu import detect_gpu

    gpu = detect_gpu()
    if gpu is None or gpu.compute_capability != (9, 0):
        pytest.skip("needs an sm_90a GPU (compute capability 9.0)")
    return gpu


@pytest.fixture(scope="module")
def cuda():
    """torch's CUDA device, where it is an sm_90a GPU (the torch op's and the layer's GPU tests); the test
    is skipped anywhere else."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90a GPU")
    return torch.device("cuda")


# Expert ends a graph captured on other ends is replayed with (900 rows, 4 experts): an empty first expert and a
# one-row one, every row in the last expert, ends on both sides of 64- and 128-row tiles.
REROUTINGS = ((0, 500, 501, 900), (900, 900, 900, 900), (64, 128, 700, 900))


@pytest.fixture
def graph_replays():
    """``graph_replays(call, offs)``: ``call()`` once eagerly, then captured in one CUDA graph, which is replayed
    with each of REROUTINGS written into ``offs``; yields (ends, what the captured call returned) after each
    replay has finished. The device walk must read the new ends on every replay."""
    import torch

    def replays(call, offs):
        call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        for ends in REROUTINGS:
            offs.copy_(torch.tensor(ends, dtype=torch.int32))
            graph.replay()
            torch.cuda.synchronize()
            yield ends, out

    return replays


@pytest.fixture
def sanitize():
    """``sanitize(script, kernels, printed, tool="memcheck", env=None)``: the Python ``script`` run under
    compute-sanitizer's ``tool``, checking only the kernels whose names start with ``kernels`` (not torch's) and not
    reporting driver API errors; it asserts that the script exited 0 having printed ``printed`` (it ran to its end)
    and that the tool found nothing, and returns the output. A failure's message is each finding's first line and
    the summary (:func:`sanitizer_findings`). Skips the test where compute-sanitizer is not found."""
    import subprocess
    import sys

    from moe_gemm.measure.sanitize_target import find_compute_sanitizer

    found = find_compute_sanitizer()
    if found is None:
        pytest.skip("compute-sanitizer not found")

    def run(script: str, kernels: str, printed: str, tool: str = "memcheck", env: dict | None = None) -> str:
        proc = subprocess.run([found, "--tool", tool, "--report-api-errors", "no", "--kernel-name", f"kns={kernels}",
                               sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
        output = proc.stdout + proc.stderr
        clean = ("ERROR SUMMARY: 0 errors", "RACECHECK SUMMARY: 0 hazards") if tool == "racecheck" else (
            "ERROR SUMMARY: 0 errors",)
        assert proc.returncode == 0 and printed in output, sanitizer_findings(output)
        assert any(summary in output for summary in clean), sanitizer_findings(output)
        return output

    return run


def sanitizer_findings(output: str) -> str:
    """compute-sanitizer's error headlines (each finding's first line) and its summary, in one short
    message: a long report's tail alone hides the first finding, the one that matters."""
    heads = [line for line in output.splitlines() if "Invalid" in line or "Program hit" in line or "SUMMARY" in line]
    return "\n".join(dict.fromkeys(heads)) or output[-3000:]


# k6/auto's candidates that joined it after the recorded ladders ran (the raster-walked pair for the model
# projections, and quack's tile and the M pair in quack's order): tests that read the recorded ladder's
# candidate timings take the rest.
LATER_CANDIDATES = frozenset({"k6/coop256-cluster-bn192-g8", "k6/pingpong-mcluster-bn192-g8",
                              "k6/coop256-cluster-bn192-n8", "k6/pingpong-mcluster-bn192-n8"})


@pytest.fixture
def ladder_candidates() -> tuple[str, ...]:
    """k6/auto's candidates that the recorded ladders timed."""
    from moe_gemm.variants.k6.config import AUTO_CANDIDATES

    return tuple(name for name in AUTO_CANDIDATES if name not in LATER_CANDIDATES)
