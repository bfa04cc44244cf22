"""The lean decoder: same logits as HF llama on the same weights; KV cache, verify passes, rollback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from decoding import kernels
from decoding.hf_weights import to_hf_llama
from decoding.packing import PackedLinear, can_pack
from tests.conftest import TinyFactory


def test_logits_match_hf_llama_on_the_same_weights(tiny_model: TinyFactory) -> None:
    # float32: HF's RMSNorm computes in float32 whatever the model dtype, so float64 would differ by ~1e-6
    target = tiny_model(vocab_size=50, dtype=torch.float32, seed=2)
    model = target.model
    tokens = torch.tensor([0, 5, 9, 3, 3, 41, 7, 12])
    model.setup_cache(32)
    ours = model(tokens, 0)  # [T, V]
    hf = to_hf_llama(model)
    with torch.no_grad():
        theirs = hf(tokens[None]).logits[0]
    torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-5, atol=1e-5)


def test_incremental_decode_equals_full_forward(tiny_model: TinyFactory) -> None:
    model = tiny_model(vocab_size=50, seed=4).model
    tokens = torch.tensor([0, 5, 9, 3, 3, 41, 7, 12, 19, 2])
    model.setup_cache(32)
    full = model(tokens, 0)  # [T, V]
    model(tokens[:4], 0)
    steps = [model(tokens[i : i + 1], i)[0] for i in range(4, len(tokens))]
    torch.testing.assert_close(torch.stack(steps), full[4:], rtol=1e-10, atol=1e-10)


def test_verify_pass_rows_equal_single_steps_and_rollback_is_free(tiny_model: TinyFactory) -> None:
    model = tiny_model(vocab_size=50, seed=5).model
    prefix = torch.tensor([0, 8, 13, 21])
    model.setup_cache(32)
    model(prefix, 0)
    # a verify pass of 4 tokens at positions 4..7, then a rejection after the first: position 5 on is stale
    rejected = model(torch.tensor([1, 30, 31, 32]), 4)
    # continue with a different token at position 5: the stale keys must not leak into its logits
    after = model(torch.tensor([17]), 5)[0]
    model.setup_cache(64)  # a fresh, larger cache: recompute from scratch
    fresh = model(torch.tensor([0, 8, 13, 21, 1, 17]), 0)
    torch.testing.assert_close(rejected[0], fresh[4], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(after, fresh[5], rtol=1e-10, atol=1e-10)


def test_a_one_token_pass_reads_only_what_its_mask_allows(tiny_model: TinyFactory) -> None:
    # a draft tree's one-row steps pass a mask; a single token without one takes a faster path (grouped
    # query heads), which must not be taken with one
    model = tiny_model(vocab_size=50, seed=7).model
    model.setup_cache(32)
    model(torch.tensor([0, 8, 13, 21, 5]), 0)  # cache slots 0..4
    attn = model.blocks[0].attention
    assert attn.n_heads != attn.n_kv_heads
    x = torch.randn(1, 1, model.args.dim, generator=torch.Generator().manual_seed(0)).to(model.dtype)  # (1, 1, D)
    cos, sin = model.rope_cos[5:6], model.rope_sin[5:6]
    reads = torch.tensor([[True, True, False, True, True, True]])  # slot 2 is not an ancestor
    one = attn(x, cos, sin, 5, reads)  # (1, 1, D)
    # the same query twice in a two-row pass (the general path), both rows reading the same slots
    both = attn(torch.cat([x, x], dim=1), cos.repeat(2, 1), sin.repeat(2, 1), 5,
                torch.cat([reads, torch.tensor([[False]])], dim=1).repeat(2, 1))  # (1, 2, D)
    torch.testing.assert_close(one[0, 0], both[0, 1], rtol=1e-10, atol=1e-10)
    unmasked = attn(x, cos, sin, 5, None)
    assert not torch.allclose(unmasked, one)  # slot 2 matters: the mask is what the two agree on

@pytest.mark.parametrize("kernel", [
    pytest.param(True, marks=pytest.mark.skipif(not kernels.available(), reason="no C compiler for the kernel")),
    False,
], ids=["exact-kernel", "float64"])
@pytest.mark.parametrize("exact_linears", [
    False,
    pytest.param(True, marks=pytest.mark.skipif(not kernels.linear_available(), reason="no AVX512-BF16 here")),
], ids=["torch-linears", "exact-linears"])
def test_a_bf16_model_attends_exactly_over_its_float32_cache_past_the_prompt(
        tiny_model: TinyFactory, monkeypatch: pytest.MonkeyPatch, kernel: bool, exact_linears: bool) -> None:
    # keys and values are kept in float32 (half the memory a long context streams each step); the prompt's
    # own pass attends over them as stored, every later pass through the exact float32 kernel, or in
    # float64 without it: either way a verify pass gives the bits of single steps, with torch's linear
    # layers or the exact ones (decoding/kernels/exact_linear.c)
    model = tiny_model(vocab_size=50, dtype=torch.bfloat16, seed=3).model
    assert model.use_exact_linears() if exact_linears else True
    if not kernel:
        monkeypatch.setattr(kernels, "available", lambda: False)
    model.setup_cache(32)
    cache = model.blocks[0].attention.kv_cache
    assert cache is not None and cache.k.dtype == cache.v.dtype == torch.float32
    assert model.blocks[0].attention.exact_kernel == kernel
    seen: list[tuple[int, torch.dtype]] = []  # (query rows, dtype) of each torch attention call
    attend = F.scaled_dot_product_attention

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> torch.Tensor:
        assert q.dtype == k.dtype == v.dtype
        seen.append((q.shape[2], q.dtype))
        return attend(q, k, v, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    tokens = torch.tensor([0, 5, 9, 3, 3, 41, 7, 12])
    model(tokens[:5], 0)  # the prompt
    assert set(seen) == (set() if kernel else {(5, torch.float32)})  # the kernel reads prompts too
    seen.clear()
    verify = model(tokens[5:], 5)  # (3, V) a verify pass of three rows
    steps = torch.stack([model(tokens[i : i + 1], i)[0] for i in range(5, len(tokens))])  # (3, V)
    assert {dtype for _, dtype in seen} == (set() if kernel else {torch.float64})
    assert torch.equal(verify, steps)  # the same stored values, each row computed alike: the same bits


@pytest.mark.skipif(not kernels.available(), reason="no C compiler for the kernel")
@pytest.mark.parametrize("exact_linears", [
    False,
    pytest.param(True, marks=pytest.mark.skipif(not kernels.linear_available(), reason="no AVX512-BF16 here")),
], ids=["torch-linears", "exact-linears"])
def test_with_the_kernel_a_prompt_read_in_two_passes_gives_the_bits_of_one(tiny_model: TinyFactory,
                                                                           exact_linears: bool) -> None:
    # every row of every pass is computed alike (rotation in float32, attention by the kernel), so a
    # prompt's cache and logits do not depend on how it was cut: what reusing a cached prefix needs
    model = tiny_model(vocab_size=50, dtype=torch.bfloat16, seed=6).model
    assert model.use_exact_linears() if exact_linears else True
    tokens = torch.tensor([0, 5, 9, 3, 3, 41, 7, 12, 19, 2, 33, 8])
    model.setup_cache(32)
    whole = model(tokens, 0)  # (12, V)
    caches = [(b.attention.kv_cache.k[:, :, :12].clone(), b.attention.kv_cache.v[:, :, :12].clone())
              for b in model.blocks]
    model.setup_cache(64)  # a fresh cache
    first = model(tokens[:7], 0)  # (7, V) a cached prefix ...
    rest = model(tokens[7:], 7)  # (5, V) ... and the rest of the prompt after it
    assert torch.equal(torch.cat([first, rest]), whole)
    for block, (k, v) in zip(model.blocks, caches, strict=True):
        assert torch.equal(block.attention.kv_cache.k[:, :, :12], k)
        assert torch.equal(block.attention.kv_cache.v[:, :, :12], v)


def test_context_overflow_is_refused(tiny_model: TinyFactory) -> None:
    model = tiny_model().model
    model.setup_cache(8)
    with pytest.raises(ValueError, match="exceeds the KV cache"):
        model(torch.zeros(9, dtype=torch.long), 0)


@pytest.mark.parametrize("dtype", [
    pytest.param(dtype, marks=pytest.mark.skipif(not can_pack(dtype), reason=f"oneDNN packs no {dtype} on this CPU"))
    for dtype in (torch.float32, torch.bfloat16)
])
@pytest.mark.parametrize("in_features", [64, 576, 1536])
def test_packed_linear_computes_the_same_matmul(dtype: torch.dtype, in_features: int) -> None:
    g = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(in_features, 96, bias=True).to(dtype)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(96, in_features, generator=g) / in_features**0.5)
        linear.bias.copy_(torch.randn(96, generator=g))
    packed = PackedLinear(linear)
    x = torch.randn(1, 12, in_features, generator=g).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    # every row count: one row, the float32 few-row path padded to 4 or to 8 (FEW_ROWS), and past it
    for m in range(1, 13):
        want = F.linear(x[:, :m], linear.weight, linear.bias).float()  # (1, m, 96)
        torch.testing.assert_close(packed(x[:, :m]).float(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(packed(x[0, :3]).float(), F.linear(x[0, :3], linear.weight, linear.bias).float(),
                               rtol=tol, atol=tol)  # (3, in): a 2-D input keeps its shape
    if dtype == torch.bfloat16:
        # bf16 (the CPU default): every row count gives bit-identical rows (a long reduction is split),
        # so the matmuls of a verify pass round exactly as single steps do
        for m in range(2, 10):
            rows = torch.cat([packed(x[:, i : i + 1]) for i in range(min(m, 5))], dim=1)
            assert torch.equal(rows, packed(x[:, : min(m, 5)]))
