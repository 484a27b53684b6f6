"""CI runs exactly what the README tells a reader to run for the tests."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_test_command() -> str:
    """The command in the README's fenced block that runs pytest; there must be exactly one."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```(?:bash|sh|console)?\n(.*?)```", readme, flags=re.DOTALL)
    commands = [line.strip() for block in blocks for line in block.splitlines() if "pytest" in line]
    assert len(commands) == 1, f"expected one pytest command in README.md, found {commands}"
    return commands[0]


def test_ci_runs_the_readme_test_command_verbatim():
    command = readme_test_command()
    ci_lines = [line.strip() for line in (REPO / ".ci/run").read_text(encoding="utf-8").splitlines()]
    assert command in ci_lines, f".ci/run does not run the README's test command {command!r}"


def test_ci_script_is_strict_and_executable():
    script = REPO / ".ci/run"
    assert os.access(script, os.X_OK), ".ci/run must be executable"
    text = script.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash") or text.startswith("#!/bin/bash")
    assert "set -euo pipefail" in text


def test_ci_installs_an_exactly_pinned_torch_and_transformers_before_the_tests():
    """Without torch the op's CPU tests skip; an unpinned torch would pull PyPI's CUDA build."""
    lines = [line.strip() for line in (REPO / ".ci/run").read_text(encoding="utf-8").splitlines()]
    installs = [i for i, line in enumerate(lines) if re.match(r"python -m pip install .*\btorch\b", line)]
    assert len(installs) == 1, f".ci/run should install torch on one line, found {[lines[i] for i in installs]}"
    words = lines[installs[0]].split()
    assert any(re.fullmatch(r"torch==\d+\.\d+\.\d+", w) for w in words), f"torch not pinned exactly: {words}"
    assert "transformers" in words, f"transformers is not installed beside torch: {words}"
    assert installs[0] < lines.index(readme_test_command()), "torch must be installed before the tests run"
