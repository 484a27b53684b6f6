"""``moe_gemm.torch.scaled_grouped_mm`` without a GPU: its rules (what is malformed, what k8 takes and why not),
the CPU path (the dequantized product, rows past offs[-1] untouched), the fake implementation under
torch.compile and torch.library.opcheck, and the quantizers feeding it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from moe_gemm.torch import rules  # noqa: E402


def scaled_operands(**changes) -> rules.ScaledOperands:
    """A valid blockwise call: a [1000, 1024], b [8, 1024, 384] as the view of a contiguous [8, 384, 1024]."""
    base = dict(a_shape=(1000, 1024), a_strides=(1024, 1), a_dtype="float8_e4m3fn", b_shape=(8, 1024, 384),
                b_strides=(384 * 1024, 1, 1024), b_dtype="float8_e4m3fn", scale_a_shape=(8, 1000),
                scale_a_strides=(1000, 1), scale_a_dtype="float32", scale_b_shape=(8, 3, 8),
                scale_b_strides=(24, 8, 1), scale_b_dtype="float32", offs_shape=(8,), offs_dtype="int32")
    return rules.ScaledOperands(**{**base, **changes})


@pytest.fixture
def k8_passed(monkeypatch):
    """The routes as they are once k8 has passed on a GPU (until then every call goes to torch, saying why)."""
    monkeypatch.setattr(rules, "k8_passed_on_gpu", lambda: True)


def test_until_k8_passes_on_a_gpu_every_call_goes_to_torch_saying_why(monkeypatch):
    """What a family not yet run on a GPU gets (Chapter.passed_on_gpu False): torch, with the reason."""
    monkeypatch.setattr(rules, "k8_passed_on_gpu", lambda: False)
    route = rules.route_scaled(scaled_operands())
    assert route.kernel == "torch" and "has not passed its GPU tests" in route.reason


def test_k8_takes_a_well_formed_call_in_both_scalings(k8_passed):
    assert rules.route_scaled(scaled_operands()) == rules.Route("k8", out="bf16")
    # the scales are read by plain loads, 8 bytes at most: a scale tensor starting 8 bytes into an allocation goes
    assert rules.route_scaled(scaled_operands(addresses=(0, 0, 8, 8))) == rules.Route("k8", out="bf16")
    rowwise = scaled_operands(scale_a_shape=(1000,), scale_a_strides=(1,), scale_b_shape=(8, 384),
                              scale_b_strides=(384, 1), out_dtype="float32")
    assert rowwise.scaling == "rowwise" and rules.route_scaled(rowwise) == rules.Route("k8", out="fp32")


@pytest.mark.parametrize("changes, says", [
    ({"a_dtype": "bfloat16"}, "float8_e4m3fn"),
    ({"b_shape": (8, 512, 384)}, "share K"),
    ({"offs_dtype": "int64"}, "int32"),
    ({"offs_shape": (7,)}, r"\[E\] = \[8\]"),
    ({"devices": ("cuda:0", "cuda:0", "cuda:0", "cuda:0", "cpu")}, "one device"),
    ({"out_dtype": "float16"}, "bfloat16 or float32"),
    ({"scale_a_shape": (1000, 8)}, r"scale_a \[8, 1000\]"),
    ({"scale_b_shape": (8, 8, 3)}, r"scale_b \[8, 3, 8\]"),
    ({"scale_a_dtype": "bfloat16"}, "float32"),
])
def test_malformed_calls_are_refused_naming_the_rule(changes, says):
    with pytest.raises(ValueError, match=says):
        rules.route_scaled(scaled_operands(**changes))


@pytest.mark.parametrize("changes, says", [
    ({"devices": ("cpu",) * 5, "capability": None}, "not a CUDA GPU"),
    ({"capability": (10, 0)}, "sm_90a"),
    ({"b_strides": (384 * 1024, 384, 1)}, "K-major"),
    ({"a_strides": (2048, 1)}, "row-major"),
    ({"scale_b_strides": (24, 1, 3)}, "contiguous"),
    ({"a_shape": (1000, 1000), "b_shape": (8, 1000, 384), "b_strides": (384 * 1000, 1, 1000),
      "scale_a_shape": (8, 1000), "scale_b_shape": (8, 3, 8)}, "multiple of 16"),
    ({"addresses": (0, 0, 4, 0)}, "8-byte"),
    ({"addresses": (0, 0, 0, 12)}, "8-byte"),
])
def test_what_k8_cannot_take_goes_to_torch_with_the_reason(changes, says, k8_passed):
    route = rules.route_scaled(scaled_operands(**changes))
    assert route.kernel == "torch" and says in route.reason


def quantized(tokens: int, experts: int, K: int, N: int, seed: int = 0):
    from moe_gemm.torch.quantize import quantize_1x128, quantize_128x128_t

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, K, generator=g).to(torch.bfloat16)
    w = (torch.randn(experts, K, N, generator=g) * K**-0.5).to(torch.bfloat16)
    (qa, sa), (qb, sb) = quantize_1x128(x), quantize_128x128_t(w)
    return x, w, (qa, qb.transpose(1, 2), sa, sb)


def test_the_cpu_path_is_the_dequantized_product_and_leaves_rows_past_the_last_end(monkeypatch):
    from moe_gemm.model.quantize import dequantize
    from moe_gemm.torch import scaled
    from moe_gemm.torch.scaled import scaled_grouped_mm

    monkeypatch.setattr(scaled, "_warned", set())  # one warning per reason and process: an earlier test's may be it

    x, w, args = quantized(300, 3, 256, 200)
    offs = torch.tensor([100, 100, 250], dtype=torch.int32)
    with pytest.warns(UserWarning, match="not a CUDA GPU"):
        out = scaled_grouped_mm(*args, offs, torch.float32)
    qa, b, sa, sb = args
    a_real = dequantize(qa.view(torch.uint8).numpy().view("float8_e4m3fn"), sa[:, :300].t().numpy(), (1, 128))
    for e, (lo, hi) in enumerate([(0, 100), (100, 100), (100, 250)]):
        b_real = dequantize(b[e].contiguous().view(torch.uint8).numpy().view("float8_e4m3fn"), sb[e].t().numpy(),
                            (128, 128))
        want = torch.from_numpy(a_real[lo:hi] @ b_real).float()
        torch.testing.assert_close(out[lo:hi], want, rtol=1e-5, atol=1e-5)
    # and close to the unquantized product: e4m3 keeps 3 mantissa bits
    full = torch.cat([x[:100].float() @ w[0].float(), x[100:250].float() @ w[2].float()])
    assert ((out[:250] - full).norm() / full.norm()).item() < 0.06


def test_the_fake_implementation_traces_under_compile_and_passes_opcheck():
    from moe_gemm.torch.scaled import scaled_grouped_mm

    _, _, args = quantized(64, 2, 128, 128)
    offs = torch.tensor([30, 64], dtype=torch.int32)
    compiled = torch.compile(lambda *a: scaled_grouped_mm(*a), fullgraph=True, backend="eager")
    assert compiled(*args, offs).shape == (64, 128)
    import warnings

    with warnings.catch_warnings():  # (not test_schema: it multiplies e4m3 tensors, which torch cannot)
        warnings.simplefilter("ignore")
        torch.library.opcheck(torch.ops.moe_gemm.scaled_grouped_mm.default, (*args, offs),
                              test_utils=("test_faketensor",))


def test_the_fp8_layer_follows_the_bf16_layer_within_e4m3s_rounding():
    """FP8MoELayer on the CPU path (the op's dequantized product, the quantizers' numpy references): the tokens,
    the weights and SwiGLU's activation each rounded to e4m3 keep the output within 10% of the bf16 layer's
    (6.4% on this seed)."""
    import warnings

    from moe_gemm.torch.fp8_layer import FP8MoELayer
    from moe_gemm.torch.layer import MoELayer

    torch.manual_seed(0)
    layer = MoELayer(256, 128, 8, 2, dtype=torch.bfloat16)
    x = torch.randn(2, 32, 256).to(torch.bfloat16)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # every call says it runs torch (no GPU here)
        want, got = layer(x), FP8MoELayer.from_layer(layer)(x)
    assert got.shape == x.shape and got.dtype == torch.bfloat16
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 0.1
    with pytest.raises(ValueError, match="bf16"):
        FP8MoELayer.from_layer(layer)(x.float())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_fp8_layer_of_an_fp16_or_fp32_layer_is_that_of_its_bf16_copy(dtype):
    """from_layer of a layer in another dtype (transformers builds its blocks in fp32): the router is kept in bf16,
    the tokens' dtype (a copy in the layer's dtype failed in the router's matmul), and the weights are rounded to
    bf16 before they are quantized, so the FP8 layer is exactly the one made from the layer's bf16 copy."""
    import copy
    import warnings

    from moe_gemm.torch.fp8_layer import FP8MoELayer
    from moe_gemm.torch.layer import MoELayer

    torch.manual_seed(0)
    layer = MoELayer(256, 128, 8, 2, dtype=dtype)
    x = torch.randn(2, 32, 256).to(torch.bfloat16)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        got = FP8MoELayer.from_layer(layer)(x)
        want = FP8MoELayer.from_layer(copy.deepcopy(layer).to(torch.bfloat16))(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want)


