"""The GPU tests' ``sanitize`` fixture (conftest.py) without a GPU: a stand-in for compute-sanitizer that runs the
script and prints the summary it is told to, so that what the fixture accepts and refuses is tested here."""

from __future__ import annotations

import stat
import sys

import pytest


@pytest.fixture
def fake_sanitizer(tmp_path, monkeypatch):
    """A compute-sanitizer that runs `python -c script` (its last three arguments) and then prints $SUMMARY."""
    import moe_gemm.measure.sanitize_target

    tool = tmp_path / "compute-sanitizer"
    tool.write_text('#!/bin/sh\nfor last; do :; done\n'
                    f'"{sys.executable}" -c "$last"; code=$?\necho "$SUMMARY"\nexit $code\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(moe_gemm.measure.sanitize_target, "find_compute_sanitizer", lambda: str(tool))
    return monkeypatch


def test_a_clean_run_passes_and_returns_the_output(fake_sanitizer, request):
    fake_sanitizer.setenv("SUMMARY", "========= ERROR SUMMARY: 0 errors")
    sanitize = request.getfixturevalue("sanitize")
    assert "ran to its end" in sanitize("print('ran to its end')", "k", "ran to its end")


@pytest.mark.parametrize("script, summary, tool", [
    ("print('done')", "========= ERROR SUMMARY: 2 errors\n========= Invalid __global__ write of size 4", "memcheck"),
    ("import sys; sys.exit(3)", "========= ERROR SUMMARY: 0 errors", "memcheck"),  # stopped before its end
    ("print('not the marker')", "========= ERROR SUMMARY: 0 errors", "memcheck"),
    ("print('done')", "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)", "racecheck"),
])
def test_a_finding_an_exit_or_a_missing_marker_fails(fake_sanitizer, request, script, summary, tool):
    fake_sanitizer.setenv("SUMMARY", summary)
    sanitize = request.getfixturevalue("sanitize")
    with pytest.raises(AssertionError):
        sanitize(script, "k", "done", tool=tool)


def test_a_racecheck_run_is_clean_on_its_own_summary(fake_sanitizer, request):
    fake_sanitizer.setenv("SUMMARY", "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)")
    assert "done" in request.getfixturevalue("sanitize")("print('done')", "k", "done", tool="racecheck")
