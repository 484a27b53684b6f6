"""Plain-text and markdown tables for run.py output and generated docs tables.

Cells may be strings or numbers. Numbers are formatted here (ints with thousands separators,
floats with ``float_format``) so every chapter prints them the same way; a column whose cells
are all numeric, or numeric-looking strings such as ``"90.2"``, ``"22.0%"``, ``"1.8x"`` or the
range ``"0.621-0.625"``, is right-aligned so the digits line up (and, on the docs site, does not
wrap: site_docs/stylesheets/extra.css).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

Cell = str | int | float

# A number, optionally with thousands separators, a sign, an exponent and a unit suffix; or a range
# of two such numbers ("0.621-0.625", "1.8-2.1x"), which lines up like one.
_NUMBER = r"[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?([eE][-+]?\d+)?"
_NUMERIC = re.compile(rf"^{_NUMBER}(\s*[-–]\s*(?=[-+]?\.?\d){_NUMBER})?\s*(%|x|×)?$")


def format_cell(value: Cell, float_format: str = "{:.3f}") -> str:
    """One cell as text: ints as 16,384, floats through ``float_format``, anything else str()."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        return float_format.format(float(value))
    return str(value)


def _is_numeric(value: Cell, text: str) -> bool:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return True
    return bool(text) and any(ch.isdigit() for ch in text) and bool(_NUMERIC.match(text.strip()))


def _layout(headers: Sequence[str], rows: Sequence[Sequence[Cell]],
            float_format: str) -> tuple[list[list[str]], list[bool]]:
    """Cells as text and, per column, whether it is right-aligned (all non-empty cells numeric)."""
    for i, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"row {i} has {len(row)} cells but there are {len(headers)} headers")
    text = [[format_cell(value, float_format) for value in row] for row in rows]
    # "-" marks an undefined value (no peer, no rows); it takes no part in deciding the alignment.
    blank = ("", "-")
    numeric = [
        all(_is_numeric(row[c], text[r][c]) for r, row in enumerate(rows) if text[r][c] not in blank)
        and any(text[r][c] not in blank for r in range(len(rows)))
        for c in range(len(headers))
    ]
    return text, numeric


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Cell]], title: str | None = None,
                 *, float_format: str = "{:.3f}", indent: int = 0) -> str:
    """A fixed-width plain-text table: optional title line, header, a rule, one line per row."""
    text, numeric = _layout(headers, rows, float_format)
    widths = [max([len(h), *(len(row[c]) for row in text)]) for c, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [cell.rjust(w) if right else cell.ljust(w) for cell, w, right in zip(cells, widths, numeric)]
        return " " * indent + "  ".join(parts).rstrip()

    out = [title] if title else []
    out.append(line(list(headers)))
    out.append(" " * indent + "  ".join("-" * w for w in widths))
    out.extend(line(row) for row in text)
    return "\n".join(out)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Cell]], *,
                   float_format: str = "{:.3f}") -> str:
    """A pipe table for the docs; numeric columns get a right-aligned ``---:`` rule."""
    text, numeric = _layout(headers, rows, float_format)

    def escape(cell: str) -> str:
        return cell.replace("|", "\\|")

    out = ["| " + " | ".join(escape(h) for h in headers) + " |",
           "|" + "|".join("---:" if right else ":---" for right in numeric) + "|"]
    out.extend("| " + " | ".join(escape(cell) for cell in row) + " |" for row in text)
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class Table:
    """Headers, rows, an optional title and a one-line legend of the columns.

    The legend is required: a reader of run.py's output has no page beside it to say what "eta"
    or "vs peer" means, so every table says it under itself.

    ``page_split`` is for a table with two jobs that is too wide for a docs page's column (which
    holds about a dozen narrow columns at 1400 px, tests/test_docs.py): :meth:`markdown` writes it
    as two tables, columns ``[0, page_split)`` and then column 0 (the row's name) with the rest,
    and the legend once under both. A terminal is wide, so :meth:`text` keeps one table.
    """

    headers: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    title: str | None = None
    float_format: str = "{:.3f}"
    legend: str = field(kw_only=True)
    page_split: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if not self.legend.strip() or "\n" in self.legend:
            raise ValueError(f"a table's legend is one non-empty line, got {self.legend!r}")
        if self.page_split is not None and not 1 < self.page_split < len(self.headers):
            raise ValueError(f"page_split {self.page_split} leaves a table with no columns of its own "
                             f"(there are {len(self.headers)})")

    def text(self, indent: int = 0) -> str:
        table = format_table(self.headers, self.rows, self.title, float_format=self.float_format, indent=indent)
        return f"{table}\n{' ' * indent}{self.legend}"

    def markdown(self) -> str:
        if self.page_split is None:
            parts = [range(len(self.headers))]
        else:
            parts = [range(self.page_split), [0, *range(self.page_split, len(self.headers))]]
        tables = [markdown_table([self.headers[c] for c in columns], [[row[c] for c in columns] for row in self.rows],
                                 float_format=self.float_format) for columns in parts]
        return "\n".join(tables) + f"\n*{self.legend}*\n"
