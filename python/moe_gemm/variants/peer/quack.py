"""Quack's autotuned varlen-M GEMM as a peer: the CuTe-DSL kernels SonicMoE runs on.

quack (Dao-AILab, PyPI ``quack-kernels``; this wrapper follows 0.6.5) takes exactly this
project's problem in one call::

    from quack.gemm_interface import gemm
    gemm(A[M_tot, K], B[E, K, N], out=C[M_tot, N], cu_seqlens_m=<int32 [E+1] offsets>, tuned=True)

B goes in as the harness stores it, [E, K, N] row-major: for varlen-M, quack hands its kernel
``B.mT`` (an N-major [E, N, K] view, no copy). C is written in place (``out=``), so the peer
writes the harness's own poisoned output buffer, like the kernels do. The launch goes to
torch's current stream (quack compiles with ``make_fake_stream(use_tvm_ffi_env_stream=True)``,
and TVM-FFI takes that stream from torch's ``getCurrentCUDAStream`` for the tensors' device),
here the harness stream, under ``torch.cuda.stream(torch_stream())``, where the timing events are.

Its rules, as quack 0.6.5 states them (``quack/gemm_tvm_ffi_utils.py``, ``compile_utils.py``,
``gemm.py``): bf16 A and B (bf16 C), every stride but the unit one a multiple of 16 bytes, so K
and N multiples of 8, 16-byte aligned data, A K-major and C N-major, int32 ``cu_seqlens_m``.
This wrapper runs it on sm_90 and sm_100 only (quack also has sm_80/sm_120 kernels, untried
here). :func:`check_quack_inputs` says which rule an input breaks, before quack is imported.

**Autotuning stays out of the timing.** The first tuned call at a new shape benchmarks every
candidate configuration (22 on sm_90 for varlen-M, 20-40 s with their compilation). ``prepare``
makes that call itself, on the harness stream, timed with a host clock around a synchronize,
and reports it in ``launch_info`` (which the results record takes in):

* ``tune_s``: the seconds of the call that tuned this shape in this process (the same number
  in every later prepare at that shape); ``prepare_s``: this prepare's own calls (small once tuned);
* ``tuning``: ``"autotuned"``, ``"quack disk cache"`` (quack keeps its timings on disk, under
  ``$QUACK_CACHE_DIR`` or ``~/.quack/cache``, and a later process reads them back instead of
  measuring) or ``"cached by quack before this harness asked"`` (timings unknown);
* ``config``: the configuration this variant runs (quack's ``GemmConfig`` as a dict);
* ``config_timings``: the autotuner's three fastest, ``[{"config": {...}, "ms": ...}, ...]``,
  in its own measure (mean per launch of one CUDA-graph replay over L2-cold input copies);
  ``configs_timed``: how many configurations it timed; ``quack_version``.

quack keys its tuning on shapes, strides and dtypes only (``quack/autotuner.py``), not on the
routing: at one (M_tot, K, N, E), a skewed routing runs the configuration tuned on whichever
routing came first. ``tune_skew`` records the skew of the problem the tuning was made on.

**Giving the peer its best.** The autotuner's top configurations often lie within 2% of one
another, closer than its measurement separates them. So besides ``peer/quack`` (the public
``gemm(..., tuned=True)``: the autotuner's pick, and what a user gets), ``peer/quack-top1``,
``-top2`` and ``-top3`` run the first, second and third fastest of the autotuner's own
timings through ``gemm_tuned.fn(..., config=...)`` (quack's tuned function, unwrapped). Each
is checked and timed by the harness like any variant, and a chapter takes the fastest of
:data:`QUACK_PEERS` as quack's number, as it takes the faster of torch's two B layouts.
``-top1`` runs the same configuration as ``peer/quack`` without the ``gemm`` wrapper and
the autotuner's lookup, so the two differ only by host time per call.

quack is optional (``pip install -e '.[peers]'``; a machine that reaches no package index needs
the wheels of quack-kernels and nvidia-cutlass-dsl carried to it): :func:`quack_available`
says why it cannot run here, and :func:`quack_peers` is then empty.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_gemm.cuda.device import DeviceProblem, synchronize
from moe_gemm.cuda.gpu import detect_gpu
from moe_gemm.cuda.variant import Prepared
from moe_gemm.model.problem import BF16
from moe_gemm.variants.compiled import require_takes
from moe_gemm.variants.peer.torch import _torch, torch_stream, torch_view

PEER_QUACK = "peer/quack"
PEER_QUACK_WGRAD = "peer/quack-wgrad"  # the weight gradient: quack's varlen-K GEMM (chapter 09)
TOP_CONFIGS = 3  # the autotuner's fastest configurations each get a variant
PEER_QUACK_TOP = tuple(f"{PEER_QUACK}-top{rank}" for rank in range(1, TOP_CONFIGS + 1))
QUACK_PEERS = (PEER_QUACK, *PEER_QUACK_TOP)  # the fastest of these counts as quack's number
PEER_QUACK_WGRAD_TOP = tuple(f"{PEER_QUACK_WGRAD}-top{rank}" for rank in range(1, TOP_CONFIGS + 1))
QUACK_WGRAD_PEERS = (PEER_QUACK_WGRAD, *PEER_QUACK_WGRAD_TOP)
QUACK_VERSION = "0.6.5"  # the release whose API this wrapper follows
QUACK_ARCH_MAJORS = (9, 10)  # sm_90 (wgmma) and sm_100 (tcgen05)
QUACK_ELEMENT_MULTIPLE = 8  # K and N: non-unit strides are 16-byte multiples (8 bf16)
QUACK_ALIGNMENT = 16  # bytes, every data pointer (the kernels' assumed_align)
INSTALL_HINT = ("pip install -e '.[peers]' (quack-kernels[cu13] 0.6.5 and nvidia-cutlass-dsl 4.8.1; on a machine "
                "with no package index, install their wheels)")


# ---- quack's rules, checked before quack is imported ------------------------------------------

def check_quack_inputs(experts: int, K: int, N: int, addresses: dict[str, int] | None = None,
                       variant: str = PEER_QUACK) -> None:
    """ValueError naming the first rule of quack's varlen-M GEMM that these inputs break."""
    multiple = QUACK_ELEMENT_MULTIPLE
    if K % multiple or N % multiple:
        raise ValueError(f"{variant} needs K and N to be multiples of {multiple} (quack's 16-byte strides), "
                         f"got K = {K}, N = {N}")
    if experts < 1:
        raise ValueError(f"{variant} needs at least one expert, got E = {experts}")
    for name, address in (addresses or {}).items():
        if address % QUACK_ALIGNMENT:
            raise ValueError(f"{variant} needs {name} to start on a {QUACK_ALIGNMENT}-byte boundary, "
                             f"got {address:#x}")


