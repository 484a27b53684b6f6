"""Bounded inputs on every command line: a number past its bound is one line naming the bound and exit
status 2, refused while parsing (before any work); a reader that closes the pipe early ends a run
quietly. The bounds themselves (moe_gemm.core.checks) hold the facts their comments give."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from moe_gemm.core.chapters import chapter_module
from moe_gemm.core.checks import (
    MAX_DIMENSION,
    MAX_EXPERTS,
    MAX_JOBS,
    MAX_LAYER_TOKENS,
    MAX_REPEATS,
    MAX_ROWS,
    MAX_SEED,
    MAX_SKEW,
    MAX_TILE_ROWS,
    Limit,
)
from moe_gemm.core.cli import add_problem_arguments, chapter_parser, tile_size
from moe_gemm.model.routing import expert_counts

REPO = Path(__file__).resolve().parents[1]


def _bound(limit: Limit) -> str:
    """How an error message names ``limit``: '<= 1,048,576 (why)'."""
    value = f"{limit.value:g}" if isinstance(limit.value, float) else f"{limit.value:,}"
    return f"<= {value} ({limit.why})"


def _chapter(chapter: str) -> Callable:
    return chapter_module(chapter, "run").main


def _harness(module: str, function: str = "main") -> Callable:
    return lambda argv: getattr(importlib.import_module(module), function)(argv)


# (command, its main, argv, what the one line must say)
REFUSED = [
    # the values that used to run away, end in a traceback or print nonsense
    ("06", _chapter("06"), ["--tokens", "99999999999"], "--tokens must be " + _bound(MAX_ROWS)),
    ("00", _chapter("00"), ["--experts", "10000000000"], "--experts must be " + _bound(MAX_EXPERTS)),
    ("00", _chapter("00"), ["--tokens", "99999999999999999999"], "--tokens must be " + _bound(MAX_ROWS)),
    ("00", _chapter("00"), ["--experts", "100000"], "--experts must be " + _bound(MAX_EXPERTS)),
    ("00", _chapter("00"), ["--skew", "99"], "--skew must be " + _bound(MAX_SKEW)),
    ("07", _chapter("07"), ["--skew", "99"], "unrecognized arguments: --skew 99"),
    ("08", _chapter("08"), ["--skew", "99"], "unrecognized arguments: --skew 99"),
    # one past each bound, on each command line that takes it
    ("00", _chapter("00"), ["--tokens", str(MAX_ROWS.value + 1)], "--tokens must be " + _bound(MAX_ROWS)),
    ("00", _chapter("00"), ["--experts", str(MAX_EXPERTS.value + 1)], "--experts must be " + _bound(MAX_EXPERTS)),
    ("00", _chapter("00"), ["--skew", "4.01"], "--skew must be " + _bound(MAX_SKEW)),
    ("00", _chapter("00"), ["-K", str(MAX_DIMENSION.value + 1)], "-K must be " + _bound(MAX_DIMENSION)),
    ("00", _chapter("00"), ["-N", str(MAX_DIMENSION.value + 1)], "-N must be " + _bound(MAX_DIMENSION)),
    ("00", _chapter("00"), ["--bm", "512"], "--bm must be " + _bound(MAX_TILE_ROWS)),
    ("04", _chapter("04"), ["--repeats", str(MAX_REPEATS.value + 1)], "--repeats must be " + _bound(MAX_REPEATS)),
    ("06", _chapter("06"), ["--rounds", str(MAX_REPEATS.value + 1)], "--rounds must be " + _bound(MAX_REPEATS)),
    ("06", _chapter("06"), ["--skews", "0", "99"], "--skews must be " + _bound(MAX_SKEW)),
    ("07", _chapter("07"), ["--rounds", str(MAX_REPEATS.value + 1)], "--rounds must be " + _bound(MAX_REPEATS)),
    ("07", _chapter("07"), ["--tokens", str(MAX_ROWS.value + 1)], "--tokens must be " + _bound(MAX_ROWS)),
    ("08", _chapter("08"), ["--tokens", str(MAX_LAYER_TOKENS.value + 1)],
     "--tokens must be " + _bound(MAX_LAYER_TOKENS)),
    ("08", _chapter("08"), ["--rows", str(MAX_ROWS.value + 1)], "--rows must be " + _bound(MAX_ROWS)),
    ("profile_target", _harness("moe_gemm.measure.profile_target"), ["k1/bm64", "16384", "99"],
     "skew must be " + _bound(MAX_SKEW)),
    ("profile_target", _harness("moe_gemm.measure.profile_target"), ["k1/bm64", str(MAX_ROWS.value + 1), "0"],
     "tokens must be " + _bound(MAX_ROWS)),
    ("profile_target", _harness("moe_gemm.measure.profile_target"), ["k1/bm64", "16384", "0", "--experts", "2000"],
     "--experts must be " + _bound(MAX_EXPERTS)),
    ("profile_target", _harness("moe_gemm.measure.profile_target"), ["k1/bm64", "16384", "0", "-K", "0"],
     "-K must be >= 1"),
    ("profile_target", _harness("moe_gemm.measure.profile_target"), ["k1/bm64", "16384", "0", "-N", "40000"],
     "-N must be " + _bound(MAX_DIMENSION)),
    ("profile_target", _harness("moe_gemm.measure.profile_target"), ["k1/bm64", "16384", "0", "--warmup", "101"],
     "--warmup must be " + _bound(MAX_REPEATS)),
    ("sanitize_target", _harness("moe_gemm.measure.sanitize_target"), ["k1", "--seed", "-1"], "--seed must be >= 0"),
    ("sanitize_target", _harness("moe_gemm.measure.sanitize_target"), ["k1", "--seed", str(MAX_SEED.value + 1)],
     "--seed must be " + _bound(MAX_SEED)),
    ("validation", _harness("moe_gemm.measure.validation"), ["run", "--jobs", str(MAX_JOBS.value + 1)],
     "--jobs must be " + _bound(MAX_JOBS)),
    ("ceilings", _harness("moe_gemm.measure.ceilings"), ["--jobs", "4"], "unrecognized arguments: --jobs 4"),
    ("k0 simulator", _harness("moe_gemm.variants.k0.simulator", "_simulator_main"), ["--counts", "1", "-2"],
     "--counts must be >= 0"),
    ("k0 simulator", _harness("moe_gemm.variants.k0.simulator", "_simulator_main"),
     ["--counts", str(MAX_ROWS.value), "1"], "the rows' sum M_tot must be " + _bound(MAX_ROWS)),
    ("k0 simulator", _harness("moe_gemm.variants.k0.simulator", "_simulator_main"), ["--seed", "-3"],
     "--seed must be >= 0"),
]


@pytest.mark.parametrize(("command", "main", "argv", "message"), REFUSED,
                         ids=[f"{c[0]} {' '.join(c[2])}"[:60] for c in REFUSED])
def test_a_value_past_its_bound_is_one_line_and_exit_2(monkeypatch, capsys, command, main, argv, message) -> None:
    if command.isdigit():  # a chapter: refused while parsing, so chapter_main (the GPU, any work) never runs
        monkeypatch.setattr(chapter_module(command, "run"), "chapter_main",
                            lambda *a, **k: pytest.fail("the chapter ran: the bound was not checked while parsing"))
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"{err.split(': error: ')[0]}: error: ") and err.endswith(" (see --help)\n"), err
    assert message in err, err


def test_the_bounds_themselves_are_accepted() -> None:
    """Every bound is inclusive: the largest value parses, and the problem parser keeps it exactly."""
    parser = chapter_parser("test parser")
    add_problem_arguments(parser, chapter_module("00", "run").SEED)
    parser.add_argument("--bm", type=tile_size("--bm"))
    args = parser.parse_args(["--tokens", str(MAX_ROWS.value), "--experts", str(MAX_EXPERTS.value),
                              "--skew", "4", "-K", str(MAX_DIMENSION.value), "-N", str(MAX_DIMENSION.value),
                              "--bm", str(MAX_TILE_ROWS.value)])
    assert (args.tokens, args.experts, args.skew, args.K, args.N, args.bm) == (
        2**20, 1024, 4.0, 32768, 32768, 256)


def test_chapter_00_runs_at_its_bounds(capsys) -> None:
    """The largest problem chapter 00 takes is still arithmetic of a second or two, not a runaway."""
    argv = ["--tokens", str(MAX_ROWS.value), "--experts", str(MAX_EXPERTS.value), "--skew", "4"]
    assert _chapter("00")(argv) == 0
    assert capsys.readouterr().out.startswith("problem: E = 1,024 experts, M_tot = 1,048,576 rows")


# ---- the model refuses the same sizes --------------------------------------------------------------

@pytest.mark.parametrize(
    ("experts", "tokens", "message"),
    [(MAX_EXPERTS.value + 1, 16, "experts must be " + _bound(MAX_EXPERTS)),
     (10**10, 16, "experts must be <= 1,024"),
     (4, MAX_ROWS.value + 1, "tokens must be " + _bound(MAX_ROWS)),
     (4, 10**20, "tokens must be <= 1,048,576"),
     (4, -(10**20), "tokens must be >= 0")],
)
def test_expert_counts_refuses_absurd_sizes(experts: int, tokens: int, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        expert_counts(experts, tokens, 0.0)


def test_expert_counts_at_the_bounds_sums_exactly() -> None:
    counts = expert_counts(MAX_EXPERTS.value, MAX_ROWS.value, 1.2)
    assert counts.shape == (1024,) and int(counts.sum()) == 2**20 and (counts >= 0).all()


# ---- the bounds hold the facts their comments give ------------------------------------------------

def test_the_row_bound_is_16x_the_largest_measured_m_tot() -> None:
    from moe_gemm.model.workloads import GRID_TOKENS, SEED_FIVE, SEED_N

    assert MAX_ROWS.value == 16 * max(*GRID_TOKENS, *(w.tokens for w in SEED_FIVE)) == 2**20
    reference_bytes = MAX_ROWS.value * SEED_N * np.dtype(np.float32).itemsize
    assert round(reference_bytes / 1e9) == 11  # "the numpy reference's C is 11 GB there"


def test_a_layers_tokens_stay_within_the_row_bound() -> None:
    from moe_gemm.model.workloads import LAYERS

    top_k = max(shape.top_k for shape in LAYERS.values())
    assert top_k == 8 and MAX_LAYER_TOKENS.value * top_k == MAX_ROWS.value
    assert MAX_LAYER_TOKENS.value >= max(chapter_module("08", "run").TOKENS)


def test_the_expert_bound_is_the_first_e_no_grouped_gemm_here_runs() -> None:
    from moe_gemm.model.workloads import LAYERS
    from moe_gemm.variants.k6.config import MAX_EXPERTS as WALK_MAX_EXPERTS
    from moe_gemm.variants.peer.torch import GROUPED_MM_MAX_GROUPS

    assert MAX_EXPERTS.value == GROUPED_MM_MAX_GROUPS + 1
    assert WALK_MAX_EXPERTS == max(shape.experts for shape in LAYERS.values()) == 256 < MAX_EXPERTS.value


def test_at_the_skew_bound_the_heaviest_expert_holds_92_percent() -> None:
    from moe_gemm.model.workloads import GRID_SKEWS

    for experts in (2, 64, MAX_EXPERTS.value):
        counts = expert_counts(experts, MAX_ROWS.value, MAX_SKEW.value)
        assert counts[0] / MAX_ROWS.value >= 0.92, experts
    assert max(GRID_SKEWS) < MAX_SKEW.value


def test_the_dimension_bound_is_above_every_layers_projection() -> None:
    from moe_gemm.model.workloads import LAYERS

    widest = max(max(2 * s.intermediate, s.hidden) for s in LAYERS.values())
    assert widest == 28672 < MAX_DIMENSION.value


# ---- every command line is bounded and ends through run_main --------------------------------------

SOURCES = sorted([*REPO.glob("chapters/*/*.py"), *(REPO / "python" / "moe_gemm").rglob("*.py")])


def _main_block(tree: ast.Module) -> ast.If | None:
    """The module's ``if __name__ == "__main__":`` block, if it runs as a program."""
    return next((node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)),
                None)


