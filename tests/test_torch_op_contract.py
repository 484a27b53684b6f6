"""moe_gemm.torch.grouped_mm against torch._grouped_mm's 2D x 3D contract, without a GPU: what the op does
with offs=None, out_dtype=None, fp16, offs that is a view, off a's device or ends before M_tot, b views;
the opt-in check of offs and its switch per thread; the tuning cache under concurrent writers; the
fused SwiGLU GEMM's autograd; and the op's Python overhead per call. The k6 path runs here on CPU
tensors with the device checks and the launch replaced (``stubbed_k6``); the same rows on the GPU are
tests/test_torch_op_gpu.py."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from moe_gemm.torch import ops  # noqa: E402


def problem(counts, K=64, N=48, dtype=torch.bfloat16, seed=0, tokens=None):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(tokens or int(sum(counts)), K, generator=generator).to(dtype)
    b = (torch.randn(len(counts), K, N, generator=generator) * K**-0.5).to(dtype)
    return a, b, torch.tensor(np.cumsum(counts), dtype=torch.int32)


@pytest.fixture
def stubbed_k6(monkeypatch):
    """The op's k6 path on CPU tensors: the rules told the tensors are on an sm_90a GPU, the
    configuration fixed, and each launch recorded (configuration, B's layout, B's strides as the
    tensor map takes them, whether offs is contiguous, the operand and output types) instead of run."""
    from moe_gemm.variants.k6.rules import b_strides_of

    real = ops.operands
    launches = []
    routed = []

    def on_gpu(a, b, offs, out_dtype):
        routed.append(1)
        return dataclasses.replace(real(a, b, offs, out_dtype), a_device="cuda:0", b_device="cuda:0",
                                   offs_device="cuda:0", capability=(9, 0))

    def runner(name, layout, types, a, b):
        return lambda a, b, out, offs: launches.append((name, layout, b_strides_of(b.shape, b.stride()),
                                                        offs.is_contiguous(), types))

    monkeypatch.setattr(ops, "operands", on_gpu)
    monkeypatch.setattr(ops, "_runner", runner)
    monkeypatch.setattr(ops, "_choice", lambda *args: ops.DEFAULT_CONFIG)
    monkeypatch.setattr(ops, "_plans", {})
    return launches, routed


def test_out_dtype_none_is_as_dtype_and_offs_none_is_a_value_error():
    a, b, offs = problem([5, 0, 7])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ops.grouped_mm(a, b, offs).dtype == torch.bfloat16
        assert ops.grouped_mm(a, b, offs, out_dtype=None).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="need offs"):
        ops.grouped_mm(a, b)
    with pytest.raises(RuntimeError, match="Have to provide offsets"):  # torch's own answer, for the record
        torch._grouped_mm(a, b)


@pytest.mark.parametrize("entry", ["grouped_mm", "grouped_mm_swiglu", "weight_grad", "scaled_grouped_mm",
                                   "swiglu_scaled_grouped_mm", "quantize_1x128", "swiglu_quantize_1x128",
                                   "quantize_128x128_t"])
def test_every_public_op_names_the_argument_that_is_not_a_tensor(entry):
    """None, the row ends as a list, a numpy array: a TypeError naming the argument, before anything runs, where
    the op would otherwise fail in an attribute lookup or in torch's dispatcher with its schema."""
    import moe_gemm.torch as public

    a, b, offs = problem([5, 0, 7], K=128, N=128)
    scale = torch.ones(1)
    arguments = {"grouped_mm": (a, b, offs), "grouped_mm_swiglu": (a, b, offs), "weight_grad": (a, a, offs),
                 "scaled_grouped_mm": (a, b, scale, scale, offs),
                 "swiglu_scaled_grouped_mm": (a, b, scale, scale, offs),
                 "quantize_1x128": (a,), "swiglu_quantize_1x128": (a,), "quantize_128x128_t": (b,)}[entry]
    op = getattr(ops, entry) if entry == "grouped_mm_swiglu" else getattr(public, entry)
    for position, wrong in ((len(arguments) - 1, offs.tolist()), (0, None), (0, a.float().numpy())):
        given = list(arguments)
        given[position] = wrong
        with pytest.raises(TypeError, match=rf"^{entry}: \w+ must be a torch.Tensor, got {type(wrong).__name__}$"):
            op(*given)


