"""peer/quack: quack's autotuned varlen-M GEMM as a peer.

Without a GPU and without quack (CI, and most machines): the registry names it, its input rules
refuse before quack is imported or anything launched, a missing quack is a ValueError with the
install hint, and a fake ``quack.gemm_interface`` (with the autotuner's caching behaviour of
quack 0.6.5) shows what the wrapper calls and what ``launch_info`` records. On a GPU with quack
installed, the ``gpu`` tests check it against the numpy
reference on every edge case and on random data, and that it runs on the harness stream.
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
from dataclasses import dataclass

import numpy as np
import pytest

from moe_gemm.cuda.gpu import GpuInfo
from moe_gemm.model.edge_cases import EDGE_CASES
from moe_gemm.model.problem import BF16, make_problem, problem_from_counts
from moe_gemm.variants.peer import quack as qk

H100 = GpuInfo("NVIDIA H100", (9, 0), 132, 13000)


# ---- fakes: a device problem, torch and quack's gemm_interface, all on the host ------------------

class FakeArray:
    def __init__(self, shape, dtype, ptr):
        self.shape, self.dtype, self.ptr = tuple(shape), np.dtype(dtype), ptr
        self.fills = []

    def fill_u16(self, bits):
        self.fills.append(bits)


class FakeDev:
    """What prepare reads of a DeviceProblem, with addresses to break the alignment rule."""

    def __init__(self, problem, a_dtype=BF16, offsets_dtype=np.int32, a_ptr=0x10000, b_ptr=0x20000):
        self.problem = problem
        self.a = FakeArray(problem.a.shape, a_dtype, a_ptr)
        self.b = FakeArray(problem.b.shape, BF16, b_ptr)
        self.offsets = FakeArray((problem.experts + 1,), offsets_dtype, 0x30000)
        self.outputs = []

    def new_output(self):
        out = FakeArray((self.problem.tokens, self.problem.N), BF16, 0x40000)
        self.outputs.append(out)
        return out


class View:
    """A stand-in for the torch tensor over a harness buffer."""

    def __init__(self, array):
        self.array, self.shape = array, array.shape


class FakeTorch:
    def __init__(self):
        self.current = "torch's default stream"
        self.empty_caches = 0
        torch = self

        class Cuda:
            @staticmethod
            @contextlib.contextmanager
            def stream(stream):
                before, torch.current = torch.current, stream
                try:
                    yield
                finally:
                    torch.current = before

            @staticmethod
            def empty_cache():
                torch.empty_caches += 1

            @staticmethod
            def is_available():
                return True

        self.cuda = Cuda


@dataclass(frozen=True)
class GemmConfig:  # the fields of quack's, enough to check what is recorded
    tile_m: int = 128
    tile_n: int = 192
    pingpong: bool = True
    cluster_m: int = 2
    device_capacity: int = 9


class AutotuneConfig:
    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def all_kwargs(self):
        return self.kwargs

    def __hash__(self):
        return hash(tuple(self.kwargs.items()))

    def __eq__(self, other):
        return tuple(self.kwargs.items()) == tuple(other.kwargs.items())


class FakeTuner:
    """quack.autotuner.Autotuner's caching as 0.6.5 has it: a miss measures every configuration
    (or reads the disk cache: bench_time 0) and replaces configs_timings; a hit changes neither."""

    def __init__(self, torch, ms=(0.50, 0.40, 0.41, float("inf"), 0.45), disk=False):
        self.torch, self.disk = torch, disk
        self.configs = [AutotuneConfig(config=GemmConfig(tile_n=n)) for n in (128, 160, 192, 208, 256)][:len(ms)]
        self.ms = ms
        self.cache, self.benches, self.fn_calls = {}, 0, []

    def __call__(self, A, B, out, **kwargs):  # noqa: N803
        key = (A.shape, B.shape, out.shape, kwargs["cu_seqlens_m"].shape)
        if key not in self.cache:
            timings = {config: [ms] * 3 for config, ms in zip(self.configs, self.ms)}
            self.bench_time = 0 if self.disk else 12.5
            self.benches += 0 if self.disk else 1
            self.cache[key] = min(timings, key=timings.get)
            self.configs_timings = timings
        self.best_config = self.cache[key]
        return self.fn(A, B, out, **kwargs, **self.best_config.all_kwargs())

    def fn(self, A, B, out, config=None, **kwargs):  # noqa: N803
        self.fn_calls.append({"A": A, "B": B, "out": out, "config": config, "stream": self.torch.current, **kwargs})
        return config, 1, False, None


def install_fake_quack(monkeypatch, torch, **tuner_args):
    """A fake quack.gemm_interface in sys.modules, and the GPU, torch and stream it needs."""
    iface = types.ModuleType("quack.gemm_interface")
    iface.gemm_tuned = FakeTuner(torch, **tuner_args)
    iface.gemm_calls = []

    def gemm(A, B, out=None, cu_seqlens_m=None, tuned=True, **kwargs):  # noqa: N803
        iface.gemm_calls.append({"A": A, "B": B, "out": out, "cu_seqlens_m": cu_seqlens_m, "tuned": tuned,
                                 "stream": torch.current, **kwargs})
        iface.gemm_tuned(A, B, out, C=None, cu_seqlens_m=cu_seqlens_m, dynamic_scheduler=False, split_k=1)
        return out

    iface.gemm = gemm
    package = types.ModuleType("quack")
    package.__version__ = "0.6.5"
    package.gemm_interface = iface
    monkeypatch.setitem(sys.modules, "quack", package)
    monkeypatch.setitem(sys.modules, "quack.gemm_interface", iface)
    monkeypatch.setattr(qk, "detect_gpu", lambda: H100)
    monkeypatch.setattr(qk, "_torch", lambda variant: torch)
    monkeypatch.setattr(qk, "torch_view", View)
    monkeypatch.setattr(qk, "torch_stream", lambda: "the harness stream")
    monkeypatch.setattr(qk, "synchronize", lambda: None)
    monkeypatch.setattr(qk, "_TUNINGS", {})
    return iface


def no_quack(monkeypatch):
    """quack absent, whatever this machine has: importing it raises ImportError."""
    monkeypatch.setitem(sys.modules, "quack", None)
    monkeypatch.setitem(sys.modules, "quack.gemm_interface", None)


def small_problem(counts=(3, 0, 5), K=16, N=24):
    return problem_from_counts(np.array(counts), K, N, values="integer", seed=0)


# ---- the registry --------------------------------------------------------------------------------

def test_registry_resolves_the_quack_peers():
    from moe_gemm.variants import registry

    peer = registry.get("peer/quack")
    assert isinstance(peer, qk.QuackVarlenM) and peer.name == "peer/quack" and peer.rank is None
    for rank, name in enumerate(qk.PEER_QUACK_TOP, 1):
        assert registry.get(name).name == name and registry.get(name).rank == rank
    assert qk.QUACK_PEERS == ("peer/quack", "peer/quack-top1", "peer/quack-top2", "peer/quack-top3")
    assert set(qk.QUACK_PEERS) <= set(registry.names("peer"))
    assert "peer/torch_grouped_mm" in registry.names("peer")  # the torch peers are still there
    with pytest.raises(ValueError):
        qk.QuackVarlenM(4)


# ---- without quack ------------------------------------------------------------------------------

def test_quack_available_gives_a_reason_here():
    from moe_gemm.cuda.gpu import detect_gpu

    reason = qk.quack_available()
    if detect_gpu() is None:
        assert reason == "peer/quack needs an NVIDIA GPU and none was found"
        assert qk.quack_peers() == []


def test_quack_available_without_quack_says_how_to_install(monkeypatch):
    no_quack(monkeypatch)
    monkeypatch.setattr(qk, "detect_gpu", lambda: H100)
    reason = qk.quack_available()
    assert reason is not None and "pip install -e '.[peers]'" in reason and "quack-kernels[cu13] 0.6.5" in reason
    assert qk.quack_peers() == []


def test_prepare_without_quack_raises_the_install_hint_before_any_launch(monkeypatch):
    no_quack(monkeypatch)
    monkeypatch.setattr(qk, "detect_gpu", lambda: H100)
    dev = FakeDev(small_problem())
    for name in qk.QUACK_PEERS:
        with pytest.raises(ValueError, match=r"needs quack-kernels 0\.6\.5 \(pip install -e '\.\[peers\]'"):
            qk.QuackVarlenM(None if name == "peer/quack" else int(name[-1])).prepare(dev)
    assert dev.outputs == []  # not even an output allocated


def test_broken_quack_install_is_a_value_error(monkeypatch):
    iface = types.ModuleType("quack.gemm_interface")  # imports, but without the 0.6.5 API
    monkeypatch.setitem(sys.modules, "quack.gemm_interface", iface)
    with pytest.raises(ValueError, match="follows quack 0.6.5's gemm_interface"):
        qk._quack("peer/quack")


# ---- quack's rules, before quack is imported -----------------------------------------------------

@pytest.mark.parametrize(("experts", "K", "N", "addresses", "match"), [
    (4, 36, 64, None, "multiples of 8"),
    (4, 64, 100, None, "multiples of 8"),
    (0, 64, 64, None, "at least one expert"),
    (4, 64, 64, {"A": 8}, "A to start on a 16-byte boundary"),
    (4, 64, 64, {"C": 0x1002}, "C to start on a 16-byte boundary"),
])
def test_quack_rules(experts, K, N, addresses, match):
    with pytest.raises(ValueError, match=match):
        qk.check_quack_inputs(experts, K, N, addresses)
    qk.check_quack_inputs(64, 1024, 2688, {"A": 256, "B": 512, "C": 4096})


def _refuse_gpu_and_quack(monkeypatch):
    """Fail the test if prepare gets as far as the GPU or quack."""
    def forbidden(*_):
        raise AssertionError("prepare looked for the GPU or quack before checking the inputs")

    monkeypatch.setattr(qk, "detect_gpu", forbidden)
    monkeypatch.setattr(qk, "_quack", forbidden)


@pytest.mark.parametrize(("make_dev", "match"), [
    (lambda: FakeDev(small_problem(K=36)), "multiples of 8"),
    (lambda: FakeDev(small_problem(N=20)), "multiples of 8"),
    (lambda: FakeDev(small_problem(), a_dtype=np.float32), r"A as bf16 \[8, 16\], got float32"),
    (lambda: FakeDev(small_problem(), offsets_dtype=np.int64), r"cu_seqlens_m\) as int32 \[4\], got int64"),
    (lambda: FakeDev(small_problem(), b_ptr=0x20008), "B to start on a 16-byte boundary"),
])
def test_bad_inputs_are_refused_before_quack_or_the_gpu(monkeypatch, make_dev, match):
    _refuse_gpu_and_quack(monkeypatch)
    dev = make_dev()
    with pytest.raises(ValueError, match=match):
        qk.QuackVarlenM().prepare(dev)
    assert dev.outputs == []


@pytest.mark.parametrize(("gpu", "match"), [
    (None, "needs an NVIDIA GPU"),
    (GpuInfo("NVIDIA A100", (8, 0), 108, 13000), "needs an sm_90 or sm_100 GPU.*A100 is sm_80"),
    (GpuInfo("NVIDIA RTX 5090", (12, 0), 170, 13000), "is sm_120"),
])
def test_gpu_rule(monkeypatch, gpu, match):
    monkeypatch.setattr(qk, "detect_gpu", lambda: gpu)
    monkeypatch.setattr(qk, "_quack", lambda *_: pytest.fail("quack imported on a GPU it cannot run on"))
    with pytest.raises(ValueError, match=match):
        qk.QuackVarlenM().prepare(FakeDev(small_problem()))
    assert qk.quack_available() is not None


@pytest.mark.parametrize("gpu", [H100, GpuInfo("NVIDIA B200", (10, 0), 148, 13000)])
def test_sm90_and_sm100_pass_the_gpu_rule(monkeypatch, gpu):
    monkeypatch.setattr(qk, "detect_gpu", lambda: gpu)
    qk.require_quack_gpu("peer/quack")


# ---- the call, with a fake quack -----------------------------------------------------------------

def test_prepare_tunes_once_on_the_harness_stream_and_records_it(monkeypatch):
    torch = FakeTorch()
    iface = install_fake_quack(monkeypatch, torch)
    dev = FakeDev(small_problem())
    prepared = qk.QuackVarlenM().prepare(dev)

    (call,) = iface.gemm_calls  # the tuned call prepare made itself, before any timing
    assert call["A"].array is dev.a and call["B"].array is dev.b  # views of the harness buffers
    assert call["out"].array is prepared.output is dev.outputs[0]  # written in place, the poisoned C
    assert call["cu_seqlens_m"].array is dev.offsets and call["tuned"] is True
    assert call["stream"] == "the harness stream"
    assert iface.gemm_tuned.benches == 1 and torch.empty_caches == 1

    info = prepared.launch_info
    assert info["tuning"] == "autotuned" and info["tune_s"] >= 0 and info["prepare_s"] >= 0
    assert info["config"] == {"tile_m": 128, "tile_n": 160, "pingpong": True, "cluster_m": 2, "device_capacity": 9}
    assert [t["ms"] for t in info["config_timings"]] == [0.40, 0.41, 0.45]  # fastest three, the failed one out
    assert [t["config"]["tile_n"] for t in info["config_timings"]] == [160, 192, 256]
    assert info["configs_timed"] == 4 and info["quack_version"] in ("0.6.5", qk.quack_version())
    json.dumps(info)  # goes into the results file as it is

    prepared.launch()
    assert len(iface.gemm_calls) == 2 and iface.gemm_calls[1]["stream"] == "the harness stream"
    assert iface.gemm_tuned.benches == 1  # launching does not tune again


def test_second_prepare_at_the_same_shape_does_not_tune_again(monkeypatch):
    torch = FakeTorch()
    iface = install_fake_quack(monkeypatch, torch)
    first = qk.QuackVarlenM().prepare(FakeDev(small_problem())).launch_info
    second = qk.QuackVarlenM().prepare(FakeDev(small_problem(counts=(8, 0, 0)))).launch_info  # same shape
    assert iface.gemm_tuned.benches == 1 and torch.empty_caches == 1
    assert second["tuning"] == "autotuned" and second["tune_s"] == first["tune_s"]  # this shape's tuning
    assert second["config"] == first["config"] and second["config_timings"] == first["config_timings"]
    assert second["tune_skew"] != second["tune_skew"]  # tuned on the first problem (skew nan: from counts)

    qk.QuackVarlenM().prepare(FakeDev(small_problem(counts=(8, 1, 0))))  # a new M_tot: a new tuning
    assert iface.gemm_tuned.benches == 2


def test_tuning_read_from_quacks_disk_cache_is_told_apart(monkeypatch):
    install_fake_quack(monkeypatch, FakeTorch(), disk=True)
    info = qk.QuackVarlenM().prepare(FakeDev(small_problem())).launch_info
    assert info["tuning"] == "quack disk cache" and len(info["config_timings"]) == 3


def test_top_configs_run_the_kth_fastest_through_the_tuned_function(monkeypatch):
    torch = FakeTorch()
    iface = install_fake_quack(monkeypatch, torch)
    dev = FakeDev(small_problem())
    prepared = qk.QuackVarlenM(2).prepare(dev)
    info = prepared.launch_info
    assert info["config_rank"] == 2 and info["config_tuner_ms"] == 0.41 and info["config"]["tile_n"] == 192
    tuner = iface.gemm_tuned
    # prepare: the tuned call (the autotuner's pick runs through fn), then one warm call of rank 2
    assert [c["config"].tile_n for c in tuner.fn_calls] == [160, 192]
    prepared.launch()
    call = tuner.fn_calls[-1]
    assert call["config"] == GemmConfig(tile_n=192) and call["stream"] == "the harness stream"
    assert call["A"].array is dev.a and call["B"].array is dev.b and call["out"].array is prepared.output
    assert call["cu_seqlens_m"].array is dev.offsets
    assert len(iface.gemm_calls) == 1 and tuner.benches == 1

    top1 = qk.QuackVarlenM(1).prepare(FakeDev(small_problem())).launch_info
    assert top1["config"] == qk.QuackVarlenM().prepare(FakeDev(small_problem())).launch_info["config"]


def test_top_config_past_what_the_tuner_timed_is_refused(monkeypatch):
    install_fake_quack(monkeypatch, FakeTorch(), ms=(0.5, float("inf"), 0.4))
    assert qk.QuackVarlenM(2).prepare(FakeDev(small_problem())).launch_info["config_rank"] == 2
    with pytest.raises(ValueError, match="timed 2 configurations at this shape .*no rank 3"):
        qk.QuackVarlenM(3).prepare(FakeDev(small_problem()))


def test_a_tuning_quack_made_before_the_harness_asked_has_no_timings(monkeypatch):
    torch = FakeTorch()
    iface = install_fake_quack(monkeypatch, torch)
    dev = FakeDev(small_problem())
    iface.gemm(View(dev.a), View(dev.b), out=View(dev.new_output()), cu_seqlens_m=View(dev.offsets))  # a user's call
    info = qk.QuackVarlenM().prepare(dev).launch_info
    assert info["tuning"] == "cached by quack before this harness asked" and info["config_timings"] == []
    assert info["config"]["tile_n"] == 160  # the choice is still known: best_config
    with pytest.raises(ValueError, match="no rank 1"):
        qk.QuackVarlenM(1).prepare(dev)


def test_no_rows_neither_tunes_nor_launches(monkeypatch):
    iface = install_fake_quack(monkeypatch, FakeTorch())
    for variant in (qk.QuackVarlenM(), qk.QuackVarlenM(3)):
        prepared = variant.prepare(FakeDev(small_problem(counts=(0, 0, 0))))
        prepared.launch()
        assert prepared.output.shape == (0, 24)
        assert prepared.launch_info["tune_s"] == 0.0 and prepared.launch_info["config"] is None
    assert iface.gemm_calls == [] and iface.gemm_tuned.fn_calls == []


def test_config_json():
    assert qk.config_json(AutotuneConfig(config=GemmConfig())) == {
        "tile_m": 128, "tile_n": 192, "pingpong": True, "cluster_m": 2, "device_capacity": 9}
    assert qk.config_json(GemmConfig(tile_m=256))["tile_m"] == 256
    assert qk.config_json("tile 128x192") == "tile 128x192" and qk.config_json(None) is None


# ---- on the GPU, with quack installed ------------------------------------------------------------

@pytest.fixture(scope="module")
def quack_peer():
    reason = qk.quack_available()
    if reason is not None:
        pytest.skip(f"quack cannot run here: {reason}")
    return qk.QuackVarlenM()


@pytest.mark.gpu
@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: c.name)
def test_gpu_edge_cases_exact(quack_peer, case):
    from moe_gemm.measure.check import verify

    problem = case.exact_problem(seed=3)
    check = verify(quack_peer, problem, exact=True)
    assert check.passed, f"peer/quack on '{case.name}': {check.describe()}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: c.name)
def test_gpu_edge_cases_random(quack_peer, case):
    from moe_gemm.measure.check import verify

    problem = problem_from_counts(case.counts_array(), case.K, case.N, values="random", seed=4)
    check = verify(quack_peer, problem)
    assert check.passed, f"peer/quack on '{case.name}': {check.describe()}"


@pytest.mark.gpu
@pytest.mark.parametrize(("experts", "tokens", "K", "N", "skew"), [
    (64, 2048, 1024, 2688, 0.0),  # the seed's shape at its small batch
    (64, 2048, 1024, 2688, 1.2),  # skewed, same shape: quack's tuning is reused
    (8, 1000, 256, 200, 0.8),    # N with a partial last tile
])
def test_gpu_random_data(quack_peer, experts, tokens, K, N, skew):
    from moe_gemm.measure.check import verify

    check = verify(quack_peer, make_problem(experts, tokens, K, N, skew, seed=11))
    assert check.passed, f"peer/quack: {check.describe()}"


@pytest.mark.gpu
def test_gpu_top_configs_are_right_and_distinct(quack_peer):
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.measure.check import verify

    dev = DeviceProblem(make_problem(8, 1000, 256, 200, 0.8, seed=12))
    picked = quack_peer.prepare(dev).launch_info
    infos = []
    for rank in range(1, qk.TOP_CONFIGS + 1):
        variant = qk.QuackVarlenM(rank)
        check = verify(variant, dev)
        assert check.passed, f"{variant.name}: {check.describe()}"
        infos.append(variant.prepare(dev).launch_info)
    assert infos[0]["config"] == picked["config"] == picked["config_timings"][0]["config"]
    assert len({json.dumps(i["config"], sort_keys=True) for i in infos}) == qk.TOP_CONFIGS
    ms = [i["config_tuner_ms"] for i in infos]
    assert ms == sorted(ms) and ms == [t["ms"] for t in picked["config_timings"]]


@pytest.mark.gpu
def test_gpu_second_prepare_does_not_tune_again(quack_peer):
    from moe_gemm.cuda.device import DeviceProblem

    problem = make_problem(16, 3000, 512, 512, 0.5, seed=13)  # a shape no other test tunes
    first = quack_peer.prepare(DeviceProblem(problem)).launch_info
    second = quack_peer.prepare(DeviceProblem(problem)).launch_info
    assert first["tuning"] in ("autotuned", "quack disk cache")
    assert second["tune_s"] == first["tune_s"] and second["config"] == first["config"]
    assert second["prepare_s"] < 1.0, second  # one cached call and a synchronize, no autotune
    json.dumps(second)


@pytest.mark.gpu
def test_gpu_launches_are_timed_on_the_harness_stream(quack_peer):
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.cuda.timing import time_launches

    # 0.55 TFLOP: over 0.55 ms at any H200 or B200 rate. Launched on another stream, the harness's events
    # would bracket only the host's time in quack's Python (tens of microseconds).
    prepared = quack_peer.prepare(DeviceProblem(make_problem(8, 16384, 4096, 4096, 0.0, seed=14)))
    median = time_launches(lambda _: prepared.launch(), warmup=3, iterations=10).median_ms
    tuner_ms = prepared.launch_info["config_timings"][0]["ms"]
    assert median > 0.4 and median > 0.5 * tuner_ms, (median, prepared.launch_info)


@pytest.mark.gpu
def test_gpu_refuses_k_not_a_multiple_of_8(quack_peer):
    from moe_gemm.cuda.device import DeviceProblem

    dev = DeviceProblem(problem_from_counts(np.array([10, 20]), 36, 64, values="integer", seed=0))
    with pytest.raises(ValueError, match="multiples of 8"):
        quack_peer.prepare(dev)


@pytest.mark.gpu
def test_gpu_no_rows_prepares_without_tuning(quack_peer):
    from moe_gemm.cuda.device import DeviceProblem

    prepared = quack_peer.prepare(DeviceProblem(problem_from_counts(np.array([0, 0, 0]), 128, 200, seed=0)))
    assert prepared.launch_info["tuning"].startswith("none") and prepared.launch_info["tune_s"] == 0.0
