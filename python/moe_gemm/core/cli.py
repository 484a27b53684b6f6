"""Command-line plumbing shared by the chapters' run.py: argument types, one-line errors, and the
flags a run names as ignored.

Every number a command line takes is bounded (the limits of moe_gemm.core.checks), and checked while
parsing: a value past its bound is one line naming the bound and exit status 2, before any work.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from moe_gemm.core.checks import (
    MAX_DIMENSION,
    MAX_EXPERTS,
    MAX_REPEATS,
    MAX_ROWS,
    MAX_SKEW,
    MAX_TILE_ROWS,
    Limit,
    require_int,
    require_nonnegative_float,
    require_tile_size,
)


def _argparse_type(check: Callable[[str, Any], Any], name: str, parse: Callable[[str], Any], kind: str):
    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            # int("1.5") says "invalid literal for int() with base 10"; say what the flag wants.
            raise argparse.ArgumentTypeError(f"{name} must be {kind}, got {text!r}") from None
        try:
            return check(name, value)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    convert.__name__ = name
    return convert


def positive_int(name: str, limit: Limit):
    """An argparse type: an integer from 1 to ``limit``."""
    return _argparse_type(lambda n, v: require_int(n, v, minimum=1, limit=limit), name, int, "an integer")


def nonnegative_int(name: str, limit: Limit):
    """An argparse type: an integer from 0 to ``limit``."""
    return _argparse_type(lambda n, v: require_int(n, v, minimum=0, limit=limit), name, int, "an integer")


def nonnegative_float(name: str, limit: Limit):
    """An argparse type: a finite number from 0 to ``limit``."""
    return _argparse_type(lambda n, v: require_nonnegative_float(n, v, limit=limit), name, float, "a number")


def tile_size(name: str):
    """An argparse type: an M tile size, a power of two from 16 to MAX_TILE_ROWS."""
    return _argparse_type(lambda n, v: require_int(n, require_tile_size(n, v), limit=MAX_TILE_ROWS), name, int,
                          "an integer")


class ChapterParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage block): 'run.py: error: ... (see --help)'.

    It also remembers which options the command line gave (:func:`given_options`), so that a run
    can name the flags it ignores without mistaking a default for a request.
    """

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extras = super().parse_known_args(args, namespace)
        # Parse the same words again with every default suppressed: an option is then on the result
        # only if the command line set it, even to its default value.
        defaults = [(action, action.default) for action in self._actions]
        try:
            for action, _ in defaults:
                action.default = argparse.SUPPRESS
            probe, _ = super().parse_known_args(args, argparse.Namespace())
        finally:
            for action, default in defaults:
                action.default = default
        setattr(parsed, _GIVEN, frozenset(option for action in self._actions if hasattr(probe, action.dest)
                                          for option in action.option_strings))
        return parsed, extras


_GIVEN = "_given_options"  # where ChapterParser leaves the option strings the command line gave


def given_options(args: argparse.Namespace) -> frozenset[str]:
    """The option strings (every spelling of each given option) the command line set in ``args``."""
    if not hasattr(args, _GIVEN):
        raise TypeError("these arguments were not parsed by chapter_parser(): which flags were given is unknown")
    return getattr(args, _GIVEN)


def chapter_parser(description: str | None, prog: str | None = None) -> ChapterParser:
    """The parser a chapter's run.py starts from; ``description`` is usually its module docstring.
    ``prog``: how the command is spelled in its messages (default: the script's file name)."""
    return ChapterParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_problem_arguments(parser: argparse.ArgumentParser, defaults: Any, *, show_skews: str | None = None) -> None:
    """--tokens, --experts, --skew, -K, -N, with ``defaults``' values (a model.workloads.Workload: the
    seed, usually; this layer sits below the model and does not name it).

    ``show_skews`` leaves --skew unset unless given, for a chapter whose default shows several
    skews, and says which.
    """
    tokens, experts, K, N = defaults.tokens, defaults.experts, defaults.K, defaults.N
    skew, skew_default_help = (None, show_skews) if show_skews else (defaults.skew, None)
    parser.add_argument("--tokens", type=nonnegative_int("--tokens", MAX_ROWS), default=tokens,
                        help=f"routed rows M_tot, at most {MAX_ROWS.value:,} (default {tokens:,})")
    parser.add_argument("--experts", type=positive_int("--experts", MAX_EXPERTS), default=experts,
                        help=f"number of experts E, at most {MAX_EXPERTS.value:,} (default {experts})")
    parser.add_argument("--skew", type=nonnegative_float("--skew", MAX_SKEW), default=skew,
                        help=f"routing skew s, 0 to {MAX_SKEW.value:g}: expert e gets rows in proportion to "
                             f"(e+1)^-s (default {skew_default_help or skew})")
    parser.add_argument("-K", type=positive_int("-K", MAX_DIMENSION), default=K,
                        help=f"reduction dimension, at most {MAX_DIMENSION.value:,} (default {K})")
    parser.add_argument("-N", type=positive_int("-N", MAX_DIMENSION), default=N,
                        help=f"output columns, at most {MAX_DIMENSION.value:,} (default {N})")


