"""The exact float32 attention kernel: a verify pass's rows, a draft tree's rows and single steps agree bit
for bit; the values are attention's (float64 reference); without a compiler the model falls back."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from decoding import kernels
from decoding.model import ModelArgs, apply_rope, rope_tables

needs_kernel = pytest.mark.skipif(not kernels.available(), reason="no C compiler to build the kernel")


def caches(nkv: int, size: int, hd: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, nkv, size, hd, generator=g) * 2  # (1, nkv, S, hd) as the model's cache
    v = torch.randn(1, nkv, size, hd, generator=g)
    return k, v


@needs_kernel
@pytest.mark.parametrize(("nh", "nkv", "hd"), [(9, 3, 64), (4, 4, 48), (8, 2, 80)])
@pytest.mark.parametrize(("start", "t"), [(0, 1), (3, 2), (40, 9), (517, 20)])
def test_a_verify_pass_gives_each_row_the_bits_of_its_single_step(nh: int, nkv: int, hd: int, start: int,
                                                                  t: int) -> None:
    # 20 rows of 8 / 2 grouped heads span several vectors of 16 rows; 3 keys are fewer than one block of 8
    k, v = caches(nkv, 600, hd, seed=start + t)
    q = torch.randn(1, nh, t, hd, generator=torch.Generator().manual_seed(1)) * 2  # (1, nh, T, hd)
    end = start + t
    causal = torch.arange(end).unsqueeze(0) <= torch.arange(start, end).unsqueeze(1)  # (T, end)
    verify = kernels.exact_attention(q, k, v, end, causal)  # (1, nh, T, hd)
    for i in range(t):
        step = kernels.exact_attention(q[:, :, i : i + 1], k, v, start + i + 1)  # (1, nh, 1, hd)
        assert torch.equal(step[:, :, 0], verify[:, :, i]), f"row {i}"


@needs_kernel
def test_a_tree_row_reads_its_ancestors_as_the_sequential_step_reads_them() -> None:
    # a tree pass at slots 30..35: root, two children (31, 32), a grandchild under 32 (33), and two more
    # nodes; the grandchild reads the context, the root, 32 and itself. Accepted, those keys move to
    # positions 31, 32 and a single step reads them there, in the same order, with no masked keys between.
    nh, nkv, hd, start = 6, 2, 64, 30
    k, v = caches(nkv, 64, hd, seed=9)
    q = torch.randn(1, nh, 6, hd, generator=torch.Generator().manual_seed(2))  # (1, nh, 6, hd)
    parents = [-1, 0, 0, 2, 1, 3]
    mask = torch.zeros(6, start + 6, dtype=torch.bool)  # (6, 36)
    mask[:, :start] = True
    for node, parent in enumerate(parents):
        mask[node, start + node] = True
        while parent >= 0:
            mask[node, start + parent] = True
            parent = parents[parent]
    tree = kernels.exact_attention(q, k, v, start + 6, mask)  # (1, nh, 6, hd)
    path = [0, 2, 3]  # root -> 32 -> 33, compacted to positions 30, 31, 32
    k_seq, v_seq = k.clone(), v.clone()
    k_seq[:, :, start : start + 3] = k[:, :, [start + n for n in path]]
    v_seq[:, :, start : start + 3] = v[:, :, [start + n for n in path]]
    step = kernels.exact_attention(q[:, :, 3:4], k_seq, v_seq, start + 3)  # the grandchild, sequentially
    assert torch.equal(step[:, :, 0], tree[:, :, 3])


@needs_kernel
@pytest.mark.parametrize(("t", "hd"), [(1, 64), (9, 64), (9, 128)])  # 128: value sums of more than 4 vectors
def test_its_values_are_attention(t: int, hd: int) -> None:
    nh, nkv, start = 9, 3, 300
    k, v = caches(nkv, 400, hd, seed=t)
    q = torch.randn(1, nh, t, hd, generator=torch.Generator().manual_seed(3)) * 2
    end = start + t
    mask = torch.arange(end).unsqueeze(0) <= torch.arange(start, end).unsqueeze(1)  # (T, end)
    mask[:, 7] = False  # and a key nobody reads
    ours = kernels.exact_attention(q, k, v, end, mask)
    ref = F.scaled_dot_product_attention(q.double(), k[:, :, :end].double(), v[:, :, :end].double(),
                                         attn_mask=mask, enable_gqa=True)
    # float32 sums in order: a score sums hd products, an output `end` weighted values, each adding up to
    # one rounding (u = 2**-24) per term, relative to values of about 1: (hd + end) u ~ 2e-5. Measured:
    # 3e-6 and 7e-6, against 2e-6 and 6e-6 for torch's own float32 attention (blocked sums)
    error = (ours.double() - ref).abs().max().item()
    assert error < (hd + end) * 2**-24, error


@needs_kernel
def test_a_row_whose_mask_hides_every_key_is_zeros_as_torch_gives_it() -> None:
    q, k, v = (torch.randn(1, 2, n, 16, generator=torch.Generator().manual_seed(n)) for n in (3, 5, 5))
    mask = torch.ones(3, 5, dtype=torch.bool)  # (T, end)
    mask[1] = False
    ours = kernels.exact_attention(q, k, v, 5, mask)  # (1, 2, 3, 16); it was 0 / 0 there
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    assert torch.equal(ours[:, :, 1], torch.zeros(1, 2, 16)) and torch.equal(ref[:, :, 1], ours[:, :, 1].double())
    assert (ours[:, :, 0::2].double() - ref[:, :, 0::2]).abs().max().item() < 1e-5


@pytest.fixture
def fresh_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A build in an empty cache; the process's own build comes back afterwards."""
    monkeypatch.setenv("DRAFTGATE_CACHE", str(tmp_path))
    kernels._library.cache_clear()
    yield
    monkeypatch.undo()
    kernels._library.cache_clear()


