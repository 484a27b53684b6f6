"""Numbers and tables for the docs pages, read from the recorded results files when the site is built.

The pages under ``site_docs/`` are Jinja templates, rendered by mkdocs-macros-plugin before the
markdown is converted (``mkdocs.yml``: ``plugins: - macros: modules: [moe_gemm.site.pages]``). The prose
is written in the page; every measured number in it is a call into this module, which reads
``chapters/<NN>/results/h200.json``. A lookup that finds nothing raises :class:`PageDataError` and
the build fails: a page never shows a blank, a stale number or a guess where a measurement belongs.

Workloads. Every lookup of a record takes the workload as keywords, defaulting to the seed
configuration: ``tokens=16384, skew=0, experts=64, K=1024, N=2688``.

Numbers. Values come back as :class:`Number`, a float that prints with its field's format
(``useful_tflops`` as ``31.6``, ``median_ms`` as ``2.851``, integers as ``10,752``; see
:func:`field_format`), so they can be printed as they are or used in arithmetic. Arithmetic gives a
plain float: print it through ``fmt``, ``pct`` or ``change``.

The macros (Jinja globals; ``fmt``, ``pct`` and ``change`` are filters too, and ``command``, a recorded
command as a reader types it, is a filter: ``{{ run.command | command }}``), with examples:

``record(ch, variant, part=None, **workload)``
    The whole record, as a :class:`Record` (a read-only mapping whose numbers are Numbers):
    ``{% set k0 = record("01", "k0") %}{{ k0.tiles }}`` gives ``10,752``. A results file whose parts ran
    as separate processes can hold one variant at one workload twice; ``part="grid"`` names which
    (``value``, ``tflops``, ``ms`` and ``results_table`` take ``part`` too).
``measured(ch, variant, part=None, **workload)``
    Whether the file holds that record, for a row a later run fills in (every other lookup fails the
    build when it finds nothing): ``{{ measured("01", "k0") }}`` gives ``True``.
``best(ch, variants, part=None, **workload)``
    The record of the fastest (useful TFLOP/s) of ``variants`` that the file holds at the workload, for a
    peer timed in several configurations: ``{{ best("01", ["k0", "peer/torch_grouped_mm"]).variant }}``
    gives ``peer/torch_grouped_mm``.
``value(ch, variant, field, fmt=None, **workload)``
    One field: ``{{ value("03", "k2/s3", "registers", tokens=16384, skew=0) }}`` gives ``96``.
``tflops(ch, variant, fmt=".1f", **workload)`` and ``ms(ch, variant, fmt=".3f", **workload)``
    Useful TFLOP/s and median milliseconds: ``{{ tflops("02", "k1/bm32", tokens=2048) }}`` gives ``99.0``.
``spread(ch, variant, **workload)``
    Fastest and slowest timed launch, for a noisy measurement: ``{{ spread("01", "peer/torch_loop") }}``
    gives ``1.810-1.981 ms``.
``ratio(ch, variant, other, field="useful_tflops", fmt=".2f", **workload)``
    ``variant``'s field over ``other``'s on the same workload:
    ``{{ ratio("03", "k2/s3", "peer/torch_grouped_mm") }}`` gives ``0.71``.
``results_table(ch, variants=None, workloads=None, columns=None, part=None)``
    A markdown table of records with its one-line legend, workload by workload, the columns of
    ``moe_gemm.site.records.COLUMNS`` (the same cells ``run.py`` prints; "% roofline" names its basis):
    ``{{ results_table("01", variants=["k0", "peer/torch_grouped_mm"], workloads=[(16384, 0), (2048, 0)],
    columns=["variant", "workload", "tflops", "vs_peer", "roofline"]) }}``. A workload is a
    ``(tokens, skew)`` pair or a dict of workload keywords.
``section(ch, name)``
    Any other top-level part of the file, wrapped like a record: ``{{ section("01", "k0_sass").FFMA }}``
    gives ``256``. ``has_section(ch, name)``: whether the file holds it (a part a later run adds). Both, and
    ``provenance``, take ``gpu="h100"`` for a part measured on another GPU than the recorded one (its own
    results file; the page says which GPU).
``entry(ch, name, variant, field=None, fmt=None)``
    The item of a list section (``profile``, ``compile_report``, ``checks``, ``stages``) whose
    ``variant`` is ``variant``, or one field of it: ``{{ entry("02", "profile", "k1/bm64", "cycles_per_issue") }}``
    gives ``28.65``.
``ceiling(ch, name)``
    ``ceiling/<name>`` as measured in that chapter's run (TFLOP/s, or TB/s for ``copy``):
    ``{{ ceiling("02", "mma_sync") }}`` gives ``630.4``.
``roofline(fmt=".0f", **workload)``, ``roofline_bound(**workload)`` and ``roofline_basis()``
    The roofline in useful TFLOP/s at the recorded GPU's ceilings (``ceilings/h200.json``: the wgmma
    peak and the device copy; one basis for every page and every run.py), which of the two sets it
    ('memory-bound' or 'compute-bound'), and that basis in words.
``gpu_ceiling(name)``
    One ceiling of that record: ``{{ gpu_ceiling("wgmma") }}``, ``{{ gpu_ceiling("copy") }}``.
``provenance(ch, parts=False)``
    The chapter's provenance (GPU, driver, CUDA, packages, commit, date, command) as one
    collapsible block; put it on its own line. With ``parts=True``, a chapter whose parts ran as separate
    processes (``part_runs``) also lists, part by part, the commit, date and command that measured it.
``compulsory_bytes(**workload)``, ``eta(bm, **workload)``, ``residency(registers, warps, smem_bytes=0)``
    The harness's models, for numbers derived from a measurement on the page.
``accumulation_model(K, promoted, inputs="non-negative", field="rel_error")``
    Chapter 10's model of the FP8 tensor core's limited accumulation (moe_gemm.model.accumulation), a
    prediction the page sets beside the measurement: ``{{ accumulation_model(4096, False) }}``.
``layers``
    Chapter 08's MoE layer sizes (moe_gemm.model.workloads.LAYERS: "mixtral", "qwen3", "deepseek"), for
    what a page computes from them: ``{{ layers.qwen3.saved_elements_per_row("ours") }}``.
``sonicmoe``
    SonicMoE's training configurations (moe_gemm.model.workloads.SONICMOE: "default", "7b", "30b"), with their
    sizes, source and FLOPs per step: ``{{ sonicmoe["7b"].flops().step }}``.
``measured_on(ch, name=None)``
    The GPU (a results file's name: "h200", "h100") whose chapter ``ch`` results hold section ``name``: the
    recorded GPU's first, else another's, else '' — for a chapter measured so far on another GPU.
``chapter_table(ch, function, *sections, extra=(), gpu=None)``
    A table of the chapter's run.py (``{{ chapter_table("10", "cell_table", "records", extra=["grid"]) }}``)
    drawn from the named sections of its results file, as the run prints it, legend included.
``fmt(x, spec=None)``, ``pct(x, digits=1)``, ``change(new, old, digits=1)``
    ``fmt(0.0581, ".3f")`` is ``0.058``; ``pct(0.473)`` is ``47.3%``; ``change(388.8, 374.5)`` is ``+3.8%``.

A page claims things about these numbers in words ("S = 3 beats S = 2 at every workload"); each
such claim has a test against the same results file (``tests/test_chapterNN.py``), so a re-run that
flips it fails until the sentence is rewritten.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from moe_gemm.measure.ceilings import ceiling_value, recorded_ceilings
from moe_gemm.measure.ceilings import roofline_basis as recorded_basis
from moe_gemm.measure.results import RECORDED_GPU, recorded_gpus
from moe_gemm.model.accumulation import promotion_errors
from moe_gemm.model.occupancy import Residency
from moe_gemm.model.occupancy import residency as _residency
from moe_gemm.model.problem import format_named
from moe_gemm.model.roofline import DATASHEET_TBPS, RooflineBasis
from moe_gemm.model.roofline import compulsory_bytes as _compulsory_bytes
from moe_gemm.model.roofline import tile_request_bytes as _tile_request_bytes
from moe_gemm.model.routing import expert_counts
from moe_gemm.model.tiles import eta as _eta
from moe_gemm.model.workloads import LAYERS, SEED, SONICMOE, Workload
from moe_gemm.site.numbers import FIELD_FORMATS, Number, PageDataError, Record, change, fmt, pct, wrap
from moe_gemm.site.records import DEFAULT_COLUMNS, records_table


def _workload(tokens: int = SEED.tokens, skew: float = SEED.skew, experts: int = SEED.experts,
              K: int = SEED.K, N: int = SEED.N, ragged: str = "M", fmt: str = "bf16") -> Workload:
    return Workload(int(tokens), float(skew), int(experts), int(K), int(N), ragged, format_named(fmt))


def _as_workload(spec: Sequence[Any] | Mapping[str, Any]) -> Workload:
    """(tokens, skew) or a dict of workload keywords, as results_table's ``workloads`` takes them."""
    if isinstance(spec, Mapping):
        return _workload(**spec)
    return _workload(*spec)


