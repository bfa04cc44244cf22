"""The exact bf16 linear kernel (decoding/kernels/exact_linear.c): the matmul, within float32's own
rounding bound, and every row the same bits in any pass, on any number of threads."""

from __future__ import annotations

import pytest
import torch

from decoding import kernels
from decoding.packing import ExactLinear
from tests.conftest import TinyFactory

pytestmark = pytest.mark.skipif(not kernels.linear_available(), reason="needs the kernel and AVX512-BF16")


def make(n: int, k: int, seed: int, bias: bool = True) -> tuple[torch.nn.Linear, torch.Generator]:
    g = torch.Generator().manual_seed(seed)
    linear = torch.nn.Linear(k, n, bias=bias).to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=g) / k**0.5)
        if bias:
            linear.bias.copy_(torch.randn(n, generator=g))
    return linear, g


@pytest.mark.parametrize(("n", "k"), [(200, 96), (64, 576), (576, 1536), (17, 2)])
def test_it_is_the_matmul_within_float32_rounding(n: int, k: int) -> None:
    linear, g = make(n, k, seed=n + k)
    x = torch.randn(7, k, generator=g).to(torch.bfloat16)  # (7, K)
    got = ExactLinear(linear)(x)  # (7, N) float32
    assert got.dtype == torch.float32 and got.shape == (7, n)
    # bf16 products are exact in float32; K float32 additions each round by at most 2^-24 of the
    # running sum, bounded by the sum of |products| (and the bias's own addition)
    xd, wd, bd = x.double(), linear.weight.double(), linear.bias.double()
    want = xd @ wd.T + bd  # (7, N)
    bound = (k + 1) * 2.0**-24 * (xd.abs() @ wd.abs().T + bd.abs())
    assert bool(((got.double() - want).abs() <= bound).all())


@pytest.mark.parametrize("threads", [1, 2])
def test_every_row_is_the_same_bits_in_any_pass(threads: int) -> None:
    # a verify pass of k rows stands for k single steps, and a prompt read in one pass for the same
    # prompt read in several: each row must not depend on the rows beside it or on the thread split
    linear, g = make(200, 576, seed=1)
    exact = ExactLinear(linear)
    x = torch.randn(300, 576, generator=g).to(torch.bfloat16)  # (300, K)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = exact(x)  # (300, N)
        for t in (*range(1, 15), 25, 37):  # every tile of up to 12 rows, and passes split into 2 or 3 tiles
            assert torch.equal(exact(x[:t]), whole[:t])
        assert torch.equal(torch.cat([exact(x[i : i + 1]) for i in range(20)]), whole[:20])
        assert torch.equal(exact(x[7:130]), whole[7:130])  # rows at other places in the tiles
        assert torch.equal(exact(x.view(3, 100, 576)), whole.view(3, 100, 200))  # any leading shape
    finally:
        torch.set_num_threads(before)


def test_float32_input_is_rounded_as_a_cast_rounds_it() -> None:
    linear, g = make(64, 64, seed=2, bias=False)
    exact = ExactLinear(linear)
    x = torch.randn(9, 64, generator=g)  # (9, K) float32
    # halfway between two bf16 values (ties go to even), and the values around them
    halfway = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(2.0 + 2.0**-7), 1.0 + 2.0**-8 + 2.0**-20])
    x[0, :4] = halfway
    assert torch.equal(exact(x), exact(x.to(torch.bfloat16)))
    assert exact(x[:0]).shape == exact(x[:0].to(torch.bfloat16)).shape == (0, 64)  # an empty pass is no error
    assert not torch.equal(exact(x), exact(x.to(torch.bfloat16).float() + 2.0**-12))  # rounding matters here