def check_device_problem(variant: str, dev: DeviceProblem) -> None:
    """ValueError if the device buffers are not what quack takes: bf16 A [M_tot, K] and B [E, K, N] (or, for
    the weight gradient, dC [M_tot, N]), int32 offsets [E + 1], with quack's stride and alignment rules."""
    problem = dev.problem
    tokens, experts, K, N = problem.tokens, problem.experts, problem.K, problem.N
    b_name, b_shape = ("B", (experts, K, N)) if problem.ragged == "M" else ("dC", (tokens, N))
    for name, array, shape, dtype in (("A", dev.a, (tokens, K), BF16), (b_name, dev.b, b_shape, BF16),
                                      ("the offsets (cu_seqlens_m)", dev.offsets, (experts + 1,), np.int32)):
        if np.dtype(array.dtype) != np.dtype(dtype) or tuple(array.shape) != shape:
            raise ValueError(f"{variant} needs {name} as {np.dtype(dtype).name if dtype is not BF16 else 'bf16'} "
                             f"{list(shape)}, got {np.dtype(array.dtype).name} {list(array.shape)}")
    check_quack_inputs(experts, K, N, {"A": dev.a.ptr, b_name: dev.b.ptr, "the offsets": dev.offsets.ptr}, variant)


def require_quack_gpu(variant: str) -> None:
    """ValueError unless an sm_90 or sm_100 GPU is here."""
    gpu = detect_gpu()
    if gpu is None:
        raise ValueError(f"{variant} needs an NVIDIA GPU and none was found")
    major, minor = gpu.compute_capability
    if major not in QUACK_ARCH_MAJORS:
        raise ValueError(f"{variant} needs an sm_90 or sm_100 GPU (quack's wgmma or tcgen05 kernels); "
                         f"{gpu.name} is sm_{major}{minor}")


