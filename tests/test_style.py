"""The house style: ruff's rules (pyproject.toml's [tool.ruff]) hold over the whole repository, and the one
figure style keeps text readable at the width the page shows a figure."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from moe_gemm.site.style import DISPLAY_WIDTH_PX, MIN_TEXT_PX, displayed_text_px, new_figure, save_figure

REPO = Path(__file__).resolve().parents[1]


def test_text_shrinks_with_a_wide_figure_and_not_below_its_own_size():
    fig, ax = new_figure(13.0, 4.0)  # 1,690 px wide at 130 dpi: shown at about half size
    ax.set_title("title", fontsize=12)
    assert displayed_text_px(fig)["title"] == pytest.approx(12 * 130 / 72 * DISPLAY_WIDTH_PX / (13 * 130))
    fig, ax = new_figure(5.0, 3.0)  # narrower than the column: shown at its own size
    ax.set_title("title", fontsize=12)
    assert displayed_text_px(fig)["title"] == pytest.approx(12 * 130 / 72)


def test_a_figure_with_unreadable_text_is_refused(tmp_path):
    fig, ax = new_figure(12.0, 4.0)
    ax.text(0.5, 0.5, "tiny label", fontsize=6)
    with pytest.raises(ValueError, match=r"figure 99/tiny: text would show below 11 px .*'tiny label'"):
        save_figure(fig, "99", "tiny", root=tmp_path)
    assert not (tmp_path / "99" / "tiny.png").exists()


def test_a_readable_figure_is_saved(tmp_path):
    fig, ax = new_figure(7.0, 3.0)
    ax.set_title("readable", fontsize=11)
    assert min(displayed_text_px(fig).values()) >= MIN_TEXT_PX
    assert save_figure(fig, "99", "ok", root=tmp_path).read_bytes()[:4] == b"\x89PNG"


def test_ruff_finds_nothing():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed: pip install -e '.[test]' brings it")
    # --no-cache: the check leaves no .ruff_cache behind in the checkout
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode:
        pytest.fail(f"ruff check found problems:\n{proc.stdout}{proc.stderr}", pytrace=False)
