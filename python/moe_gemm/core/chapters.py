"""The chapters, declared once: each one's number, its page, its kernel family and what its run needs.

Everything that lists chapters or kernel families reads :data:`CHAPTERS`: the GPU validation record
(moe_gemm.measure.validation), compute-sanitizer's tests, the home page's progression, the roofline
test, tools/gpu_session.sh's default stages. What cannot read Python (mkdocs.yml's nav, the pages in
site_docs/, the chapters/ folders, README.md's chapter table) is held to it by tests/test_chapters.py.

    python -m moe_gemm.core.chapters --default-gpu-stages    # 01 02 03 04 06: tools/gpu_session.sh's

A chapter's folder is numbered, not a package, so its figures.py (or a test) reaches its run.py
through :func:`chapter_module`.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from moe_gemm.core.cli import run_main
from moe_gemm.core.paths import CHAPTERS_DIR

ANY_CAPABILITY = (0, 0)  # k0: numba-cuda compiles it for whatever GPU is here
RECORDED_CAPABILITY = (9, 0)  # the H200 (sm_90a) every recorded number comes from


@dataclass(frozen=True)
class Chapter:
    """One chapter: ``chapters/<number>/``, its page ``site_docs/<page>`` under ``title`` in the nav."""

    number: str
    title: str
    page: str
    # The kernel family it introduces: a package moe_gemm/variants/<family> (k0 .. k8), or "torch"
    # (chapter 08: the torch op, which runs k6, and the layer's combine kernel, in moe_gemm/torch/).
    family: str | None
    # The least compute capability its kernels run on; None: the chapter needs no GPU.
    capability: tuple[int, int] | None
    # The GPU tests whose passing run puts the family in kernels/validated.json; none where no GPU
    # that runs the family is available (k4 needs a Blackwell GPU).
    gpu_tests: tuple[str, ...] = ()
    sanitized: bool = False  # compute-sanitizer runs on its variants (tests/test_sanitizer_gpu.py): CUDA C++
    in_parts: bool = False  # run.py measures in parts (--parts), each minutes long, merged into one file
    # Kernel steps whose bars on the home page's progression come from this chapter's recorded run:
    # chapter 03 times k0, k1 and k2 on the same inputs, beside the same peer.
    progression: tuple[str, ...] = ()
    # False while the family's kernels have not yet passed their GPU tests: they are compiled and inspected on
    # any machine, but nothing of them is in kernels/validated.json and the chapter has no results file (its
    # page says so). Set it True, then run `python -m moe_gemm.measure.validation run <family>` on the GPU.
    passed_on_gpu: bool = True

    @property
    def runs_on_the_recorded_gpu(self) -> bool:
        return self.capability is not None and self.capability <= RECORDED_CAPABILITY

    @property
    def default_gpu_stage(self) -> bool:
        """tools/gpu_session.sh runs it with no stage named: it runs on the H200, in one process."""
        return self.runs_on_the_recorded_gpu and not self.in_parts


CHAPTERS = (
    Chapter("00", "00 · The problem", "00-problem.md", None, None),
    Chapter("01", "01 · FP32 baseline (k0)", "01-fp32-baseline.md", "k0", ANY_CAPABILITY,
            gpu_tests=("tests/test_k0_gpu.py",)),
    Chapter("02", "02 · mma.sync (k1)", "02-mma-sync.md", "k1", (8, 0),
            gpu_tests=("tests/test_k1_gpu.py",), sanitized=True),
    Chapter("03", "03 · TMA + warp specialization (k2)", "03-tma-warp-specialization.md", "k2", (9, 0),
            gpu_tests=("tests/test_k2_gpu.py",), sanitized=True, progression=("k0", "k1", "k2")),
    Chapter("04", "04 · Hopper wgmma (k3)", "04-wgmma.md", "k3", (9, 0),
            gpu_tests=("tests/test_k3_gpu.py",), sanitized=True, progression=("k3",)),
    Chapter("05", "05 · tcgen05 + tensor memory (k4)", "05-tcgen05.md", "k4", (10, 0)),
    Chapter("06", "06 · Adaptive tiles + device scheduling (k5)", "06-adaptive.md", "k5", (9, 0),
            gpu_tests=("tests/test_k5_gpu.py",), sanitized=True, progression=("k5",)),
    Chapter("07", "07 · The last mile (k6)", "07-last-mile.md", "k6", (9, 0),
            gpu_tests=("tests/test_k6_gpu.py",), sanitized=True, in_parts=True),
    Chapter("08", "08 · In a model: op, layer, scoreboard", "08-in-a-model.md", "torch", (9, 0),
            gpu_tests=("tests/test_torch_op_gpu.py", "tests/test_layer_gpu.py", "tests/test_dswiglu_gpu.py",
                       "tests/test_swiglu_backward_gpu.py"),
            in_parts=True),
    Chapter("09", "09 · Training: the weight gradient (k7)", "09-training.md", "k7", (9, 0),
            gpu_tests=("tests/test_k7_gpu.py", "tests/test_weight_grad_gpu.py"), sanitized=True, in_parts=True),
    # k8's family also holds the FP8 quantizers (moe_gemm.torch.quantize), validated by their own GPU tests.
    Chapter("10", "10 · FP8 e4m3 (k8)", "10-fp8.md", "k8", (9, 0),
            gpu_tests=("tests/test_k8_gpu.py", "tests/test_quantize_gpu.py", "tests/test_scaled_gpu.py",
                       "tests/test_k8_swiglu_gpu.py"),
            sanitized=True, in_parts=True),
)


# Pages of the site that are not chapters, after the chapters in its nav: (nav title, page).
REFERENCE_PAGES = (("The API: grouped_mm, MoELayer", "api.md"),)

def measured_chapters() -> tuple[Chapter, ...]:
    """The chapters whose kernels run on the recorded GPU and have passed there: each has a results file from it."""
    return tuple(c for c in CHAPTERS if c.runs_on_the_recorded_gpu and c.passed_on_gpu)


def chapter_module(chapter: str, name: str = "run") -> ModuleType:
    """``chapters/<chapter>/<name>.py`` as a module, loaded afresh: chapter folders are numbered, not
    packages, so a chapter's figures.py (or a test) reaches its run.py this way."""
    spec = importlib.util.spec_from_file_location(f"chapter{chapter}_{name}",
                                                  CHAPTERS_DIR / chapter / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_gemm.core.chapters", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--default-gpu-stages", action="store_true", required=True,
                        help="print the chapters tools/gpu_session.sh runs when no stage is named")
    parser.parse_args(argv)
    print(" ".join(c.number for c in CHAPTERS if c.default_gpu_stage))
    return 0


if __name__ == "__main__":
    run_main(main)