def _quack(variant: str) -> Any:
    """``quack.gemm_interface``, or a ValueError saying how to install it."""
    try:
        iface = importlib.import_module("quack.gemm_interface")
    except ImportError as error:
        raise ValueError(f"{variant} needs quack-kernels {QUACK_VERSION} ({INSTALL_HINT}); "
                         f"import failed: {error}") from None
    except Exception as error:  # noqa: BLE001 - a broken install (no CUDA driver, a bad DSL wheel) says why
        raise ValueError(f"{variant}: quack is installed but does not import ({type(error).__name__}: {error}); "
                         f"reinstall with {INSTALL_HINT}") from None
    tuner = getattr(iface, "gemm_tuned", None)
    if not callable(getattr(iface, "gemm", None)) or not callable(getattr(tuner, "fn", None)):
        raise ValueError(f"{variant} follows quack {QUACK_VERSION}'s gemm_interface (gemm, gemm_tuned.fn); "
                         f"this quack ({quack_version()}) has neither")
    return iface


def quack_version() -> str | None:
    """The installed quack-kernels version, if any."""
    try:
        return importlib.metadata.version("quack-kernels")
    except importlib.metadata.PackageNotFoundError:
        module = sys.modules.get("quack")
        return getattr(module, "__version__", None)


def quack_available() -> str | None:
    """None where quack's varlen-M GEMM can run here, else the reason it cannot."""
    try:
        require_quack_gpu(PEER_QUACK)
        _quack(PEER_QUACK)
        _torch(PEER_QUACK)
    except ValueError as reason:
        return str(reason)
    return None


# ---- the autotuner: one tuning per shape, kept out of the timing ------------------------------

@dataclass(frozen=True)
class Tuning:
    """What quack's autotuner chose at one shape, as this process first saw it."""

    shape: tuple[Any, ...]  # (ragged axis, M_tot, K, N, E): quack's tuning key, for this project's inputs
    tune_s: float  # host seconds of the call that tuned (or read the disk cache), compilation included
    source: str  # "autotuned", "quack disk cache", or "cached by quack before this harness asked"
    chosen: Any  # quack's AutotuneConfig that gemm(..., tuned=True) runs
    ranked: tuple[tuple[Any, float], ...]  # (AutotuneConfig, ms), fastest first; empty if unknown
    skew: float  # the routing skew of the problem it was tuned on

    def top(self, count: int = TOP_CONFIGS) -> list[dict[str, Any]]:
        return [{"config": config_json(config), "ms": ms} for config, ms in self.ranked[:count]]


_TUNINGS: dict[tuple[Any, ...], Tuning] = {}


def forget_tunings() -> None:
    """Forget what this module recorded (quack's own caches are left alone)."""
    _TUNINGS.clear()


def config_json(config: Any) -> dict[str, Any] | str | None:
    """quack's AutotuneConfig (or GemmConfig) as a plain dict for the results file."""
    if config is None:
        return None
    inner = config.kwargs.get("config", config) if isinstance(getattr(config, "kwargs", None), dict) else config
    if dataclasses.is_dataclass(inner) and not isinstance(inner, type):
        plain = {}
        for key, value in dataclasses.asdict(inner).items():
            if isinstance(value, bool) or value is None or isinstance(value, (str, float)):
                plain[key] = value
            elif isinstance(value, int):
                plain[key] = int(value)
            else:
                plain[key] = str(value)
        return plain
    return str(inner)


