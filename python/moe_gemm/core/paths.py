"""Where the repository keeps things: kernel sources, chapters and their results, the site's figures.

The harness runs from a checkout (an editable install), so every path is relative to the
repository root found from this file, never to the working directory.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
KERNEL_DIR = REPO_ROOT / "kernels"
CHAPTERS_DIR = REPO_ROOT / "chapters"
FIGURE_ROOT = REPO_ROOT / "site_docs" / "figures"
