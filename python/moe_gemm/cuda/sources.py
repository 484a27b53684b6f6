"""Kernel sources as the compiler sees them: the ``#include`` closure and the preprocessed text.

Two things key on a kernel's source, and both must see every file it reaches, however deep the
``#include`` chain goes: the NVRTC cache (a header edited two includes away must rebuild the
kernel) and the record of kernels checked on the GPU (``kernels/validated.json``), which must
go stale when any code the kernel compiles changes, and only then.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from moe_gemm.core.paths import KERNEL_DIR

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.MULTILINE)
# Comments and string literals in one pass, so a "//" inside a string is not taken for a comment.
_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"', re.DOTALL)


def include_closure(source_file: str, kernel_dir: Path = KERNEL_DIR) -> list[Path]:
    """``kernels/<source_file>`` and every file it reaches through ``#include "..."``, each once,
    in the order the preprocessor first meets them (the headers use ``#pragma once``)."""
    seen: list[Path] = []

    def visit(path: Path) -> None:
        if path in seen:
            return
        if not path.is_file():
            raise ValueError(f"no kernel source {path}")
        seen.append(path)
        for name in INCLUDE.findall(path.read_text()):
            visit((path.parent / name).resolve())

    visit((kernel_dir / source_file).resolve())
    return seen


def closure_digest(source_file: str, kernel_dir: Path = KERNEL_DIR) -> str:
    """sha256 over the name and bytes of every file in the include closure: any edit changes it."""
    digest = hashlib.sha256()
    for path in include_closure(source_file, kernel_dir):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _strip_comments(text: str) -> str:
    return _COMMENT_OR_STRING.sub(lambda m: m.group(0) if m.group(0).startswith('"') else " ", text)


def preprocessed_source(source_file: str, kernel_dir: Path = KERNEL_DIR) -> str:
    """The source with every ``#include "..."`` expanded in place (once per file), comments removed
    and blank lines dropped: what the compiler's front end reads, less what cannot change the code.
    Macros are not expanded; a changed macro changes the text that defines it. A Python kernel
    (numba, ``kernels/k0_fp32.py``) loses its comment lines and blank lines."""
    if source_file.endswith(".py"):
        lines = (line.rstrip() for line in (kernel_dir / source_file).read_text().splitlines())
        return "\n".join(line for line in lines if line.strip() and not line.lstrip().startswith("#"))
    expanded: list[Path] = []

    def expand(path: Path) -> str:
        if path in expanded:
            return ""
        expanded.append(path)
        text = _strip_comments(path.read_text())
        return INCLUDE.sub(lambda m: expand((path.parent / m.group(1)).resolve()), text)

    text = expand((kernel_dir / source_file).resolve())
    lines = (" ".join(line.split()) for line in text.splitlines())
    return "\n".join(line for line in lines if line and line != "#pragma once")


def source_hash(source_file: str, name: str, kernel_dir: Path = KERNEL_DIR) -> str:
    """The hash the GPU validation record keys on: the preprocessed source and the instantiation."""
    digest = hashlib.sha256(preprocessed_source(source_file, kernel_dir).encode())
    digest.update(b"\0" + name.encode())
    return digest.hexdigest()[:16]