def _timing_ms(timing: Any) -> float:
    """One configuration's time in quack's ``configs_timings``: [median, p20, p80] ms, or a number."""
    value = timing[0] if isinstance(timing, (list, tuple)) else timing
    return float(value)


def ranked_configs(timings: dict[Any, Any]) -> tuple[tuple[Any, float], ...]:
    """The autotuner's timings, fastest first; configurations that failed (inf) are left out.
    The sort is stable, so on a tie the first one wins, as in the autotuner's own min()."""
    rows = [(config, _timing_ms(timing)) for config, timing in timings.items()]
    return tuple(sorted(((c, ms) for c, ms in rows if math.isfinite(ms)), key=lambda row: row[1]))


def tune(tuner: Any, tuned_call: Callable[[], None], shape: tuple[Any, ...],
         skew: float) -> tuple[Tuning, bool]:
    """Make one tuned call (the autotune, the first time at ``shape``) and wait for it.

    Returns this shape's :class:`Tuning` and whether this call made it. quack replaces
    ``configs_timings`` (a new dict) when it measures or reads its disk cache, and leaves it
    alone on an in-process cache hit; that tells the three cases apart.
    """
    before = getattr(tuner, "configs_timings", None)
    start = time.perf_counter()
    tuned_call()
    synchronize()
    seconds = time.perf_counter() - start
    timings = getattr(tuner, "configs_timings", None)
    chosen = getattr(tuner, "best_config", None)
    if timings is not None and timings is not before:
        source = "autotuned" if getattr(tuner, "bench_time", 0) else "quack disk cache"
        _TUNINGS[shape] = Tuning(shape, seconds, source, chosen, ranked_configs(timings), float(skew))
        return _TUNINGS[shape], True
    if shape not in _TUNINGS:
        _TUNINGS[shape] = Tuning(shape, seconds, "cached by quack before this harness asked", chosen, (),
                                 float(skew))
        return _TUNINGS[shape], True
    return _TUNINGS[shape], False


# ---- the variants ------------------------------------------------------------------------------