def ignored_flags(args: argparse.Namespace, flags: Sequence[str], reason: str) -> str | None:
    """One line naming the flags among ``flags`` that the command line gave and that cannot act here,
    and why; None if it gave none of them. A default is not a request: ``--rounds`` with its default
    of 3 is not reported, ``--rounds 3`` typed out is. ``args`` come from a :class:`ChapterParser`.
    """
    given = [flag for flag in flags if flag in given_options(args)]
    if not given:
        return None
    verb = "was" if len(given) == 1 else "were"
    return f"{' and '.join(given)} {verb} ignored: {reason}."


QUICK_TIMING = {"warmup": 5, "iterations": 20}  # --quick; the default is moe_gemm.cuda.timing's 10 and 50


def add_timing_arguments(parser: argparse.ArgumentParser, *, peers: str = "torch._grouped_mm and the per-expert "
                         "torch loop", quick_note: str = "") -> None:
    """--quick and --no-peers, the flags every chapter that times kernels takes."""
    parser.add_argument("--quick", action="store_true",
                        help="5 warm-up and 20 timed launches per measurement instead of 10 and 50" + quick_note)
    parser.add_argument("--no-peers", action="store_true", help=f"leave out {peers}")


def add_rounds_argument(parser: argparse.ArgumentParser) -> None:
    """--rounds: how many interleaved timing rounds a chapter makes per workload."""
    parser.add_argument("--rounds", type=positive_int("--rounds", MAX_REPEATS), default=3,
                        help="interleaved timing rounds per workload; each variant's median over rounds is kept "
                             "(default 3)")


def add_grid_arguments(parser: argparse.ArgumentParser, tokens: Sequence[int],
                       skews: Sequence[float] | None = None) -> None:
    """--tokens (the grid's M_tot values, default ``tokens``) and, given default ``skews``, --skews."""
    parser.add_argument("--tokens", type=positive_int("--tokens", MAX_ROWS), nargs="+", default=list(tokens),
                        metavar="M", help=f"the grid's M_tot values (default {' '.join(map(str, tokens))})")
    if skews is not None:
        parser.add_argument("--skews", type=nonnegative_float("--skews", MAX_SKEW), nargs="+", default=list(skews),
                            metavar="S", help=f"the grid's skews (default {' '.join(f'{s:g}' for s in skews)})")


def named_rows(tokens: Sequence[int], default: Sequence[int]) -> tuple[int, ...]:
    """--tokens read as a filter (--profile's cells): the rows it names, or none (every row) where it was left at
    its default ``default``."""
    return () if set(tokens) == set(default) else tuple(tokens)


def add_models_argument(parser: argparse.ArgumentParser, example: str) -> None:
    """--models: the model projections to measure, by words of their labels (``example``: two of them)."""
    parser.add_argument("--models", nargs="+", default=[], metavar="NAME",
                        help="only the model projections whose label contains one of these (case-insensitive), "
                             f"e.g. '--models {example}'; default: all of them")


def add_profile_argument(parser: argparse.ArgumentParser, profiled: Sequence[str], what: str) -> None:
    """--profile [VARIANT ...]: Nsight Compute on ``what`` (the chapter's cells and variants, ``profiled`` their
    names); with names, only those variants, whose profiles replace only their own in the results file."""
    parser.add_argument("--profile", nargs="*", metavar="VARIANT", default=None,
                        help=f"also Nsight Compute on {what}; with names, only those variants (their profiles "
                             f"replace only their own in the file): {', '.join(sorted(profiled))}")


def check_profile_argument(parser: argparse.ArgumentParser, args: argparse.Namespace,
                           profiled: Sequence[str]) -> None:
    """A parser error for --parts with no part and no --profile, or a --profile name outside ``profiled``."""
    if not args.parts and args.profile is None:
        parser.error("--parts with no part measures nothing: name a part, or add --profile")
    unknown = sorted(set(args.profile or ()) - set(profiled))
    if unknown:
        parser.error(f"--profile: {', '.join(unknown)} is not profiled; choose from {', '.join(sorted(profiled))}")


def timing_options(args: argparse.Namespace) -> dict[str, int]:
    """The keyword arguments of moe_gemm.cuda.timing.time_launches that --quick asks for."""
    return dict(QUICK_TIMING) if args.quick else {}


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> None:
    """Run a command's main(): a ValueError becomes one line on stderr and exit status 2, and a reader
    that stops early (``run.py | head -1``) ends the run quietly, with exit status 0."""
    try:
        status = main(argv)
        sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at the interpreter's exit
    except BrokenPipeError:
        # The reader has closed the pipe: the rest of the output has nowhere to go. The interpreter
        # flushes stdout once more as it exits, which would raise again; point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status or 0)