@pytest.mark.parametrize("hidden, intermediate", [(100, 128), (128, 8)])
def test_the_fp8_layer_names_the_layer_sizes_its_weights_cannot_take(hidden, intermediate):
    from moe_gemm.torch.fp8_layer import FP8MoELayer
    from moe_gemm.torch.layer import MoELayer

    with pytest.raises(ValueError, match=rf"^FP8MoELayer: hidden and intermediate must be multiples of 16 .*, got "
                                         rf"hidden = {hidden}, intermediate = {intermediate}$"):
        FP8MoELayer.from_layer(MoELayer(hidden, intermediate, 4, 2))


def test_the_op_keeps_one_launcher_per_configuration_and_shape(monkeypatch):
    """A launcher holds the tensor maps and packed arguments of each pointer set it has seen (moe_gemm.torch.launches),
    so the op gets the same one back for the same configuration, GPU and shape, and builds none per call."""
    from moe_gemm.torch import scaled

    made = []
    monkeypatch.setattr(scaled, "TensorMapLaunches", lambda *args: made.append(args) or object())
    monkeypatch.setattr(scaled, "_k8", lambda config, out: (config, out))
    for runner, key in ((scaled._runner, ("k8/blockwise-bm128", "bf16", 0, 1000, 8, 1024, 384)),
                        (scaled._swiglu_runner, ("k8/swiglu-e4m3-bm128", 0, 1000, 8, 1024, 512))):
        runner.cache_clear()
        try:
            assert runner(*key) is runner(*key)
        finally:
            runner.cache_clear()
    assert len(made) == 2
