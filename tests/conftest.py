"""Tests marked ``gpu`` run only where an NVIDIA GPU is present; elsewhere they skip cleanly. Under
``MOE_GEMM_ADMIT=only`` (``validation run --admit``'s second pass) only the tests of the kernels not yet run on a
GPU are collected."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("MOE_GEMM_ADMIT") == "only":  # `validation run --admit`'s second pass: the kernels not yet run
        from moe_gemm.measure.validation import keep_for_admission

        deselected = [item for item in items if not keep_for_admission(item.nodeid)]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if keep_for_admission(item.nodeid)]
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