def test_fp32_operands_run_and_give_torchs_answer_with_the_reason_warned_once():
    a, b, offs = problem([5, 0, 7], dtype=torch.float32)
    ops._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ops.grouped_mm(a, b, offs)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch._grouped_mm(a, b, offs=offs), rtol=0, atol=0)
    assert any("bf16 or fp16 in and the same or fp32 out, got float32 in, float32 out" in str(w.message)
               for w in caught)


@pytest.mark.parametrize("dtype, out_dtype, types", [(torch.float16, None, ("fp16", "fp16")),
                                                     (torch.bfloat16, torch.float32, ("bf16", "fp32")),
                                                     (torch.float16, torch.float32, ("fp16", "fp32"))])
def test_fp16_and_an_fp32_output_run_k6_built_for_them(stubbed_k6, dtype, out_dtype, types):
    launches, _ = stubbed_k6
    a, b, offs = problem([5, 0, 7], dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: k6 runs
        out = ops.grouped_mm(a, b, offs, out_dtype=out_dtype)
    assert out.dtype == (out_dtype or dtype)
    assert launches[-1][4] == types


def test_a_non_contiguous_offs_gives_the_contiguous_answer(stubbed_k6):
    launches, _ = stubbed_k6
    a, b, offs = problem([5, 3, 7])
    strided = torch.stack([offs, torch.zeros_like(offs)], dim=1)[:, 0]  # every other int32: stride 2
    assert not strided.is_contiguous()
    ops.grouped_mm(a, b, strided)
    assert launches[-1][3]  # k6 reads offs[e] at offs + 4e: it gets a contiguous copy


def test_the_fallback_gives_torchs_answer_for_a_strided_offs_and_rows_no_expert_owns():
    a, b, offs = problem([5, 3, 7], tokens=20)  # offs[-1] = 15 < M_tot = 20
    strided = torch.stack([offs, offs], dim=1)[:, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = ops.grouped_mm(a, b, strided)
    torch.testing.assert_close(out[:15], torch._grouped_mm(a, b, offs=offs)[:15], rtol=0, atol=0)


def test_rows_no_expert_owns_are_legal_on_the_k6_path_checked_or_not(stubbed_k6):
    launches, _ = stubbed_k6
    a, b, offs = problem([5, 3, 7], tokens=40)
    assert ops.grouped_mm(a, b, offs).shape == (40, 48)
    with ops.offsets_checked():
        assert ops.grouped_mm(a, b, offs).shape == (40, 48)
    assert len(launches) == 2


def test_offs_on_another_device_than_a_is_a_value_error_in_the_fake_and_the_rules():
    a, b, offs = problem([5, 7])
    with pytest.raises(ValueError, match="b and offs must be on a's device \\(meta\\), got b on meta and offs on cpu"):
        ops._fake(a.to("meta"), b.to("meta"), offs, None, "none")
    with pytest.raises(ValueError, match="offs must be on a's device"):
        ops.grouped_mm(a.to("meta"), b.to("meta"), offs)
    assert ops._fake(a.to("meta"), b.to("meta"), offs.to("meta"), None, "none").shape == (12, 48)


def test_b_views_reach_k6_with_their_strides(stubbed_k6):
    """b[::2] and b[:, :, :N] of a wider tensor, either layout: k6 with the view's strides."""
    launches, _ = stubbed_k6
    a, wide, offs = problem([5, 3, 7, 1], N=192)
    ops.grouped_mm(a, wide[:, :, :128], offs)
    assert launches[-1][:3] == (ops.DEFAULT_CONFIG, "kn", (192, 64 * 192))
    _, eight, _ = problem([1] * 8, N=128)
    ops.grouped_mm(a, eight[::2], offs)
    assert launches[-1][:3] == (ops.DEFAULT_CONFIG, "kn", (128, 2 * 64 * 128))
    k_major = wide.transpose(1, 2).contiguous().transpose(1, 2)[:, :, :128]  # each B[e] column-major, a slice
    ops.grouped_mm(a, k_major, offs)
    assert launches[-1][1:3] == ("nk", (64, 192 * 64))


def test_one_plan_per_key_the_rules_run_once(stubbed_k6):
    launches, routed = stubbed_k6
    a, b, offs = problem([5, 3, 7])
    for _ in range(5):
        ops.grouped_mm(a, b, offs)
    assert len(routed) == 1 and len(launches) == 5
    ops.grouped_mm(a[:9], b, offs)  # another M_tot: another key
    assert len(routed) == 2


def test_the_check_of_offs_is_opt_in_and_per_thread(stubbed_k6):
    launches, _ = stubbed_k6
    a, b, _ = problem([5, 3, 7])
    decreasing = torch.tensor([9, 3, 15], dtype=torch.int32)
    ops.grouped_mm(a, b, decreasing)  # no read-back by default: the kernel's walk clamps it
    with ops.offsets_checked():
        with pytest.raises(ValueError, match="non-decreasing"):
            ops.grouped_mm(a, b, decreasing)
        with ops.offsets_unchecked():  # a timing loop inside: no sync
            ops.grouped_mm(a, b, decreasing)
    assert len(launches) == 2
    seen = {}
    inside, done = threading.Event(), threading.Event()

    def checking_thread():
        with ops.offsets_checked():
            seen["inside"] = ops._check_offsets.get()
            inside.set()
            done.wait(5)

    thread = threading.Thread(target=checking_thread)
    thread.start()
    inside.wait(5)
    seen["other thread"] = ops._check_offsets.get()
    done.set()
    thread.join()
    assert seen == {"inside": True, "other thread": False}


def test_the_environment_turns_the_check_on():
    script = "from moe_gemm.torch import ops; print(ops._check_offsets.get())"
    import os

    env = {**os.environ, ops.CHECK_OFFS: "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def _write_many(path: str, key: str, times: int) -> None:
    from pathlib import Path

    from moe_gemm.variants.k6 import auto

    for i in range(times):
        auto.remember(key, {"choice": f"{key}-{i}"}, Path(path))


def test_two_processes_tuning_at_once_keep_both_entries_and_a_reader_never_sees_a_partial_file(tmp_path):
    path = tmp_path / "k6_auto.json"
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_write_many, args=(str(path), key, 150)) for key in ("one", "two")]
    for writer in writers:
        writer.start()
    reads = 0
    while any(writer.is_alive() for writer in writers):
        if path.is_file():
            json.loads(path.read_text())  # a partial write would raise here
            reads += 1
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    table = json.loads(path.read_text())
    assert table == {"one": {"choice": "one-149"}, "two": {"choice": "two-149"}} and reads > 0
    assert not list(tmp_path.glob("*.tmp"))  # every temporary file renamed into place


def test_the_fused_swiglu_gemms_autograd_matches_fp32_torch():
    a, _, offs = problem([6, 0, 11, 3], K=64)
    w = (torch.randn(4, 64, 256, generator=torch.Generator().manual_seed(7)) * 0.2).to(torch.bfloat16)
    a, w = a.requires_grad_(), w.requires_grad_()
    grad = torch.randn(20, 128, generator=torch.Generator().manual_seed(8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ops.grouped_mm_swiglu(a, w, offs).backward(grad.to(torch.bfloat16))
    a32, w32 = a.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    starts = [0, *offs.tolist()[:-1]]
    h = torch.cat([a32[s:e] @ w32[i] for i, (s, e) in enumerate(zip(starts, offs.tolist()))])
    gate, up = h.chunk(2, dim=-1)
    (torch.nn.functional.silu(gate) * up).backward(grad)
    for ours, want in ((a.grad, a32.grad), (w.grad, w32.grad)):
        assert ((ours.float() - want).norm() / want.norm()).item() < 2e-2
    assert torch.count_nonzero(w.grad[1]) == 0  # the expert with no rows gets no gradient


def test_the_python_overhead_per_call(stubbed_k6, monkeypatch, record_property):
    """Reported, not held to a number (CI machines differ): the op's Python path per eager call with the
    launch replaced, called directly (what a GPU call runs after its dispatch checks) and through torch's
    dispatcher (what a call that records autograd, or runs under a mode, pays on top)."""
    a, b, offs = problem([4, 4, 4, 4], K=64, N=128)
    monkeypatch.setattr(ops, "_runner", lambda name, layout, types, a, b: lambda a, b, out, offs: None)  # no recording

    def per_call_us(call, calls=5000):
        for _ in range(500):
            call()
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                call()
            best = min(best, (time.perf_counter() - start) / calls * 1e6)
        return best

    direct = per_call_us(lambda: ops._run(a, b, offs, torch.bfloat16, "none"))
    dispatched = per_call_us(lambda: ops.grouped_mm(a, b, offs))
    record_property("direct_us", round(direct, 2))
    record_property("dispatched_us", round(dispatched, 2))
    print(f"\nthe op's Python path: {direct:.1f} us a call direct, {dispatched:.1f} us through the dispatcher")
    assert 0 < direct < 1000 and 0 < dispatched < 1000  # (2 shared cores here: their order is not held either)
