"""SASS without a GPU: disassemble a CUBIN with the PyPI wheel's ``cuobjdump`` (no CUDA toolkit
needed) and count the instructions a chapter is about."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _tool(name: str) -> str:
    """A CUDA binary tool: the PyPI wheel's copy first (no toolkit needed), then PATH."""
    try:
        import nvidia

        for root in nvidia.__path__:
            for candidate in Path(root).glob(f"cu*/bin/{name}"):
                if os.access(candidate, os.X_OK):
                    return str(candidate)
    except ImportError:
        pass
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found: pip install nvidia-cuda-{name}")
    return found


def sass(cubin: bytes, tool: str = "cuobjdump") -> str:
    """The CUBIN's SASS: ``cuobjdump -sass``, or ``nvdisasm -c`` (which also labels branch targets)."""
    commands = {"cuobjdump": ["-sass"], "nvdisasm": ["-c"]}
    if tool not in commands:
        raise ValueError(f"tool must be one of {sorted(commands)}, got {tool!r}")
    with tempfile.TemporaryDirectory(prefix="moe-gemm-sass-") as folder:
        scratch = Path(folder) / "kernel.cubin"
        scratch.write_bytes(cubin)
        return subprocess.run([_tool(tool), *commands[tool], str(scratch)], capture_output=True, text=True,
                              check=True).stdout


def mnemonics(sass_text: str) -> list[str]:
    """Every instruction's mnemonic with its modifiers (e.g. 'SYNCS.PHASECHK.TRANS64.TRYWAIT'), in listing order."""
    return re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass_text)


def opcode_counts(sass_text: str, opcodes: Iterable[str]) -> dict[str, int]:
    """Static count of instructions whose mnemonic starts with each prefix (e.g. 'HMMA.16816.F32.BF16')."""
    found = mnemonics(sass_text)
    return {op: sum(m.startswith(op) for m in found) for op in opcodes}


def function_sass(sass_text: str, symbol: str) -> str:
    """The part of a module's SASS that belongs to function ``symbol`` (cuobjdump prints each function after a
    "Function : <symbol>" line); a module of one function is returned whole."""
    parts = re.split(r"^\s*Function : (\S+)\s*$", sass_text, flags=re.MULTILINE)
    functions = dict(zip(parts[1::2], parts[2::2], strict=True))
    if len(functions) <= 1:
        return sass_text
    if symbol not in functions:
        raise ValueError(f"no function {symbol} in this SASS; it has {', '.join(functions)}")
    return functions[symbol]


def sass_report(compiled: Any, opcodes: Iterable[str] = ()) -> dict[str, Any]:
    """One row of a compile report for a CompiledKernel (moe_gemm.cuda.nvrtc, which imports this module):
    ptxas's resource report and static counts of ``opcodes``."""
    r = compiled.report
    return {"kernel": compiled.name, "arch": compiled.arch, "registers": r.registers,
            "static_smem_bytes": r.static_smem_bytes, "spill_bytes": r.spill_bytes,
            "stack_frame_bytes": r.stack_frame_bytes,
            **opcode_counts(function_sass(compiled.sass(), compiled.symbol), opcodes)}


_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)[^;]*);")
_BRANCH = re.compile(r"^(?:@!?U?P\w+\s+)?BRA(?:\.\w+)?\s+(?:\w+,\s*)?0x([0-9a-f]+)")


def loops(sass_text: str) -> list[list[str]]:
    """Every loop of the SASS as its instructions in order: from a backward branch's target to the
    branch itself, inclusive (a loop's body as a warp issues it once per trip, NOPs left out)."""
    found = [(int(address, 16), text, mnemonic) for address, text, mnemonic in _INSTRUCTION.findall(sass_text)]
    bodies = []
    for i, (address, text, _) in enumerate(found):
        branch = _BRANCH.match(text)
        if branch and int(branch.group(1), 16) < address:
            head = int(branch.group(1), 16)
            bodies.append([t for a, t, m in found[: i + 1] if a >= head and m != "NOP"])
    return bodies


def main_loop_instructions(sass_text: str, wgmmas: int, opcode: str = "HGMMA") -> int:
    """Instructions per trip of the smallest loop that issues exactly ``wgmmas`` wgmma instructions (HGMMA for
    16-bit operands, QGMMA for fp8): a GEMM's main loop, one k-step of the ring per trip (ValueError if there
    is none)."""
    def issued(body: list[str]) -> int:
        return sum(re.match(rf"(?:@!?U?P\w+\s+)?{opcode}", text) is not None for text in body)

    candidates = [body for body in loops(sass_text) if issued(body) == wgmmas]
    if not candidates:
        raise ValueError(f"no loop issues exactly {wgmmas} {opcode} instructions per trip")
    return min(len(body) for body in candidates)
