"""The docs site: `mkdocs build --strict` passes, and headless Chromium renders the pages as a reader
sees them: math typeset, figures loaded and opening full size in the lightbox, no request leaving
localhost, no math in the table of contents, nothing cut off at 1400 px or 400 px, no table that
needs a sideways scrollbar at 1400 px, and every region of source code a page includes shown inside a
code block. The pages are the ones in mkdocs.yml's nav, which must list
every page in site_docs/.

Chromium is Debian's `chromium` (.ci/run installs it). It is driven over the Chrome DevTools
protocol on a pipe (--remote-debugging-pipe: JSON messages ending in NUL on fds 3 and 4), so the
test needs no driver binary and no Python package beyond the standard library. Without Chromium
the browser tests skip, saying why; with MOE_GEMM_REQUIRE_BROWSER=1 (which .ci/run sets) a missing
Chromium fails them instead.
"""

from __future__ import annotations

import fcntl
import functools
import http.server
import importlib.util
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parents[1]


def nav_pages(config: Path = REPO / "mkdocs.yml") -> tuple[str, ...]:
    """The pages of mkdocs.yml's ``nav``, in its order (sections flattened), as paths under docs_dir."""
    import yaml

    def walk(entries) -> list[str]:
        found = []
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            if isinstance(value, list):
                found += walk(value)
            elif isinstance(value, str) and value.endswith(".md"):
                found.append(value)
        return found

    return tuple(walk(yaml.safe_load(config.read_text(encoding="utf-8"))["nav"]))


# Every page a reader can reach, from the nav itself: a page added there is checked from then on.
NAV_PAGES = nav_pages()
MATH_PAGES = ("index.md", "00-problem.md")  # pages that must show typeset math
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1280,1600",
)
PAGE_TIMEOUT_S = 30


def page_dir(md_name: str) -> str:
    """'00-problem.md' -> '00-problem/' (use_directory_urls), 'index.md' -> ''."""
    return "" if md_name == "index.md" else md_name.removesuffix(".md") + "/"


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return site


def test_the_nav_lists_every_page_and_only_pages_that_exist():
    """The browser tests cover NAV_PAGES; so the nav must hold every page, and nothing else."""
    pages = {p.name for p in (REPO / "site_docs").glob("*.md")}
    assert len(NAV_PAGES) == len(set(NAV_PAGES)), f"a page is in the nav twice: {NAV_PAGES}"
    assert pages - set(NAV_PAGES) == set(), "pages in site_docs/ that the nav (and so these tests) leave out"
    assert set(NAV_PAGES) - pages == set(), "nav entries with no page in site_docs/"
    assert {"index.md", "06-adaptive.md"} <= set(NAV_PAGES)


def test_site_builds_with_every_page_and_a_local_mathjax(built_site):
    for page in NAV_PAGES:
        assert (built_site / page_dir(page) / "index.html").is_file(), page
    assert (built_site / "assets/mathjax/tex-chtml.js").is_file()
    assert (built_site / "assets/mathjax/output/chtml/fonts/woff-v2").is_dir()
    for html in built_site.rglob("*.html"):
        text = html.read_text(encoding="utf-8")
        # Every script and stylesheet is the site's own: nothing is fetched from a CDN.
        assert '<script src="http' not in text and '<script src="//' not in text, html
        assert 'rel="stylesheet" href="http' not in text, html


MACHINE_PATHS = ("/opt/", "/root/", "/home/", "/work/", "/tmp/", ".venv/", "site-packages")
# The last: the internal design brief's name, which readers do not have (built from parts so that
# this file passes tests/test_repository.py's grep for it).
PROCESS_NOTES = ("Corrected after the run", "written without a GPU", "this session", "SP" + "EC")


def test_pages_show_no_machine_paths_or_process_notes(built_site):
    """Provenance names the command as a reader types it, and no page talks about how it was made."""
    for page in NAV_PAGES:
        html = (built_site / page_dir(page) / "index.html").read_text(encoding="utf-8")
        text = html[html.index('<article class="md-content__inner'):html.index("</article>")]
        for needle in (*MACHINE_PATHS, *PROCESS_NOTES):
            assert needle not in text, f"{page} shows {needle!r}"


