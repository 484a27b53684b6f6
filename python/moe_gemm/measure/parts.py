"""A results file measured in parts: chapters 07 and 08 measure for minutes per part, so each part can
run in a process of its own (a GPU session's stage has a time limit) and merge into the file it finds.

    results = PartsFile("07", gpu, SECTIONS)          # the file as this GPU last left it
    results.replace("records", rows, key=part_key)    # rows measured again replace their earlier ones
    results.ran("grid", "the grid's rows 512, 2,048")  # which commit and command measured the part
    results.save(targets=...)                         # after each part: a stopped run keeps what it finished

A run keeps every row it does not measure again, and only the sections the chapter writes: the file
holds nothing a run of its run.py cannot remake.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from moe_gemm.cuda.gpu import GpuInfo
from moe_gemm.measure.provenance import provenance
from moe_gemm.measure.results import recorded, save_results
from moe_gemm.model.workloads import GRID_SKEWS, Workload

Row = dict[str, Any]


def part_runs(earlier: dict[str, dict[str, str]], measured: dict[str, str],
              now: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Which commit and command measured each part of a file whose parts run as separate processes:
    ``earlier``'s entries, with each part in ``measured`` (part -> what this run measured of it)
    replaced by this run's (``now``: its provenance); an earlier entry ``part-...`` (a part once
    measured in pieces) goes with its part."""
    kept = {key: run for key, run in earlier.items() if key.split("-")[0] not in measured}
    return {**kept, **{part: {"commit": now["git_commit"], "date": now["date"], "command": now["command"],
                              "measured": what} for part, what in measured.items()}}


def workload_piece(part: str, workload: Workload, done: Sequence[Workload],
                   models: Mapping[str, Workload]) -> tuple[str, str]:
    """The part_runs entry of a "grid" or "models" part once a run has measured ``done`` of it (``workload``
    last): one entry per model projection (named by its label in ``models``) or grid row (saying which skews
    while the row is unfinished), so that each names the run that measured it."""
    if part == "models":
        label = next(name for name, w in models.items() if w == workload)
        return f"models-{list(models).index(label)}", f"the model projection {label}"
    skews = [w.skew for w in done if w.tokens == workload.tokens]
    every = len(skews) == len(GRID_SKEWS)
    return (f"grid-{workload.tokens}", f"the grid's row {workload.tokens:,}"
            + ("" if every else f", skews {', '.join(f'{s:g}' for s in skews)}"))


def profile_piece(names: Sequence[str], everything: str) -> tuple[str, str]:
    """The part_runs entry of a profile: of the variants ``names`` only (each such run keeps its own entry, as
    the rows it replaces are only theirs), or of the chapter's whole profile (``everything`` says what), which
    replaces every earlier entry."""
    if not names:
        return "profile", everything
    return f"profile-{','.join(names)}", f"Nsight Compute on {', '.join(names)}"


class PartsFile:
    """``chapters/<chapter>/results/<gpu>.json`` as a run measuring some of its parts sees it: the
    earlier file's ``sections`` (a chapter's SECTIONS; any other section is dropped), this run's rows
    merged in, saved whole each time."""

    def __init__(self, chapter: str, gpu: GpuInfo, sections: frozenset[str]) -> None:
        earlier = recorded(chapter, gpu.slug) or {}
        self.chapter, self.gpu, self.sections = chapter, gpu, sections
        self.data: dict[str, Any] = {key: value for key, value in earlier.items()
                                     if key in sections and key != "provenance"}
        self.data.setdefault("records", [])
        self.now = provenance(gpu)

    def rows(self, section: str) -> list[Row]:
        """The rows of a list section (records, steps, ...) as merged so far; [] if there are none."""
        return self.data.get(section, [])

    def replace(self, section: str, rows: Sequence[Row], key: Callable[[Row], Hashable]) -> None:
        """Add ``rows`` to ``section`` and drop every earlier row with the key of one of them: a piece
        measured again (a part, a cell, a layer size at a token count) replaces all its rows, every
        variant's, so that a comparison within a piece never sets one run's number beside another's."""
        measured = {key(row) for row in rows}
        self.data[section] = [row for row in self.rows(section) if key(row) not in measured] + list(rows)

    def put(self, **sections: Any) -> None:
        """Sections this run measured whole (the checks, a profile): they replace the earlier file's."""
        self.data.update(sections)

    def ran(self, part: str, measured: str) -> None:
        """Record that this run measured ``part`` (``measured`` says what of it) in ``part_runs``."""
        self.data["part_runs"] = part_runs(self.data.get("part_runs", {}), {part: measured}, self.now)

    def save(self, **computed: Any) -> str:
        """Write the file: the merged sections and ``computed`` (what is recomputed from them at every
        save: targets, tables). A section outside the chapter's is refused."""
        sections = {**self.data, **computed}
        unknown = sorted(set(sections) - self.sections)
        if unknown:
            raise ValueError(f"chapter {self.chapter} writes no section {', '.join(unknown)} (not in its SECTIONS)")
        records = sections.pop("records")
        return save_results(self.chapter, records, self.gpu, **sections)
