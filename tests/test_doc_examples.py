"""The pages' runnable examples run: every fenced block opened as ```{.python .runnable} on a page in
site_docs/ is executed, each in a fresh namespace, and a block that raises fails with its page, line
and first lines.

The marker is pymdownx.superfences' attribute form: the block renders as any ```python block (the
class `runnable` lands on its <div>, which the site's stylesheet ignores), so a reader sees plain
highlighted Python. A block runs as written in the page's source, so it must not hold Jinja (the
macros plugin would render the page's copy differently). The op falls back to torch on CPU tensors,
so examples of it run without a GPU; they need torch, and skip without it.
"""

from __future__ import annotations

import re
import textwrap
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = REPO / "site_docs"

# An opening fence of three or more backticks or tildes whose attribute list names the class
# `runnable` beside the language: ```{.python .runnable}
OPENING = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*\{(?P<attrs>[^}]*)\}[ \t]*$")
FIRST_LINES = 3  # how much of a failing block its message quotes


@dataclass(frozen=True)
class Example:
    page: str
    line: int  # 1-based, of the opening fence
    source: str

    def head(self) -> str:
        return "\n".join(self.source.splitlines()[:FIRST_LINES])


def runnable_blocks(page: str, text: str) -> list[Example]:
    """Every ```{.python .runnable} block of ``text``, dedented by its fence's indent (a block may sit
    in an admonition); it ends at a fence of the same character at least as long, as CommonMark says."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        m = OPENING.match(lines[i])
        classes = m["attrs"].split() if m else []
        if not m or ".runnable" not in classes:
            i += 1
            continue
        assert ".python" in classes, f"{page}:{i + 1}: a runnable block must be Python: {lines[i]!r}"
        closing = re.compile(rf"^[ \t]*{re.escape(m['fence'][0])}{{{len(m['fence'])},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
        assert end is not None, f"{page}:{i + 1}: a runnable block with no closing fence"
        found.append(Example(page, i + 1, textwrap.dedent("\n".join(lines[i + 1:end])) + "\n"))
        i = end + 1
    return found


def page_examples() -> list[Example]:
    return [example for path in sorted(PAGES.glob("*.md"))
            for example in runnable_blocks(path.name, path.read_text(encoding="utf-8"))]


def run_example(example: Example) -> None:
    """Execute ``example`` in a namespace of its own; on an exception, fail naming where it is."""
    code = compile(example.source, f"site_docs/{example.page}:{example.line}", "exec")
    try:
        exec(code, {"__name__": "__doc_example__"})
    except Exception:  # noqa: BLE001 - whatever a page's example raises is the failure to report
        pytest.fail(f"the runnable block at site_docs/{example.page}:{example.line} raised:\n"
                    f"{textwrap.indent(example.head(), '    ')}\n    ...\n{traceback.format_exc()}", pytrace=False)


EXAMPLES = page_examples()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{e.page}:{e.line}")
def test_runnable_example_runs(example: Example):
    pytest.importorskip("torch")
    assert "{{" not in example.source and "{%" not in example.source, \
        f"site_docs/{example.page}:{example.line}: Jinja in a runnable block: the page shows something else"
    run_example(example)


def test_the_op_page_has_a_runnable_example():
    """Chapter 08 shows grouped_mm on CPU tensors against torch's per-expert loop: were the marker or
    the finder to break, this fails instead of the examples silently not running."""
    assert [e for e in EXAMPLES if e.page == "08-in-a-model.md" and "grouped_mm(" in e.source]


def test_finder_takes_only_runnable_blocks_whole_and_dedented():
    text = textwrap.dedent("""\
        ```python
        not_run = True
        ```

        !!! note
            ````{.python .runnable}
            x = 1
            ```
            still inside: a shorter fence does not close it
            ````

        ~~~{ .python .runnable }
        y = 2
        ~~~
        """)
    found = runnable_blocks("page.md", text)
    assert [(e.line, e.source) for e in found] == [
        (6, "x = 1\n```\nstill inside: a shorter fence does not close it\n"),
        (12, "y = 2\n"),
    ]


def test_a_block_that_raises_fails_naming_its_page_line_and_first_lines():
    example = Example("api.md", 40, "import math\nvalue = math.sqrt(4)\nassert value == 3, value\nprint('never')\n")
    with pytest.raises(pytest.fail.Exception) as failure:
        run_example(example)
    message = str(failure.value)
    assert "site_docs/api.md:40" in message and "value = math.sqrt(4)" in message
    assert "AssertionError: 2.0" in message and "print('never')" not in message


def test_each_block_runs_in_a_fresh_namespace():
    run_example(Example("a.md", 1, "leaked = 1\n"))
    with pytest.raises(pytest.fail.Exception, match="NameError"):
        run_example(Example("b.md", 1, "leaked\n"))


def test_the_marker_renders_as_a_plain_highlighted_python_block():
    """With the site's fence extensions (mkdocs.yml), the attribute list adds a class and nothing a
    reader sees: the code is highlighted as Python, and the braces do not show."""
    import markdown
    import yaml

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    names = {next(iter(e)) if isinstance(e, dict) else e for e in config["markdown_extensions"]}
    assert {"pymdownx.superfences", "pymdownx.highlight"} <= names
    html = markdown.markdown("```{.python .runnable}\nimport torch\n```\n",
                             extensions=["pymdownx.highlight", "pymdownx.superfences"])
    assert '<div class="runnable highlight">' in html and '<span class="kn">import</span>' in html, html
    assert "{" not in html, html
