"""Variants by name, for the entry points that take one on the command line.

``python -m moe_gemm.measure.sanitize_target k1`` and ``python -m moe_gemm.measure.profile_target k1/bm64 ...``
are handed variant names, not objects; this module turns a name into a variant.

How a kernel module joins: define, at module level,

    VARIANTS = {"k1/bm64": functools.partial(K1MmaSync, 64, False), ...}

(name -> zero-argument factory) in the package ``moe_gemm/variants/<family>/``, where ``<family>``
is the part of the name before the first '/' (``k0``, ``k1``, ..., ``peer``). Nothing here needs
editing: the family's package is imported on first use. A family whose variants share code paths
may also name, in ``SANITIZED``, the few that together take every branch of its kernel template:
compute-sanitizer then runs those instead of all of them.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

# Modules of this package that are not kernel families (sm90: what the Hopper steps share).
NOT_FAMILIES = {"registry", "compiled", "peer", "sm90"}


def family_of(name: str) -> str:
    return name.split("/", 1)[0]


def _family_variants(family: str) -> dict[str, Callable[[], Any]]:
    module_name = f"{__package__}.{family}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name:
            raise ValueError(f"no variant family {family!r} (no module {module_name})") from None
        raise
    variants = getattr(module, "VARIANTS", None)
    if not isinstance(variants, dict):
        raise ValueError(f"{module_name} defines no VARIANTS dict, so its variants cannot be named")
    return variants


def families() -> list[str]:
    """Kernel families with a module in this package (k0, k1, ...), in order."""
    package = importlib.import_module(__package__)
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__)
                  if m.name not in NOT_FAMILIES and not m.name.startswith("_"))


def names(family: str) -> list[str]:
    """Every variant name of one family, in its module's order."""
    return list(_family_variants(family))


def factory(name: str) -> Callable[[], Any]:
    """What makes the variant ``name``; ValueError listing the family's names if unknown."""
    variants = _family_variants(family_of(name))
    if name not in variants:
        raise ValueError(f"unknown variant {name!r}; {family_of(name)} has {', '.join(variants)}")
    return variants[name]


def get(name: str) -> Any:
    """A fresh variant for ``name`` (e.g. 'k1/bm64')."""
    return factory(name)()


def resolve(selectors: list[str]) -> list[Any]:
    """Variants for names or whole families: ['k1'] -> every k1 variant, ['k1/bm64'] -> that one."""
    chosen: list[Any] = []
    for selector in selectors:
        if "/" in selector:
            chosen.append(get(selector))
        else:
            chosen.extend(factory() for factory in _family_variants(selector).values())
    return chosen


def sanitized(family: str) -> list[str]:
    """The variants compute-sanitizer runs for ``family``: its ``SANITIZED`` names, else all of it."""
    module = importlib.import_module(f"{__package__}.{family}")
    return list(getattr(module, "SANITIZED", None) or names(family))