def test_page_sources_quote_no_commit_hashes():
    """A commit belongs in the provenance block the macros render, not typed into the prose."""
    for page in NAV_PAGES:
        text = (REPO / "site_docs" / page).read_text(encoding="utf-8")
        hashes = [h for h in re.findall(r"(?<![0-9A-Za-z_])[0-9a-f]{7,40}(?![0-9A-Za-z_])", text)
                  if re.search(r"[a-f]", h) and re.search(r"\d", h)]
        assert not hashes, f"{page} quotes what looks like a commit: {hashes}"


# ---- code included from the sources ------------------------------------------------------

# A page's include of a marked region of a source file. Includes of whole .md files (the figure
# scripts' tables) are markdown that renders as tables, so they take no fence.
CODE_INCLUDE = re.compile(r'^\s*--8<-- "(?P<path>[^":]+):(?P<section>[^"]+)"\s*$')
SECTION_MARKER = re.compile(r"--8<-- \[(?:start|end):[^\]]+\]")


def code_includes(page: str) -> list[tuple[int, str, str]]:
    """(0-based line, path, section) of every include of a marked source region on ``page``."""
    lines = (REPO / "site_docs" / page).read_text(encoding="utf-8").splitlines()
    return [(i, m["path"], m["section"]) for i, line in enumerate(lines)
            if (m := CODE_INCLUDE.match(line)) and not m["path"].endswith(".md")]


def section_text(path: str, section: str) -> str:
    """The region's non-blank lines, stripped, as pymdownx.snippets includes them (the markers of
    regions nested inside it dropped); stripped so that dedent_subsections does not matter."""
    lines = (REPO / path).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if f"--8<-- [start:{section}]" in line)
    end = next(i for i, line in enumerate(lines) if f"--8<-- [end:{section}]" in line)
    return "\n".join(line.strip() for line in lines[start + 1:end] if line.strip() and not SECTION_MARKER.search(line))


CODE_PAGES = tuple(page for page in NAV_PAGES if code_includes(page))


def test_every_code_include_sits_in_a_fence_that_names_its_language():
    """Unfenced, an include of code is markdown: run-on paragraphs, and a `# comment` a heading."""
    assert CODE_PAGES, "no page includes code from a source file: the pattern no longer matches the pages"
    bare = []
    for page in CODE_PAGES:
        lines = (REPO / "site_docs" / page).read_text(encoding="utf-8").splitlines()
        for i, path, section in code_includes(page):
            opening, closing = lines[i - 1].strip(), lines[i + 1].strip() if i + 1 < len(lines) else ""
            if not (re.fullmatch(r"```\w+", opening) and closing == "```"):
                bare.append(f"{page}:{i + 1} {path}:{section}")
    assert not bare, f"includes of code outside a ```language fence: {bare}"


# ---- the hook on its own -------------------------------------------------------------------