def display_command(command: str) -> str:
    """The recorded command as a reader would type it: no interpreter path, no machine's folders."""
    words = shlex.split(command)
    if words and Path(words[0]).name.startswith("python"):
        words[0] = "python"
    return shlex.join(w[w.index("chapters/"):] if w.startswith("/") and "chapters/" in w else w for w in words)


class Pages:
    """The macros over one repository's results files (``root/chapters/NN/results/<gpu>.json``)."""

    def __init__(self, root: Path, gpu: str = RECORDED_GPU) -> None:
        self.root = Path(root)
        self.gpu = gpu
        self._cache: dict[Path, tuple[int, dict[str, Any]]] = {}

    # ---- the results file

    def path(self, ch: str, gpu: str | None = None) -> Path:
        return self.root / "chapters" / ch / "results" / f"{gpu or self.gpu}.json"

    def data(self, ch: str, gpu: str | None = None) -> dict[str, Any]:
        """Chapter ``ch``'s results file (the recorded GPU's, or ``gpu``'s), read again only when it changes
        (mkdocs serve)."""
        path = self.path(ch, gpu)
        if not path.is_file():
            raise PageDataError(f"{path.relative_to(self.root)} does not exist: chapter {ch} has no recorded results")
        stamp = path.stat().st_mtime_ns
        if path not in self._cache or self._cache[path][0] != stamp:
            self._cache[path] = (stamp, json.loads(path.read_text()))
        return self._cache[path][1]

    def _name(self, ch: str, gpu: str | None = None) -> str:
        return f"chapters/{ch}/results/{gpu or self.gpu}.json"

    def measured_on(self, ch: str, name: str | None = None) -> str:
        """The GPU whose results file of chapter ``ch`` a page reads (holding section ``name``, if named): the
        recorded GPU's where it has one, else another GPU's (the first by name), else '' (nothing measured)."""
        for gpu in recorded_gpus(ch, self.gpu, self.root / "chapters"):
            if name is None or name in self.data(ch, gpu):
                return gpu
        return ""

    def chapter_table(self, ch: str, function: str, *sections: str, extra: Sequence[Any] = (),
                      gpu: str | None = None) -> str:
        """A table of chapter ``ch``'s run.py as its run prints it (``function``, one of its ``*_table``
        functions, called with each named section of the results file as recorded, then ``extra``), in
        markdown with its legend: one source for the terminal's table and the page's."""
        from moe_gemm.core.chapters import chapter_module

        data = self.data(ch, gpu)
        missing = [name for name in sections if name not in data]
        if missing:
            raise PageDataError(f"{self._name(ch, gpu)} has no section {', '.join(map(repr, missing))}")
        table = getattr(chapter_module(ch), function)(*(data[name] for name in sections), *extra)
        return table.markdown()

    # ---- records

    def _matching(self, ch: str, variants: Sequence[str], w: Workload, part: str | None,
                  gpu: str | None = None) -> list[dict[str, Any]]:
        """The records of any of ``variants`` at ``w`` (in ``part``), from the results file of ``gpu``."""
        return [r for r in self.data(ch, gpu)["records"]
                if r["variant"] in variants and w.matches(r) and part in (None, r.get("part"))]

    def _found(self, ch: str, variants: Sequence[str], w: Workload, part: str | None,
               gpu: str | None) -> list[dict[str, Any]]:
        """_matching's records; a PageDataError naming what is missing where there are none."""
        found = self._matching(ch, variants, w, part, gpu)
        if not found:
            where = f" in part {part!r}" if part else ""
            raise PageDataError(f"{self._name(ch, gpu)} has no record of {', '.join(variants)} at {w.label}{where}")
        return found

    def measured(self, ch: str, variant: str, part: str | None = None, gpu: str | None = None,
                 **workload: Any) -> bool:
        """Whether chapter ``ch``'s file (of ``gpu``) holds a record of ``variant`` at the workload (in ``part``)."""
        return bool(self._matching(ch, [variant], _workload(**workload), part, gpu))

    def record(self, ch: str, variant: str, part: str | None = None, gpu: str | None = None,
               **workload: Any) -> Record:
        """The record of ``variant`` at the workload (in ``part``), from the results file of ``gpu`` (default: the
        recorded GPU's)."""
        w = _workload(**workload)
        return Record(self._found(ch, [variant], w, part, gpu)[0], f"{self._name(ch, gpu)}: {variant} at {w.label}")

    def best(self, ch: str, variants: Sequence[str], part: str | None = None, gpu: str | None = None,
             **workload: Any) -> Record:
        w = _workload(**workload)
        fastest = max(self._found(ch, variants, w, part, gpu), key=lambda r: r["useful_tflops"])
        return Record(fastest, f"{self._name(ch, gpu)}: {fastest['variant']} at {w.label}")

    def value(self, ch: str, variant: str, field: str, fmt: str | None = None, **workload: Any) -> Number:
        number = self.record(ch, variant, **workload)[field]
        if not isinstance(number, Number):
            raise PageDataError(f"{self._name(ch)}: {variant}'s {field} is {number!r}, not a number")
        return Number(number, fmt) if fmt else number

    def tflops(self, ch: str, variant: str, fmt: str = ".1f", **workload: Any) -> Number:
        return self.value(ch, variant, "useful_tflops", fmt, **workload)

    def ms(self, ch: str, variant: str, fmt: str = ".3f", **workload: Any) -> Number:
        return self.value(ch, variant, "median_ms", fmt, **workload)

    def spread(self, ch: str, variant: str, **workload: Any) -> str:
        r = self.record(ch, variant, **workload)
        return f"{r['min_ms']}-{r['max_ms']} ms"

    def ratio(self, ch: str, variant: str, other: str, field: str = "useful_tflops", fmt: str = ".2f",
              **workload: Any) -> Number:
        return Number(self.value(ch, variant, field, **workload) / self.value(ch, other, field, **workload), fmt)

    def results_table(self, ch: str, variants: Sequence[str] | None = None,
                      workloads: Sequence[Any] | None = None, columns: Sequence[str] | None = None,
                      part: str | None = None) -> str:
        data = self.data(ch)
        records = [r for r in data["records"] if not r["variant"].startswith("ceiling/")
                   and part in (None, r.get("part"))]
        if workloads is None:
            chosen = list(dict.fromkeys(Workload.of(r) for r in records))
        else:
            chosen = [_as_workload(w) for w in workloads]
        names = list(variants) if variants is not None else list(dict.fromkeys(r["variant"] for r in records))
        rows = []
        for w in chosen:
            present = [r for r in records if w.matches(r)]
            for name in names:
                found = [r for r in present if r["variant"] == name]
                if not found and variants is not None and workloads is not None:
                    raise PageDataError(f"{self._name(ch)} has no record of {name} at {w.label}")
                rows += found
        if not rows:
            raise PageDataError(f"{self._name(ch)} has no records for this table")
        table = records_table(rows, basis=self.basis(), columns=columns or DEFAULT_COLUMNS,
                              peers_from=records)
        return table.markdown()

    # ---- the other sections

    def has_section(self, ch: str, name: str, gpu: str | None = None) -> bool:
        """Whether the chapter's results (``gpu``'s, if named) hold ``name``: for a part a later run adds."""
        return self.path(ch, gpu).is_file() and name in self.data(ch, gpu)

    def section(self, ch: str, name: str, gpu: str | None = None) -> Any:
        data = self.data(ch, gpu)
        if name not in data:
            raise PageDataError(f"{self._name(ch, gpu)} has no section {name!r} (it has {', '.join(data)})")
        return wrap(data[name], name, f"{self._name(ch, gpu)}: {name}")

    def entry(self, ch: str, name: str, variant: str, field: str | None = None, fmt: str | None = None) -> Any:
        items = self.section(ch, name)
        found = next((item for item in items if isinstance(item, Mapping) and item.get("variant") == variant), None)
        if found is None:
            raise PageDataError(f"{self._name(ch)}: section {name!r} has no entry for {variant}")
        if field is None:
            return found
        value = found[field]
        return Number(value, fmt) if fmt and isinstance(value, Number) else value

    def ceiling(self, ch: str, name: str) -> Number:
        data = self.data(ch)
        for item in [*(data.get("ceilings") or []), *data["records"]]:
            if item.get("variant") == f"ceiling/{name}":
                unit = "tbps" if "tbps" in item else "tflops"
                return Number(item[unit], FIELD_FORMATS[unit])
        raise PageDataError(f"{self._name(ch)} records no ceiling/{name}")

    def basis(self) -> RooflineBasis:
        return recorded_basis(self.gpu, self.root)

    def roofline(self, fmt: str = ".0f", **workload: Any) -> Number:
        return Number(self.basis().tflops(_workload(**workload)), fmt)

    def roofline_bound(self, **workload: Any) -> str:
        """'memory-bound' or 'compute-bound': which ceiling sets the roofline at this workload."""
        return f"{self.basis().bound(_workload(**workload))}-bound"

    def gpu_ceiling(self, name: str) -> Number:
        """``ceiling/<name>`` from the recorded GPU's ceilings record (TFLOP/s, or TB/s for ``copy``)."""
        value = ceiling_value(recorded_ceilings(self.gpu, self.root) or [], name)
        if value is None:
            raise PageDataError(f"ceilings/{self.gpu}.json records no ceiling/{name}")
        return Number(value, FIELD_FORMATS["tbps" if name == "copy" else "tflops"])

    def roofline_basis(self) -> str:
        b = self.basis()
        return f"{b.tensor_tflops:.0f} TFLOP/s (wgmma) and {b.copy_tbps:.2f} TB/s (copy), {b.source}"

    def provenance(self, ch: str, parts: bool = False, gpu: str | None = None) -> str:
        data = self.data(ch, gpu)
        p = data["provenance"]
        packages = p.get("packages") or {}
        clocks = p.get("clocks") or {}
        rows = [("GPU", f"{p['gpu']}, compute capability {p['compute_capability']}"
                        + (f", {p['sm_count']} SMs" if p.get("sm_count") else "")),
                ("driver", f"CUDA {p['driver']}"),
                ("NVRTC", str((p.get("cuda") or {}).get("nvrtc", "-")))]
        if clocks:
            rows.append(("clocks when the file was written",
                         f"SM {clocks.get('clocks.sm', '-')} (max {clocks.get('clocks.max.sm', '-')}), memory "
                         f"{clocks.get('clocks.mem', '-')}, power limit {clocks.get('power.limit', '-')}"))
        rows += [("packages", ", ".join(f"{name} {version}" for name, version in packages.items())),
                 ("commit", f"`{p['git_commit']}`"), ("date", _date(p["date"])),
                 ("command", f"`{display_command(p['command'])}`")]
        if parts:
            rows += [(f"part {part}", f"{run['measured']}: commit `{run['commit']}`, {_date(run['date'])}, "
                                      f"`{display_command(run['command'])}`")
                     for part, run in (data.get("part_runs") or {}).items()]
        body = "\n".join(f"    | {what} | {value} |" for what, value in rows)
        return (f'??? info "Provenance: {self._name(ch, gpu)}"\n\n    | recorded | |\n    |:---|:---|\n{body}\n')

    # ---- the harness's models, for numbers derived on the page

    @staticmethod
    def compulsory_bytes(**workload: Any) -> Number:
        w = _workload(**workload)
        return Number(_compulsory_bytes(w.counts, w.K, w.N, ragged=w.ragged), ",.0f")

    @staticmethod
    def tile_requests(unit_rows: int, unit_cols: int, **workload: Any) -> Number:
        w = _workload(**workload)
        return Number(_tile_request_bytes(w.counts, w.K, w.N, int(unit_rows), int(unit_cols)), ",.0f")

    @staticmethod
    def eta(bm: int, **workload: Any) -> Number:
        w = _workload(**workload)
        return Number(_eta(expert_counts(w.experts, w.tokens, w.skew), bm), ".3f")

    @staticmethod
    def residency(registers: int, warps: int, smem_bytes: int = 0) -> Residency:
        return _residency(int(registers), int(warps), int(smem_bytes))

    @staticmethod
    def accumulation_model(K: int, promoted: bool, inputs: str = "non-negative", field: str = "rel_error") -> Number:
        return Number(_accumulation_error(int(K), bool(promoted), inputs, field), ".2e")

    def macros(self) -> dict[str, Any]:
        names = ("record", "measured", "best", "value", "tflops", "ms", "spread", "ratio", "results_table", "section",
                 "has_section",
                 "entry", "ceiling", "gpu_ceiling", "roofline", "roofline_bound", "roofline_basis", "provenance",
                 "compulsory_bytes", "tile_requests", "eta", "residency", "accumulation_model", "measured_on",
                 "chapter_table")
        return {**{name: getattr(self, name) for name in names}, "fmt": fmt, "pct": pct, "change": change,
                "command": display_command, "layers": LAYERS, "datasheet_tbps": DATASHEET_TBPS,
                "sonicmoe": SONICMOE}


@functools.cache
def _accumulation_rows(K: int) -> tuple[dict[str, Any], ...]:
    """The model's rows at K, computed once per build: every macro call at that K reads them."""
    return tuple(promotion_errors([K]))


def _accumulation_error(K: int, promoted: bool, inputs: str, field: str) -> float:
    row = next((r for r in _accumulation_rows(K) if r["promoted"] == promoted and r["inputs"] == inputs), None)
    if row is None or field not in row:
        raise PageDataError(f"the accumulation model has no {field} for {inputs} inputs")
    return row[field]


def _date(iso: str) -> str:
    """'2026-11-29T12:50:33+00:00' -> '2026-11-29 12:50 UTC'."""
    when = dt.datetime.fromisoformat(iso).astimezone(dt.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M UTC")


# The pages' Jinja filters, by name
FILTERS = {"fmt": fmt, "pct": pct, "change": change, "command": display_command}


def define_env(env: Any) -> None:
    """mkdocs-macros-plugin's entry point: register the macros for the site under ``env.project_dir``."""
    pages = Pages(Path(env.project_dir))
    for name, function in pages.macros().items():
        env.macro(function, name)
    for name, function in FILTERS.items():
        env.filter(function, name)
