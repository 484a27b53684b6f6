"""Chapters as modules: a chapter's folder is numbered, not a package, so its figures.py (or a test)
reaches its run.py through :func:`chapter_module`."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from moe_gemm.core.paths import CHAPTERS_DIR


def chapter_module(chapter: str, name: str = "run") -> ModuleType:
    """``chapters/<chapter>/<name>.py`` as a module, loaded afresh: chapter folders are numbered, not
    packages, so a chapter's figures.py (or a test) reaches its run.py this way."""
    spec = importlib.util.spec_from_file_location(f"chapter{chapter}_{name}",
                                                  CHAPTERS_DIR / chapter / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
