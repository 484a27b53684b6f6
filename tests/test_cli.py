"""Command-line types: a bad value is a one-line argparse error naming the flag, exit status 2."""

from __future__ import annotations

import pytest

from moe_gemm.core.cli import add_problem_arguments, chapter_parser, ignored_flags, named_rows, run_main, tile_size
from moe_gemm.model.workloads import SEED


def _parser():
    parser = chapter_parser("test parser")
    add_problem_arguments(parser, SEED)
    parser.add_argument("--bm", type=tile_size("--bm"), default=64)
    return parser


def test_defaults_are_the_seed_configuration() -> None:
    args = _parser().parse_args([])
    assert (args.tokens, args.experts, args.skew, args.K, args.N, args.bm) == (16384, 64, 0.0, 1024, 2688, 64)


def test_good_values_parse() -> None:
    args = _parser().parse_args(["--tokens", "0", "--experts", "1", "--skew", "1.2", "-K", "64", "-N", "8",
                                 "--bm", "128"])
    assert (args.tokens, args.experts, args.skew, args.K, args.N, args.bm) == (0, 1, 1.2, 64, 8, 128)


@pytest.mark.parametrize(
    ("argv", "flag", "reason"),
    [
        (["--tokens", "-5"], "--tokens", ">= 0"),
        (["--tokens", "abc"], "--tokens", "an integer"),
        (["--tokens", "1.5"], "--tokens", "an integer"),
        (["--experts", "0"], "--experts", ">= 1"),
        (["--skew", "-0.5"], "--skew", ">= 0"),
        (["--skew", "nan"], "--skew", "finite"),
        (["--skew", "inf"], "--skew", "finite"),
        (["--skew", "lots"], "--skew", "a number"),
        (["-K", "0"], "-K", ">= 1"),
        (["-N", "x"], "-N", "an integer"),
        (["--bm", "48"], "--bm", "power of two"),
        (["--bm", "8"], "--bm", ">= 16"),
    ],
)
def test_bad_values_are_argparse_errors(capsys, argv: list[str], flag: str, reason: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no usage block, no traceback
    assert f"argument {flag}:" in err
    assert reason in err
    assert "Traceback" not in err


def test_run_main_turns_value_errors_into_exit_2(capsys) -> None:
    def main(argv):
        raise ValueError("K must be a multiple of 64 for this kernel, got 100")

    with pytest.raises(SystemExit) as exit_info:
        run_main(main, [])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: K must be a multiple of 64 for this kernel, got 100\n"


@pytest.mark.parametrize(("status", "code"), [(0, 0), (None, 0), (1, 1)])
def test_run_main_passes_the_status_through(status, code: int) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_main(lambda argv: status, [])
    assert exit_info.value.code == code


def test_ignored_flags_name_what_was_given_and_why() -> None:
    parser = chapter_parser("test parser")
    for flag in ("--quick", "--no-peers", "--profile"):
        parser.add_argument(flag, action="store_true")
    args = parser.parse_args(["--profile", "--no-peers"])
    assert ignored_flags(args, ("--quick", "--no-peers", "--profile"), "no GPU here") == (
        "--no-peers and --profile were ignored: no GPU here.")
    assert ignored_flags(parser.parse_args(["--quick"]), ("--quick",), "x") == "--quick was ignored: x."
    assert ignored_flags(parser.parse_args([]), ("--quick", "--profile"), "x") is None


def test_a_default_is_not_reported_as_ignored_but_a_given_flag_is() -> None:
    """--rounds with its default of 3 was not asked for; --rounds 3 typed out was, and so was --r 5."""
    parser = chapter_parser("test parser")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048])
    assert ignored_flags(parser.parse_args([]), ("--rounds", "--quick", "--tokens"), "x") is None
    given_default = parser.parse_args(["--rounds", "3"])
    assert ignored_flags(given_default, ("--rounds", "--quick"), "x") == "--rounds was ignored: x."
    assert ignored_flags(parser.parse_args(["--r", "5"]), ("--rounds",), "x") == "--rounds was ignored: x."
    assert ignored_flags(parser.parse_args(["--tokens", "512"]), ("--rounds", "--tokens"), "x") == (
        "--tokens was ignored: x.")
    assert parser.get_default("rounds") == 3  # the defaults are the parser's again after the second parse


def test_ignored_flags_needs_a_chapter_parser() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    with pytest.raises(TypeError, match="chapter_parser"):
        ignored_flags(parser.parse_args(["--quick"]), ("--quick",), "x")


def test_tokens_left_at_their_default_name_no_rows_for_the_profile():
    """--profile reads --tokens as a filter of its cells: every cell when --tokens is its default (in any order)."""
    assert named_rows([2048, 4096], (2048, 4096)) == () == named_rows([4096, 2048], (2048, 4096))
    assert named_rows([4096], (2048, 4096)) == (4096,)
    assert named_rows([32768], (512, 2048)) == (32768,)
