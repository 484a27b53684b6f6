"""MkDocs hooks for the tutorial site (wired in by ``hooks:`` in mkdocs.yml).

Three jobs, all at build time, so that the built site needs no network to be read:

1. Before the build, run every ``chapters/NN/figures.py`` (its ``main()``), which writes PNGs under
   ``site_docs/figures/NN/`` from the chapter's recorded results, and the tables only the compiler or
   the routing arithmetic can give. A chapter with no figures.py yet is skipped. A failing figure
   script fails the build. (The pages' prose and measured numbers are not generated here: the
   macros plugin reads them from the results files, moe_gemm.site.pages.)
2. Resolve the pymdownx.snippets ``base_path`` against the repository root, so that includes of
   marked regions of real source files (``--8<-- "kernels/k1.cu:mainloop"``) work whatever the
   current directory is.
3. After the build, copy MathJax 3 (from the ``django-static-mathjax`` wheel on PyPI, a verbatim copy
   of the ``mathjax-full`` 3.2.2 distribution) into ``<site>/assets/mathjax/``. The pages load it from
   there; no CDN is involved.

``mkdocs serve`` keeps this module loaded across rebuilds; figures are generated once per process
(regenerating them on every rebuild would touch site_docs/ and make the watcher rebuild forever).
Restart ``mkdocs serve`` after changing a figure script or a results file.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from mkdocs.exceptions import PluginError

log = logging.getLogger("mkdocs.hooks.moe_gemm")

REPO_ROOT = Path(__file__).resolve().parents[1]
MATHJAX_DIST = "django-static-mathjax"
MATHJAX_ES5 = "mathjax/static/mathjax/es5"  # inside that distribution
# tex-chtml.js is the combined TeX-input/CommonHTML-output bundle the pages load; it fetches its
# fonts (output/chtml/fonts/woff-v2) and any TeX extension it autoloads (input/tex/extensions)
# relative to its own URL, and the menu's accessibility options load a11y/ and sre/ on demand.
MATHJAX_PARTS = ("tex-chtml.js", "input", "output", "ui", "a11y", "sre", "adaptors")
MATHJAX_SITE_DIR = "assets/mathjax"
FIGURE_SCRIPT_TIMEOUT_S = 600

_figures_done = False


def figure_scripts(root: Path = REPO_ROOT) -> list[Path]:
    """chapters/NN/figures.py in chapter order; chapters without one are simply absent."""
    return sorted(p for p in root.glob("chapters/*/figures.py") if p.parent.name.isdigit())


def run_figure_scripts(root: Path = REPO_ROOT) -> list[Path]:
    """Run each chapter's figures.py ``main()`` in its own interpreter, from the repository root.

    A separate process per chapter keeps one chapter's matplotlib state, sys.argv parsing or
    imports from leaking into the next, and into MkDocs.
    """
    scripts = figure_scripts(root)
    env = dict(os.environ, MPLBACKEND="Agg")
    for script in scripts:
        started = time.perf_counter()
        code = ("import runpy, sys; sys.argv = [sys.argv[0]]; "
                f"runpy.run_path({str(script)!r}, run_name='figures')['main']()")
        proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                              text=True, timeout=FIGURE_SCRIPT_TIMEOUT_S)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-4000:]
            raise PluginError(f"{script.relative_to(root)} failed (exit {proc.returncode}):\n{tail}")
        log.info("figures: %s in %.1f s", script.relative_to(root), time.perf_counter() - started)
    return scripts


def mathjax_source() -> Path:
    try:
        dist = importlib.metadata.distribution(MATHJAX_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise PluginError(f"MathJax is missing: install the docs extra "
                          f"(python -m pip install -e \".[docs]\"), which brings {MATHJAX_DIST}") from None
    source = Path(dist.locate_file(MATHJAX_ES5))
    if not (source / "tex-chtml.js").is_file():
        raise PluginError(f"{MATHJAX_DIST} {dist.version} has no {MATHJAX_ES5}/tex-chtml.js")
    return source


def copy_mathjax(site_dir: Path) -> Path:
    source = mathjax_source()
    target = site_dir / MATHJAX_SITE_DIR
    for part in MATHJAX_PARTS:
        src = source / part
        if src.is_dir():
            shutil.copytree(src, target / part, dirs_exist_ok=True)
        else:
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target / part)
    shutil.copy2(source.parent / "LICENSE", target / "LICENSE")  # Apache-2.0: ship its licence
    return target


# ---- MkDocs events ---------------------------------------------------------------------------

def on_config(config, **kwargs):
    snippets = config["mdx_configs"].get("pymdownx.snippets")
    if snippets is not None:
        paths = snippets.get("base_path", ["."])
        paths = [paths] if isinstance(paths, str) else paths
        config_dir = Path(config.config_file_path).resolve().parent
        snippets["base_path"] = [str((config_dir / p).resolve()) for p in paths]
    return config


def on_pre_build(config, **kwargs):
    global _figures_done
    if not _figures_done:
        run_figure_scripts()
        _figures_done = True


def on_post_build(config, **kwargs):
    copy_mathjax(Path(config["site_dir"]))