class QuackVarlenM:
    """``peer/quack``: quack's ``gemm(A, B, out=C, cu_seqlens_m=offsets, tuned=True)``.

    ``ragged="K"`` (``peer/quack-wgrad``): the weight gradient through quack's varlen-K GEMM,
    ``gemm(A.t(), dC, out=dB, cu_seqlens_k=offsets, tuned=True)``: quack reduces over each expert's run of
    rows and takes A^T M-major, which the transposed view of the row-major A is (no copy).

    ``rank=k`` (``peer/quack-topk``) runs instead the k-th fastest configuration of the
    autotuner's timings at this shape, through ``gemm_tuned.fn(..., config=...)``. Where the
    autotuner timed fewer configurations than k (some failed), prepare refuses with a ValueError,
    after the tuned call: the only refusal that comes after a launch.
    """

    uses_torch = True  # allocates through torch (measure.graph_replay captures it with torch.cuda.graph)

    def __init__(self, rank: int | None = None, ragged: str = "M") -> None:
        if rank is not None and not 1 <= rank <= TOP_CONFIGS:
            raise ValueError(f"rank must be 1 ... {TOP_CONFIGS}, got {rank}")
        if ragged not in ("M", "K"):
            raise ValueError(f"ragged must be 'M' (the forward) or 'K' (the weight gradient), got {ragged!r}")
        self.rank, self.ragged = rank, ragged
        names = QUACK_PEERS if ragged == "M" else QUACK_WGRAD_PEERS
        self.name = names[0 if rank is None else rank]

    def __repr__(self) -> str:
        return f"QuackVarlenM(rank={self.rank}, ragged={self.ragged!r})"

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem = dev.problem
        require_takes(self.name, problem, ragged_axes=(self.ragged,))
        check_device_problem(self.name, dev)  # quack's rules first: no import, no GPU needed
        require_quack_gpu(self.name)
        iface = _quack(self.name)
        torch = _torch(self.name)
        output = dev.new_output()  # C, poisoned: quack writes it in place
        check_quack_inputs(problem.experts, problem.K, problem.N, {"C": output.ptr}, self.name)
        info: dict[str, Any] = {"quack_version": quack_version()}
        if problem.tokens == 0:  # M_tot = 0: nothing to multiply, nothing to tune, no launch
            info.update(tune_s=0.0, prepare_s=0.0, tuning="none: no rows (M_tot = 0)", config=None,
                        config_timings=[], configs_timed=0)
            return Prepared(launch=lambda: None, output=output, keep_alive=[dev], launch_info=info)
        a, b, c = torch_view(dev.a), torch_view(dev.b), torch_view(output)  # views: no copies
        if self.ragged == "K":
            a = a.t()  # A^T [K, M_tot], M-major
        offsets = torch_view(dev.offsets)  # int32 [E + 1] on the device: quack's cu_seqlens_m (or _k)
        varlen = {"cu_seqlens_m" if self.ragged == "M" else "cu_seqlens_k": offsets}
        stream = torch_stream()
        gemm, tuner = iface.gemm, iface.gemm_tuned

        def tuned_call() -> None:
            with torch.cuda.stream(stream):
                gemm(a, b, out=c, tuned=True, **varlen)

        shape = (self.ragged, problem.tokens, problem.K, problem.N, problem.experts)
        start = time.perf_counter()
        tuning, made_now = tune(tuner, tuned_call, shape, problem.skew)
        if made_now and tuning.source == "autotuned":
            torch.cuda.empty_cache()  # hand back the autotuner's input copies (gigabytes at large shapes)
        if self.rank is None:
            run, config = tuned_call, tuning.chosen
        else:
            if len(tuning.ranked) < self.rank:
                raise ValueError(f"{self.name}: quack's autotuner timed {len(tuning.ranked)} configurations at "
                                 f"this shape ({tuning.source}); there is no rank {self.rank}")
            config, ms = tuning.ranked[self.rank - 1]
            info.update(config_rank=self.rank, config_tuner_ms=ms)
            run = _config_launch(torch, stream, tuner.fn, (a, b, c), varlen, config)
            run()  # compiles this configuration now, if the tuning came from quack's disk cache
            synchronize()
        info.update(tune_s=round(tuning.tune_s, 3), prepare_s=round(time.perf_counter() - start, 4),
                    tuning=tuning.source, tune_skew=tuning.skew, config=config_json(config),
                    config_timings=tuning.top(), configs_timed=len(tuning.ranked))
        return Prepared(launch=run, output=output, keep_alive=[dev, a, b, c, offsets], launch_info=info)


def _config_launch(torch: Any, stream: Any, fn: Callable[..., Any], operands: tuple[Any, Any, Any],
                   varlen: dict[str, Any], config: Any) -> Callable[[], None]:
    """One launch of quack's tuned function with a given configuration (``config=GemmConfig``); ``varlen``
    names the offsets (``cu_seqlens_m`` or ``cu_seqlens_k``)."""
    a, b, c = operands
    kwargs = config.all_kwargs() if hasattr(config, "all_kwargs") else {"config": config}

    def run() -> None:
        with torch.cuda.stream(stream):
            fn(a, b, c, **varlen, **kwargs)

    return run


def quack_peers(ragged: str = "M") -> list[QuackVarlenM]:
    """``peer/quack`` (``ragged="K"``: ``peer/quack-wgrad``) and its three top configurations, where quack can
    run here; else none."""
    if quack_available() is not None:
        return []
    return [QuackVarlenM(ragged=ragged)] + [QuackVarlenM(rank, ragged) for rank in range(1, TOP_CONFIGS + 1)]


VARIANTS: dict[str, Callable[[], QuackVarlenM]] = {PEER_QUACK: QuackVarlenM,
                                                    PEER_QUACK_WGRAD: lambda: QuackVarlenM(ragged="K")}
VARIANTS.update({name: (lambda rank=rank: QuackVarlenM(rank)) for rank, name in enumerate(PEER_QUACK_TOP, 1)})
VARIANTS.update({name: (lambda rank=rank: QuackVarlenM(rank, "K"))
                 for rank, name in enumerate(PEER_QUACK_WGRAD_TOP, 1)})