def _load_hook():
    spec = importlib.util.spec_from_file_location("site_hooks_build", REPO / "site_hooks/build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hook_runs_each_figure_script_and_skips_chapters_without_one(tmp_path):
    hook = _load_hook()
    (tmp_path / "chapters/00").mkdir(parents=True)
    (tmp_path / "chapters/01").mkdir(parents=True)  # no figures.py yet: skipped
    (tmp_path / "chapters/00/figures.py").write_text(
        "from pathlib import Path\n"
        "def main():\n"
        "    Path('site_docs/figures/00').mkdir(parents=True, exist_ok=True)\n"
        "    Path('site_docs/figures/00/made.png').write_bytes(b'png')\n"
    )
    ran = hook.run_figure_scripts(tmp_path)
    assert [p.parent.name for p in ran] == ["00"]
    assert (tmp_path / "site_docs/figures/00/made.png").read_bytes() == b"png"


def test_hook_fails_the_build_when_a_figure_script_fails(tmp_path):
    hook = _load_hook()
    (tmp_path / "chapters/02").mkdir(parents=True)
    (tmp_path / "chapters/02/figures.py").write_text("def main():\n    raise SystemExit('no results')\n")
    with pytest.raises(Exception, match="chapters/02/figures.py failed"):
        hook.run_figure_scripts(tmp_path)


# ---- headless Chromium over the DevTools protocol -----------------------------------------

class Chromium:
    """A headless Chromium and a minimal DevTools-protocol client on --remote-debugging-pipe."""

    def __init__(self, binary: str, profile: Path, log_path: Path):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium reads commands on fd 3 and writes replies on fd 4. Duplicate the child's ends
        # above 9 first so that placing them on 3 and 4 cannot overwrite one with the other; only
        # the copies on 3 and 4 (dup2 clears close-on-exec) reach Chromium.
        child_in = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)

        def place_pipes():  # runs in the child between fork and exec
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)

        self._log = open(log_path, "wb")
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
            close_fds=False, preexec_fn=place_pipes,
        )
        os.close(child_in)
        os.close(child_out)
        self._next_id = 0
        self._replies: dict[int, dict] = {}
        self.events: list[dict] = []
        self._inbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_chrome, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._inbox.put(None)
                return
            buffer += chunk
            while b"\0" in buffer:
                message, buffer = buffer.split(b"\0", 1)
                self._inbox.put(json.loads(message))

    def _pump(self, timeout: float):
        message = self._inbox.get(timeout=timeout)
        if message is None:
            raise RuntimeError(f"Chromium closed the DevTools pipe; its log:\n{self.log_tail()}")
        if "id" in message:
            self._replies[message["id"]] = message
        else:
            self.events.append(message)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = PAGE_TIMEOUT_S) -> dict:
        self._next_id += 1
        ident = self._next_id
        message = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while ident not in self._replies:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no reply to {method} in {timeout} s")
            try:
                self._pump(remaining)
            except queue.Empty:
                continue
        reply = self._replies.pop(ident)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def wait_event(self, method: str, session: str, timeout: float = PAGE_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {method} in {timeout} s")
            try:
                self._pump(remaining)
            except queue.Empty:
                pass

    def open_page(self) -> tuple[str, str]:
        """A new tab: (target id, session id), with the events this test reads switched on."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            self.send(f"{domain}.enable", session=session)
        return target, session

    def evaluate(self, session: str, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                "returnByValue": True}, session=session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def log_tail(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except (OSError, RuntimeError):  # Chromium may close the pipe (or time out) before it replies
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()


# Waits for MathJax's startup typesetting and for every image, then reports what a reader sees.
READ_PAGE = """
(async () => {
  const until = Date.now() + 20000;
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  while (!(window.MathJax && MathJax.startup && MathJax.startup.promise) && Date.now() < until) await sleep(50);
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  const images = Array.from(document.images);
  images.forEach(img => { img.loading = "eager"; });
  await Promise.all(images.map(img => img.complete ? null : new Promise(done => {
    img.addEventListener("load", done); img.addEventListener("error", done); setTimeout(done, 15000);
  })));
  const sources = Array.from(document.querySelectorAll(".arithmatex"));
  return {
    mathjax: (window.MathJax && MathJax.version) || null,
    math_sources: sources.length,
    rendered: document.querySelectorAll("mjx-container").length,
    untypeset: sources.filter(e => !e.querySelector("mjx-container")).map(e => e.textContent.slice(0, 100)),
    errors: Array.from(document.querySelectorAll("mjx-merror"))
      .map(e => e.getAttribute("data-mjx-error") || e.textContent),
    raw_dollars: document.body.innerText.includes("$$"),
    images: images.map(img => ({src: img.currentSrc || img.src, complete: img.complete, width: img.naturalWidth})),
  };
})()
"""


@pytest.fixture(scope="module")
def served_site(built_site):
    handler = functools.partial(_QuietHandler, directory=str(built_site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        reason = "headless Chromium is needed to check the rendered site (apt-get install chromium)"
        if os.environ.get("MOE_GEMM_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{reason}; MOE_GEMM_REQUIRE_BROWSER=1 makes its absence a failure")
        pytest.skip(f"{reason}; set MOE_GEMM_REQUIRE_BROWSER=1 to make its absence a failure")
    work = tmp_path_factory.mktemp("chromium")
    chrome = Chromium(binary, work / "profile", work / "chromium.log")
    try:
        yield chrome
    finally:
        chrome.close()


@pytest.mark.parametrize("page", NAV_PAGES)
def test_page_renders_math_and_figures_offline(browser, served_site, page):
    url = served_site + page_dir(page)
    target, session = browser.open_page()
    try:
        browser.send("Page.navigate", {"url": url}, session=session)
        browser.wait_event("Page.loadEventFired", session)
        seen = browser.evaluate(session, READ_PAGE)
        events = [e for e in browser.events if e.get("sessionId") == session]
    finally:
        browser.send("Target.closeTarget", {"targetId": target})

    origin = urlsplit(served_site).netloc
    requested = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
    remote = [u for u in requested if urlsplit(u).scheme in ("http", "https", "ws", "wss")
              and urlsplit(u).netloc != origin]
    assert not remote, f"{page} reached past localhost: {remote}"
    failed = [(e["params"]["response"]["url"], e["params"]["response"]["status"]) for e in events
              if e["method"] == "Network.responseReceived" and e["params"]["response"]["status"] >= 400]
    assert not failed, f"{page}: failed requests {failed}"

    assert seen["mathjax"], f"{page}: MathJax did not load (served from assets/mathjax/)"
    assert not seen["untypeset"], f"{page}: math left untypeset: {seen['untypeset']}"
    assert not seen["errors"], f"{page}: MathJax errors: {seen['errors']}"
    assert not seen["raw_dollars"], f"{page}: raw $$ left in the visible text"
    if page in MATH_PAGES:
        assert seen["rendered"] > 0, f"{page}: no typeset math"
    broken = [img["src"] for img in seen["images"] if not img["complete"] or img["width"] <= 0]
    assert not broken, f"{page}: images that did not load: {broken}"



# The text of every code block in the article, as the reader sees it (highlighting spans and all).
CODE_BLOCKS = """
Array.from(document.querySelectorAll("article.md-content__inner pre code")).map(c => c.textContent)
"""


@pytest.mark.parametrize("page", CODE_PAGES)
def test_included_code_renders_inside_a_code_block(browser, served_site, page):
    """Each region a page includes from a source file shows, whole, inside one <pre><code>."""
    blocks = _read(browser, served_site, page, 1400, CODE_BLOCKS)
    shown = ["\n".join(line.strip() for line in block.splitlines() if line.strip()) for block in blocks]
    missing = [f"{path}:{section} (line {i + 1})" for i, path, section in code_includes(page)
               if not any(section_text(path, section) in block for block in shown)]
    assert not missing, f"{page}: included code not rendered inside <pre><code>: {missing}"


# ---- what a reader sees: the table of contents, the width, the lightbox --------------------

def _read(browser, served_site: str, page: str, width: int, script: str) -> Any:
    """``script``'s value in a tab showing ``page`` at ``width`` CSS pixels, math typeset and images
    loaded; the tab is closed after."""
    target, session = browser.open_page()
    try:
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
        browser.send("Page.navigate", {"url": served_site + page_dir(page)}, session=session)
        browser.wait_event("Page.loadEventFired", session)
        browser.evaluate(session, READ_PAGE)
        return browser.evaluate(session, script)
    finally:
        browser.send("Target.closeTarget", {"targetId": target})


# Tables, code, display math and figures that reach past the article (or the window) without a
# horizontal scroll container around them that itself fits: what a reader would see cut off.
CLIPPED = """
(() => {
  const article = document.querySelector("article.md-content__inner");
  const box = article.getBoundingClientRect();
  // The content column: the article plus its margins, into which Material's table wrappers reach.
  const column = document.querySelector(".md-content").getBoundingClientRect();
  const right = Math.min(column.right, document.documentElement.clientWidth) + 1;
  const left = Math.max(column.left, 0) - 1;
  const fits = r => r.right <= right && r.left >= left;
  const scroller = el => {
    for (let a = el.parentElement; a && a !== article; a = a.parentElement) {
      const ox = getComputedStyle(a).overflowX;
      if (ox === "auto" || ox === "scroll") return a;
    }
    return null;
  };
  const clipped = [];
  for (const el of article.querySelectorAll("table, pre, mjx-container[display='true'], img")) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || fits(r)) continue;
    const s = scroller(el);
    if (s && fits(s.getBoundingClientRect())) continue;
    clipped.push(`${el.tagName.toLowerCase()} ${Math.round(r.left)}..${Math.round(r.right)} ` +
                 `(column ${Math.round(column.left)}..${Math.round(column.right)}): ` +
                 el.textContent.trim().slice(0, 60));
  }
  return {clipped, article_width: box.width,
          page_scrolls_sideways: document.documentElement.scrollWidth > document.documentElement.clientWidth + 1};
})()
"""


@pytest.mark.parametrize("width", (1400, 400))
@pytest.mark.parametrize("page", NAV_PAGES)
def test_nothing_is_cut_off(browser, served_site, page, width):
    """Nothing reaches past the column outside a scroll container, and the page body never scrolls
    sideways: at 400 px a wide table scrolls inside its own wrapper, long inline math does not
    push the page wider (06-adaptive.md's grid is written in words for that)."""
    seen = _read(browser, served_site, page, width, CLIPPED)
    assert not seen["clipped"], f"{page} at {width} px: cut off outside a scroll container: {seen['clipped']}"
    assert not seen["page_scrolls_sideways"], f"{page} at {width} px: the whole page scrolls sideways"
    if page != "index.md":
        from moe_gemm.site.style import DISPLAY_WIDTH_PX, NARROW_DISPLAY_WIDTH_PX

        # The figures are sized for these widths (moe_gemm.site.style): a narrower article shrinks their text.
        least = DISPLAY_WIDTH_PX if width == 1400 else NARROW_DISPLAY_WIDTH_PX
        assert seen["article_width"] >= least, (page, width, seen["article_width"])


# Every table as a reader at this width sees it: how much wider its content is than its box, and
# the same for the nearest scroll container around it (Material's .md-typeset__scrollwrap).
TABLE_WIDTHS = """
(() => {
  const article = document.querySelector("article.md-content__inner");
  const scroller = el => {
    for (let a = el.parentElement; a && a !== article; a = a.parentElement) {
      const ox = getComputedStyle(a).overflowX;
      if (ox === "auto" || ox === "scroll") return a;
    }
    return null;
  };
  const tables = Array.from(article.querySelectorAll("table")).map(t => {
    const s = scroller(t);
    return {header: Array.from(t.querySelectorAll("th")).map(h => h.textContent.trim()).join(" | ").slice(0, 80),
            scroll: t.scrollWidth, client: t.clientWidth,
            wrapper_scroll: s ? s.scrollWidth : 0, wrapper_client: s ? s.clientWidth : 0};
  });
  const root = document.documentElement;
  return {tables, page_scroll: root.scrollWidth, page_client: root.clientWidth};
})()
"""


@pytest.mark.parametrize("page", NAV_PAGES)
def test_tables_fit_the_column_at_1400_px(browser, served_site, page):
    """At a 1400 px window no table needs a sideways scrollbar: a reader sees every column at once.

    A table too wide for the column is shortened where it is written (shorter headers, the long
    meaning in the legend under it) or split where it has two jobs, not left to scroll.
    """
    seen = _read(browser, served_site, page, 1400, TABLE_WIDTHS)
    wide = [f"{t['header']!r}: content {max(t['scroll'], t['wrapper_scroll'])} px in "
            f"{t['wrapper_client'] or t['client']} px" for t in seen["tables"]
            if t["scroll"] > t["client"] + 1 or t["wrapper_scroll"] > t["wrapper_client"] + 1]
    assert not wide, f"{page} at 1400 px: {len(wide)} table(s) scroll sideways: {wide}"
    assert seen["page_scroll"] <= seen["page_client"] + 1, f"{page} at 1400 px: the page scrolls sideways"


TOC = """
Array.from(document.querySelectorAll(".md-nav--secondary .md-nav__link, .md-nav--primary .md-nav__link"))
  .map(a => a.textContent.trim()).filter(t => t)
"""


@pytest.mark.parametrize("page", NAV_PAGES)
def test_table_of_contents_has_no_math(browser, served_site, page):
    entries = _read(browser, served_site, page, 1400, TOC)
    assert len(entries) >= len(NAV_PAGES), f"{page}: no navigation found: {entries}"
    raw = [t for t in entries if "\\(" in t or "$" in t or "\\[" in t]
    assert not raw, f"{page}: raw LaTeX in the table of contents: {raw}"


LIGHTBOX = """
(async () => {
  const figures = Array.from(document.querySelectorAll("article.md-content__inner img"));
  const unwrapped = figures.filter(img => !img.closest("a.glightbox")).map(img => img.getAttribute("src"));
  const anchor = document.querySelector("article.md-content__inner a.glightbox");
  anchor.click();
  const until = Date.now() + 10000;
  let shown = null;
  while (Date.now() < until) {
    shown = document.querySelector(".glightbox-container .gslide.current img");
    if (shown && shown.complete && shown.naturalWidth > 0) break;
    await new Promise(r => setTimeout(r, 100));
  }
  return {figures: figures.length, unwrapped, href: anchor.href,
          shown: shown ? shown.src : null, shown_width: shown ? shown.naturalWidth : 0};
})()
"""


@pytest.mark.parametrize("page", ("01-fp32-baseline.md", "03-tma-warp-specialization.md"))
def test_figures_open_full_size_in_the_lightbox(browser, served_site, page):
    seen = _read(browser, served_site, page, 1400, LIGHTBOX)
    assert seen["figures"] >= 2 and not seen["unwrapped"], seen
    assert seen["shown"] == seen["href"] and seen["shown_width"] > 0, f"{page}: the lightbox did not open: {seen}"