@pytest.mark.usefixtures("fresh_build")
def test_without_a_compiler_it_says_so_and_the_model_attends_in_float64(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tiny_model: object) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with caplog.at_level(logging.WARNING, logger="decoding.kernels"):
        assert not kernels.available()
    assert "attending in float64" in caplog.text
    model = tiny_model(vocab_size=50, dtype=torch.bfloat16, seed=3).model  # type: ignore[operator]
    model.setup_cache(16)
    assert not model.blocks[0].attention.exact_kernel
    assert model.blocks[0].attention.kv_cache.scratch is not None  # float64 reads


@needs_kernel
@pytest.mark.usefixtures("fresh_build")
def test_a_compiler_named_with_several_words_builds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "env cc")  # as make takes $CC: "ccache gcc", "gcc -std=gnu11"
    assert kernels.available()


@pytest.mark.usefixtures("fresh_build")
def test_it_can_be_switched_off(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("DRAFTGATE_EXACT_KERNEL", "0")
    with caplog.at_level(logging.INFO, logger="decoding.kernels"):
        assert not kernels.available()
    assert "DRAFTGATE_EXACT_KERNEL=0" in caplog.text


@needs_kernel
@pytest.mark.usefixtures("fresh_build")
def test_it_builds_once_into_the_cache(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="decoding.kernels"):
        assert kernels.available()
    built = list((tmp_path / "kernels").glob("exact-*.so"))
    assert len(built) == 1
    assert str(built[0]) in caplog.text  # says which file it runs
    kernels._library.cache_clear()
    assert kernels.available()  # loads the file already built
    assert list((tmp_path / "kernels").glob("*")) == built


def torch_step(qkv: torch.Tensor, nh: int, nkv: int, cos: torch.Tensor, sin: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, start: int, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """What `attend_step` does, step by step with torch's ops around `exact_attention`; writes k, v."""
    t = qkv.shape[1]
    hd = qkv.shape[2] // (nh + 2 * nkv)
    heads = qkv.view(1, t, nh + 2 * nkv, hd).transpose(1, 2).float()  # (1, nh + 2 nkv, T, hd)
    qk = apply_rope(heads[:, : nh + nkv], cos, sin)  # (1, nh + nkv, T, hd)
    k[:, :, start : start + t] = qk[:, nh:]
    v[:, :, start : start + t] = heads[:, nh + nkv :]
    y = kernels.exact_attention(qk[:, :nh], k, v, start + t, mask, causal)  # (1, nh, T, hd)
    return y.transpose(1, 2).reshape(1, t, nh * hd).to(torch.bfloat16)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("nh", "nkv", "hd"), [(9, 3, 64), (4, 2, 8)])
@pytest.mark.parametrize("kind", ["prompt", "step", "verify", "tree"])
def test_a_whole_step_in_one_call_gives_the_bits_of_torchs_ops_around_the_kernel(
        dtype: torch.dtype, nh: int, nkv: int, hd: int, kind: str) -> None:
    g = torch.Generator().manual_seed(hd + len(kind))
    # 70 prompt tokens: the kernel rotates and writes them on several threads (64 or more)
    start, t = {"prompt": (0, 70), "step": (73, 1), "verify": (73, 6), "tree": (73, 4)}[kind]
    end = start + t
    mask = None
    if kind == "verify":
        mask = torch.arange(end).unsqueeze(0) <= torch.arange(start, end).unsqueeze(1)  # (T, end)
    if kind == "tree":  # root, two children, a grandchild under the second
        mask = torch.zeros(t, end, dtype=torch.bool)
        mask[:, :start] = True
        for node, ancestors in enumerate([[0], [0, 1], [0, 2], [0, 2, 3]]):
            mask[node, [start + a for a in ancestors]] = True
    qkv = (torch.randn(1, t, (nh + 2 * nkv) * hd, generator=g) * 2).to(dtype)
    cos_all, sin_all = rope_tables(ModelArgs(vocab_size=8, dim=nh * hd, n_layers=1, n_heads=nh, n_kv_heads=nkv,
                                             intermediate_size=8, max_seq_len=128), torch.float32)
    positions = torch.arange(start, end) if kind != "tree" else torch.tensor([0, 1, 1, 2]) + start
    cos, sin = cos_all[positions], sin_all[positions]  # (T, hd)
    k_ref, v_ref = caches(nkv, 96, hd, seed=5)
    keys = k_ref.transpose(2, 3).contiguous()  # (1, nkv, hd, S): the layout the kernel's cache keeps
    values = v_ref.clone()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # rows and tokens split across threads (the test run gives each worker one)
    try:
        ours = kernels.attend_step(qkv, nh, nkv, cos, sin, keys, values, start, mask, causal=kind == "prompt")
    finally:
        torch.set_num_threads(threads)
    ref = torch_step(qkv, nh, nkv, cos, sin, k_ref, v_ref, start, mask, causal=kind == "prompt")
    assert torch.equal(ours.view(torch.int16), ref.view(torch.int16))  # bf16 bits
    assert torch.equal(keys, k_ref.transpose(2, 3)) and torch.equal(values, v_ref)  # the cache, as written
