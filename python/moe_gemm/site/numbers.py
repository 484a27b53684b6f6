"""Numbers as the docs pages print them: each field with its own format, and read-only records.

A value a page reads from a results file comes back as a :class:`Number`, a float that prints with
its field's format (``useful_tflops`` as ``31.6``, ``median_ms`` as ``2.851``, integers as ``10,752``),
so it can be printed as it is or used in arithmetic; arithmetic gives a plain float, printed
through :func:`fmt`, :func:`pct` or :func:`change`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

# Printing formats by field name, then by suffix or prefix; other integers get thousands separators
# and other floats two decimals.
FIELD_FORMATS = {
    "useful_tflops": ".1f", "scheduled_tflops": ".1f", "tflops": ".1f", "tbps": ".2f", "eta": ".3f",
    "rel_error": ".1e", "skew": "g", "issue_active": ".3f", "issue_model": ".3f", "ipc": ".2f",
}
SUFFIX_FORMATS = (("_tflops", ".1f"), ("_estimate", ".1f"), ("_eta", ".3f"), ("_ms", ".3f"), ("_pct", ".1f"))
PREFIX_FORMATS = (("stall_", ".2f"),)


class PageDataError(LookupError):
    """A page asked for a number its results file does not hold."""


def field_format(field: str, value: float) -> str:
    """The format a field prints with when the page gives none."""
    if field in FIELD_FORMATS:
        return FIELD_FORMATS[field]
    for suffix, spec in SUFFIX_FORMATS:
        if field.endswith(suffix):
            return spec
    for prefix, spec in PREFIX_FORMATS:
        if field.startswith(prefix):
            return spec
    return ",.0f" if float(value).is_integer() else ".2f"


class Number(float):
    """A float that prints in its own format, so that ``{{ x }}`` on a page reads as intended."""

    spec: str

    def __new__(cls, value: float, spec: str) -> Number:
        number = super().__new__(cls, value)
        number.spec = spec
        return number

    def __str__(self) -> str:
        return format(float(self), self.spec)


def wrap(value: Any, field: str, where: str) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return Number(value, field_format(field, value))
    if isinstance(value, Mapping):
        return Record(value, where)
    if isinstance(value, list):
        return [wrap(item, field, f"{where}[{i}]") for i, item in enumerate(value)]
    return value


class Record(Mapping):
    """A read-only view of one part of a results file; a missing key names where it was looked for."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self._data = data
        self._where = where

    def __getitem__(self, key: str) -> Any:
        if key not in self._data:
            raise PageDataError(f"{self._where} has no {key!r} (it has {', '.join(map(str, self._data))})")
        return wrap(self._data[key], key, f"{self._where}.{key}")

    def __getattr__(self, key: str) -> Any:
        """``record.tiles`` as well as ``record["tiles"]``, in Python as in Jinja."""
        if key.startswith("_"):
            raise AttributeError(key)
        return self[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self._data else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def fmt(x: float, spec: str | None = None) -> str:
    """``x`` in ``spec``, or a Number in its own format."""
    if spec is None:
        return str(x) if isinstance(x, Number) else format(float(x), ".2f")
    return format(float(x), spec)


def pct(x: float, digits: int = 1) -> str:
    """A fraction as a percentage: pct(0.473) is '47.3%'."""
    return f"{100 * float(x):.{digits}f}%"


def change(new: float, old: float, digits: int = 1) -> str:
    """Signed relative change: change(388.8, 374.5) is '+3.8%'."""
    return f"{100 * (float(new) / float(old) - 1):+.{digits}f}%"