def test_a_float32_subnormal_is_rounded_as_a_cast_rounds_it() -> None:
    # the largest subnormal rounds up to the least normal bf16, which the products use: the CPU's own
    # conversion (vcvtneps2bf16) took it for 0 (a review)
    linear = torch.nn.Linear(32, 32, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.fill_(4.0)  # (so the product, 4.7e-38, is normal: products below are flushed to 0)
    x = torch.zeros(1, 32)
    x[0, 0] = torch.tensor(0x007FFFFF, dtype=torch.int32).view(torch.float32)
    exact = ExactLinear(linear)
    assert exact(x)[0, 0].item() == exact(x.to(torch.bfloat16))[0, 0].item() == 4 * 2.0**-126


def test_the_embedded_layers_round_trip_their_weights() -> None:
    # the module keeps the weight it was built from (state_dict, the LM head's rows the draft head reads)
    linear, _ = make(96, 64, seed=3)
    exact = ExactLinear(linear)
    assert exact.weight is linear.weight and exact.bias is linear.bias
    assert set(exact.state_dict()) == {"weight", "bias"}


@pytest.mark.parametrize("threads", [1, 2])
def test_the_norm_before_them_is_rmsnorm_and_the_same_bits_in_any_pass(threads: int) -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(130, 576, generator=g) * 3  # (T, D) a residual stream
    weight = torch.rand(576, generator=g) + 0.5  # (D,)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = kernels.exact_rms_norm(x, weight, 1e-5)  # (T, D) bf16
        assert whole.dtype == torch.bfloat16 and whole.shape == x.shape
        for t in (1, 2, 7, 64, 65):  # the kernel splits rows across threads from 64 rows
            assert torch.equal(kernels.exact_rms_norm(x[:t], weight, 1e-5), whole[:t])
        assert torch.equal(kernels.exact_rms_norm(x[5:9], weight, 1e-5), whole[5:9])
    finally:
        torch.set_num_threads(before)
    # torch's RMSNorm then its cast, to within one bf16 rounding (2^-8 relative) either way
    want = torch.nn.functional.rms_norm(x, (576,), weight, 1e-5)  # (T, D) float32
    assert bool(((whole.float() - want).abs() <= 2.0**-8 * want.abs() + 1e-30).all())
    assert (whole == want.to(torch.bfloat16)).float().mean() > 0.99  # nearly always the same bf16 value


@pytest.mark.parametrize("threads", [1, 2])
def test_the_swiglu_product_between_them_is_silu_times_up_and_the_same_bits_in_any_pass(threads: int) -> None:
    g = torch.Generator().manual_seed(5)
    inter = 37  # not a multiple of the kernel's 16 lanes: the last vector of a row is partial
    gate_up = torch.randn(70, 2 * inter, generator=g) * 4  # (T, 2I) float32: gate, then up
    gate_up[0, :3] = torch.tensor([-100.0, 100.0, 0.0])  # past exp's range both ways, and zero
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = kernels.exact_silu_mul(gate_up)  # (T, I) bf16
        assert whole.dtype == torch.bfloat16 and whole.shape == (70, inter)
        for t in (1, 3, 64, 65):  # the kernel splits rows across threads from 64 rows
            assert torch.equal(kernels.exact_silu_mul(gate_up[:t]), whole[:t])
        assert torch.equal(kernels.exact_silu_mul(gate_up[9:12]), whole[9:12])
    finally:
        torch.set_num_threads(before)
    gate, up = gate_up.double().split(inter, dim=-1)
    want = torch.nn.functional.silu(gate) * up  # (T, I) float64
    # within one bf16 rounding (2^-8 relative) of the exact product, plus the float32 steps (~2^-20)
    assert bool(((whole.double() - want).abs() <= (2.0**-8 + 2.0**-20) * want.abs() + 1e-30).all())


@pytest.mark.parametrize("kind", ["prompt", "step", "verify"])
def test_a_layer_in_one_call_gives_the_bits_of_its_kernels_called_one_by_one(
        tiny_model: TinyFactory, kind: str) -> None:
    model = tiny_model(vocab_size=50, dtype=torch.bfloat16, seed=8).model
    assert model.use_exact_linears()
    model.setup_cache(32)
    model(torch.tensor([0, 5, 9, 3, 3, 41]), 0)  # slots 0..5
    block = model.blocks[1]
    w, attention, cache = block.exact_weights, block.attention, block.attention.kv_cache
    assert w is not None and cache is not None and attention.exact_kernel
    t, start = {"prompt": (6, 0), "step": (1, 6), "verify": (4, 6)}[kind]
    causal = torch.arange(start + t).unsqueeze(0) <= torch.arange(start, start + t).unsqueeze(1)  # (T, start + T)
    mask = causal if kind == "verify" else None
    x = torch.randn(1, t, model.args.dim, generator=torch.Generator().manual_seed(t))  # (1, T, D) residual stream
    cos, sin = model.rope_cos[start : start + t], model.rope_sin[start : start + t]
    keys, values = cache.k_storage.clone(), cache.v.clone()
    # one call at a time, in the order exact_layer.c makes them
    h = x + attention.wo(kernels.attend_step(attention.wqkv(kernels.exact_rms_norm(x, w.norm1, w.eps)),
                                             w.n_heads, w.n_kv_heads, cos, sin, keys, values, start, mask,
                                             causal=kind == "prompt"))
    ffn = block.feed_forward
    want = h + ffn.w2(kernels.exact_silu_mul(ffn.w13(kernels.exact_rms_norm(h, w.norm2, w.eps))))
    got = kernels.exact_layer(x, w, cos, sin, cache.k_storage, cache.v, start, mask, causal=kind == "prompt")
    assert torch.equal(got, want)
    assert torch.equal(cache.k_storage, keys) and torch.equal(cache.v, values)  # the same cache written


def test_every_layer_in_one_call_gives_the_bits_of_the_layers_called_one_by_one(
        tiny_model: TinyFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    def passes(model: torch.nn.Module) -> list[torch.Tensor]:
        model.setup_cache(8)
        out = [*model.forward_hidden(torch.tensor([0, 5, 9, 3, 3, 41]), 0)]  # a prompt
        out += [*model.forward_hidden(torch.tensor([7]), 6)]  # a step
        model.setup_cache(32)  # grown: new caches holding the old, so a new table
        out += [*model.forward_hidden(torch.tensor([2, 8, 8, 1]), 7)]  # a verify pass (its causal mask)
        return [*out, *(t for block in model.blocks for t in (block.attention.kv_cache.k_storage,
                                                             block.attention.kv_cache.v))]

    one = tiny_model(vocab_size=50, dtype=torch.bfloat16, seed=8).model
    assert one.use_exact_linears()
    calls: list[int] = []  # rows of each exact_layers call
    inner = kernels.exact_layers
    monkeypatch.setattr(kernels, "exact_layers", lambda x, *a, **k: calls.append(x.shape[1]) or inner(x, *a, **k))
    together = passes(one)
    assert calls == [6, 1, 4]  # every pass was one call
    apart = tiny_model(vocab_size=50, dtype=torch.bfloat16, seed=8).model
    assert apart.use_exact_linears()
    monkeypatch.setattr(type(apart), "layer_table", lambda self: None)  # layer by layer
    separate = passes(apart)
    assert calls == [6, 1, 4]
    assert all(torch.equal(a, b) for a, b in zip(together, separate, strict=True))