def test_no_command_line_takes_an_unbounded_number() -> None:
    """type=int or type=float would take any number: every numeric flag goes through a bounded type."""
    parsers = [path for path in SOURCES if "add_argument(" in path.read_text()]
    assert len(parsers) >= 10  # 8 chapters' run.py, the harness's command lines, the figures' --out
    for path in parsers:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                for keyword in node.keywords:
                    if keyword.arg == "type":
                        assert not (isinstance(keyword.value, ast.Name) and keyword.value.id in ("int", "float")), (
                            f"{path.relative_to(REPO)}:{node.lineno}: an unbounded type={keyword.value.id}")


def test_every_program_ends_through_run_main() -> None:
    """run_main is where a ValueError becomes one line and a closed pipe a quiet exit 0."""
    programs = {path: block for path in SOURCES if (block := _main_block(ast.parse(path.read_text()))) is not None}
    assert len(programs) >= 23  # 9 run.py, 9 figures.py and the harness's own command lines
    for path, block in programs.items():
        assert re.fullmatch(r"run_main\(\w+\)", ast.unparse(block.body[-1]).strip()), (
            f"{path.relative_to(REPO)}: {ast.unparse(block)}")


# ---- a reader that stops early ---------------------------------------------------------------------

def test_a_closed_pipe_ends_the_run_quietly() -> None:
    """stdout a pipe whose reader has already gone, and buffered: chapter 00's whole output meets the
    closed pipe when run_main flushes it (every write fails with EPIPE, so this never races)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        proc = subprocess.run([sys.executable, str(REPO / "chapters/00/run.py")], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=120, check=False)
    finally:
        os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("chapter", "first"), [("00", "problem: E = 64 experts"),
                                                ("03", "k2 is not run here because")])
def test_piped_into_head_prints_one_line_and_exits_0(chapter: str, first: str) -> None:
    """Unbuffered, each print is a write: chapter 03's no-GPU path prints its first line, then compiles
    for seconds while head takes that line and exits, so its next print meets the closed pipe."""
    command = f"set -o pipefail; {sys.executable} chapters/{chapter}/run.py | head -1"
    proc = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith(first) and proc.stdout.count("\n") == 1
