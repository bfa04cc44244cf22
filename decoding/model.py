"""A lean llama-family decoder with a static KV cache, after pytorch-labs/gpt-fast `model.py`.

The cache is a preallocated buffer written at `input_pos`; attention reads only positions <= the query's,
so rolling back rejected draft tokens costs nothing: the next forward overwrites them. The residual
stream is float32; a bf16 model attends through an exact float32 kernel (decoding/kernels; float64
past the prompt without a C compiler, see `attention_dtype`), so that a verify pass
reproduces single steps bit for bit, over keys and values kept in float32 (see `KVCache`). Covers llama,
mistral and qwen2-style checkpoints (RMSNorm, rotary embeddings in the half-split layout of HF, grouped
query attention, SwiGLU MLP, optional q/k/v bias, tied or untied LM head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from decoding import kernels
from decoding.packing import ExactLinear, can_run_exact, pack_linears
from decoding.tree import TokenTree

# bf16 logits within this distance of a row's maximum are recomputed in float32 (see refine_top_logits)
REFINE_MARGIN = 0.5


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    max_seq_len: int = 4096
    qkv_bias: bool = False
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class KVCache(nn.Module):
    """Keys and values of every layer position, written in place at `input_pos`, read in `dtype`.

    A bf16 model's cache keeps them in float32. The exact kernel (decoding/kernels.attend_step) writes
    and reads them as stored, without `update`; float64 attention (without the kernel) copies them into
    `scratch` (one float64 buffer the layers share, as they run one after another) for each pass. At an
    agent's long context, reading the cache is much of a decode step, and float32 halves it against
    float64 (a step of the embedded model at a 1,800-token context: 27.8 -> 24.9 ms on the 2-core
    development CPU). Every
    pass reads the same stored values, so a verify pass still reproduces single steps bit for bit;
    values are the projection's own (bf16, or float32 where its reduction was split); keys are rotated
    in float32 with the kernel, else in float64 and rounded once to float32. The kernel scores with vector
    lanes over keys, so its cache stores keys transposed (`transposed_keys`): `k` stays a (1, n_kv, S, hd)
    view, for everything else that reads or moves them."""

    k: torch.Tensor
    v: torch.Tensor
    k_storage: torch.Tensor  # with transposed_keys: (1, n_kv, hd, S)

    def __init__(self, n_kv_heads: int, max_seq_len: int, head_dim: int, dtype: torch.dtype,
                 scratch: torch.Tensor | None = None, transposed_keys: bool = False) -> None:
        super().__init__()
        shape = (1, n_kv_heads, max_seq_len, head_dim)
        if scratch is not None:
            assert scratch.dtype == dtype and scratch.shape[1:] == shape, "a scratch buffer is (2, *shape) in dtype"
        self.scratch = scratch  # (2, 1, n_kv, max_seq_len, hd) or None: stored in float32, read through it
        stored = dtype if scratch is None else torch.float32
        # `k` is always (1, n_kv, S, hd); with `transposed_keys` it is a view of (1, n_kv, hd, S) storage,
        # the layout the exact kernel scores from (one head dimension of many keys in a vector)
        if transposed_keys:
            storage = torch.zeros(1, n_kv_heads, head_dim, max_seq_len, dtype=stored)  # (1, n_kv, hd, S)
            self.register_buffer("k_storage", storage, persistent=False)
            self.k = storage.transpose(2, 3)  # (1, n_kv, S, hd) view
        else:
            self.register_buffer("k", torch.zeros(shape, dtype=stored), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=stored), persistent=False)

    def keep(self, before: KVCache) -> None:
        """Hold what a smaller cache held, at the same positions (a cache grown for a longer request)."""
        n = before.k.shape[2]
        self.k[:, :, :n], self.v[:, :, :n] = before.k, before.v

    def update(
        self, start: int, k: torch.Tensor, v: torch.Tensor, end: int, stored: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # k, v: (1, n_kv, T, hd), written at positions [start, start + T); read back in `dtype`, or as
        # stored (float32 for a bf16 model) with `stored`
        t = k.shape[2]
        self.k[:, :, start : start + t] = k
        self.v[:, :, start : start + t] = v
        keys, values = self.k[:, :, :end], self.v[:, :, :end]  # (1, n_kv, end, hd)
        if self.scratch is None or stored:
            return keys, values
        return self.scratch[0, :, :, :end].copy_(keys), self.scratch[1, :, :, :end].copy_(values)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self._cast: tuple[tuple[int, int, torch.dtype], torch.Tensor] | None = None
        # before exact linear layers: normalise through decoding/kernels (each row the same bits in any
        # pass, one call instead of torch's ~8 small ops) into their bf16 input (Transformer.use_exact_linears)
        self.exact = False

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        # x: (..., D) residual stream (float32); normalise in float32, cast for the next matmul. torch's
        # rms_norm computes x * rsqrt(mean(x^2) + eps) * w as the three ops did, to the bit (checked on
        # the embedded model's prompt, verify and step passes), in one call: 12 -> 8 us here, 61 a step
        if self.exact and out_dtype is None and x.dtype == torch.float32:
            return kernels.exact_rms_norm(x, self.weight_as(torch.float32), self.eps)  # (..., D) bf16
        xf = x if x.dtype == torch.float64 else x.float()
        return F.rms_norm(xf, (xf.shape[-1],), self.weight_as(xf.dtype), self.eps).to(out_dtype or self.weight.dtype)

    def weight_as(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight (D,) in `dtype`; without autograd the cast is made once per weight version, not
        once per call (two casts a layer a decode step)."""
        w = self.weight
        if w.dtype == dtype or torch.is_grad_enabled():
            return w.to(dtype)
        key = (w.data_ptr(), w._version, dtype)
        if self._cast is None or self._cast[0] != key:
            self._cast = (key, w.detach().to(dtype))
        return self._cast[1]


def unit_rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x (..., D) scaled to unit root-mean-square along D (an RMSNorm without weights)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope_tables(args: ModelArgs, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for every position, (max_seq_len, head_dim), half-split layout."""
    hd = args.head_dim
    inv_freq = 1.0 / (args.rope_base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    t = torch.arange(args.max_seq_len, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)  # (S, hd/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (S, hd)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (1, nh, T, hd); cos, sin: (T, hd)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def is_prompt_pass(t: int, start: int, mask: torch.Tensor | None) -> bool:
    """Whether a pass of `t` tokens at `start` is a prompt's own pass: several tokens without a mask, from
    position 0, attended causally (any later multi-token pass must bring its mask)."""
    prompt = mask is None and t > 1
    assert not prompt or start == 0, "a multi-token pass past position 0 needs its mask"
    return prompt


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.head_dim
        kv_dim = self.n_kv_heads * self.head_dim
        # q, k and v in one matmul: fewer kernel launches per token
        self.wqkv = nn.Linear(args.dim, args.dim + 2 * kv_dim, bias=args.qkv_bias)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)
        self.kv_cache: KVCache | None = None
        # every pass attends through decoding/kernels (exact float32; its cache has no float64 scratch)
        self.exact_kernel = False

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int, mask: torch.Tensor | None
    ) -> torch.Tensor:
        # x: (1, T, D)
        _, t, d = x.shape
        nh, nkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        assert self.kv_cache is not None, "call setup_cache() before forward()"
        adt = cos.dtype  # attention dtype (see Transformer.attention_dtype)
        prompt = is_prompt_pass(t, start, mask)
        if self.exact_kernel:
            # every row the bits of the single step it stands for, in float32 (decoding/kernels); a
            # prompt's own pass too (causal), so a prompt read in one pass or in several fills the cache
            # with the same bits. One call does the rotation, the cache write and the attention, the
            # same bits as the ops below would give around kernels.exact_attention
            cache = self.kv_cache
            y = kernels.attend_step(self.wqkv(x), nh, nkv, cos, sin, cache.k_storage, cache.v, start, mask,
                                    causal=prompt)  # (1, T, D) bf16
            return self.wo(y)
        # q, k and v heads side by side, cast once; q and k rotated together
        qkv = self.wqkv(x).view(1, t, nh + 2 * nkv, hd).transpose(1, 2).to(adt)  # (1, nh + 2 nkv, T, hd)
        qk = apply_rope(qkv[:, : nh + nkv], cos, sin)  # (1, nh + nkv, T, hd)
        q = qk[:, :nh]  # (1, nh, T, hd)
        # a prompt's own pass (from position 0, causal) attends over the cache as stored (see
        # Transformer.attention_dtype): float32 for a bf16 model, through torch's kernel
        k, v = self.kv_cache.update(start, qk[:, nh:], qkv[:, nh + nkv :], start + t, stored=prompt)
        q = q.to(k.dtype)  # k, v: (1, nkv, start + T, hd)
        if t == 1 and mask is None and nh != nkv:
            # one token: the heads sharing a kv head are that head's queries, so the kernel reads each
            # cached key once instead of once per query head
            y = F.scaled_dot_product_attention(q.reshape(1, nkv, nh // nkv, hd), k, v).reshape(1, nh, 1, hd)
        else:
            # a single query attends to every cached position: no mask needed; several queries without a
            # mask are a prompt from position 0, causal (the kernel's own causal path: no (T, T) mask,
            # which made an 8k-token prompt take 80 s)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=prompt, enable_gqa=nkv != nh
            )  # (1, nh, T, hd)
        return self.wo(y.transpose(1, 2).reshape(1, t, d).to(self.wo.weight.dtype))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.intermediate_size = args.intermediate_size
        self.w13 = nn.Linear(args.dim, 2 * args.intermediate_size, bias=False)  # gate and up in one matmul
        self.w2 = nn.Linear(args.intermediate_size, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.intermediate_size, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)
        # with exact linear layers (take_exact_linears): the whole layer in one kernel call, where it also
        # attends through the exact kernel
        self.exact_weights: kernels.LayerWeights | None = None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int, mask: torch.Tensor | None
    ) -> torch.Tensor:
        # x: (1, T, D) residual stream in float32; the matmuls run in the weights' dtype
        # (bf16 sublayer outputs are promoted exactly by the additions)
        cache = self.attention.kv_cache
        if self.exact_weights is not None and self.attention.exact_kernel and cache is not None:
            return kernels.exact_layer(x, self.exact_weights, cos, sin, cache.k_storage, cache.v, start, mask,
                                       causal=is_prompt_pass(x.shape[1], start, mask))
        h = x + self.attention(self.attention_norm(x), cos, sin, start, mask)
        return h + self.feed_forward(self.ffn_norm(h))


def take_exact_linears(module: nn.Module, blocks: list[Block]) -> bool:
    """Every `nn.Linear` under `module` an `ExactLinear`, and the RMSNorms of its `blocks` through the
    kernel too, if every layer can run it here (else none: returns False); each block then runs as one
    `kernels.exact_layer` call wherever it attends through the exact kernel."""
    if not all(can_run_exact(m) for m in module.modules() if isinstance(m, nn.Linear)):
        return False
    pack_linears(module, exact=True)
    scratch = kernels.Scratch()
    for block in blocks:
        block.attention_norm.exact = block.ffn_norm.exact = True
        block.exact_weights = layer_weights(block, scratch)
    return True


def layer_weights(block: Block, scratch: kernels.Scratch) -> kernels.LayerWeights:
    """A block's exact linear layers and norms as one `kernels.exact_layer` call reads them."""
    attention, ffn = block.attention, block.feed_forward
    wqkv, wo, w13, w2 = attention.wqkv, attention.wo, ffn.w13, ffn.w2
    assert isinstance(wqkv, ExactLinear) and isinstance(wo, ExactLinear)
    assert isinstance(w13, ExactLinear) and isinstance(w2, ExactLinear)
    return kernels.LayerWeights(
        norm1=block.attention_norm.weight_as(torch.float32), norm2=block.ffn_norm.weight_as(torch.float32),
        eps=block.attention_norm.eps,
        wqkv=wqkv.packed, qkv_width=wqkv.out_features, qkv_bias=wqkv.exact_bias, wo=wo.packed, w13=w13.packed,
        intermediate=ffn.intermediate_size, w2=w2.packed, n_heads=attention.n_heads,
        n_kv_heads=attention.n_kv_heads, head_dim=attention.head_dim, scratch=scratch)


class Transformer(nn.Module):
    """forward(tokens at positions [start, start + T)) -> logits (T, V) of the next token after each."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    layers: nn.ModuleList

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.max_seq_len = 0
        self.exact_attention = True
        # changes with every pass and every new cache: whoever wrote the cache last can tell it is untouched
        self.cache_version = 0
        self._table: kernels.LayerTable | None = None  # the blocks as one exact_layers call reads them
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embeddings.weight.dtype

    @property
    def blocks(self) -> list[Block]:
        return [layer for layer in self.layers if isinstance(layer, Block)]

    @property
    def split_invariant(self) -> bool:
        """Whether a prompt read in one pass or in several leaves the same bits in the cache and the
        logits: with the exact kernel (every pass's rows computed alike), so cached prefixes can be
        reused exactly (Engine)."""
        blocks = self.blocks
        return bool(blocks) and blocks[0].attention.exact_kernel

    @property
    def residual_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype == torch.float64 else torch.float32

    @property
    def attention_dtype(self) -> torch.dtype:
        """float64 for bf16 (and float64) models: torch's attention kernel blocks its work differently
        for a k-token verify pass than for a single step; in float64 that difference (~1e-16) never
        survives the cast back to bf16, so a verify pass reproduces single steps bit for bit and
        greedy speculation is token-identical even in bf16. Set `exact_attention = False` for
        torch's float32 attention: faster, with rare near-tie flips.

        Where decoding/kernels builds (a C compiler), a bf16 model attends through it instead, in every
        pass: float32, exact by construction (each row computed alike in any pass, whatever its rows,
        keys and mask), its attention 2-5x faster than float64's here. Queries and keys then rotate in
        float32 too, so nothing of a pass depends on which pass computes a row: a prompt read in one
        pass or in several fills the cache with the same bits (what reusing a cached prefix needs;
        tests/decoding/test_model.py).

        Without the kernel, a bf16 model's prompt pass (from position 0) attends through torch's float32
        kernel, over the cache as stored: every request reads its prompt through that one pass,
        speculative or not, so both paths decode from the same cache and the same first logits; what
        must agree bit for bit is a verify pass with the single steps it stands for, and those use
        float64. A 2,300-token prompt of the embedded model takes ~1.7 s with the kernel, ~1.9 s with
        torch's float32 and 4.5 s in float64 on the 2-core development CPU."""
        if self.dtype == torch.float64 or (self.dtype == torch.bfloat16 and self.exact_attention):
            return torch.float64
        return torch.float32

    def setup_cache(self, max_seq_len: int) -> None:
        """Allocate the KV cache for sequences of up to `max_seq_len` tokens (idempotent)."""
        max_seq_len = min(max_seq_len, self.args.max_seq_len)
        adt = self.attention_dtype
        a = self.args
        exact = self.dtype == torch.bfloat16 and adt == torch.float64
        # a bf16 model keeps its cache in float32; every pass reads it through the exact float32 kernel,
        # or (without one) passes past the prompt read it in float64 through one scratch buffer (KVCache)
        kernel = exact and a.head_dim <= kernels.MAX_HEAD_DIM and kernels.available()
        # with the kernel nothing of a pass runs in float64: queries and keys rotate in float32 in every
        # pass, prompts included, so a pass's rows do not depend on which pass computes them
        rope_dtype = torch.float32 if kernel else adt
        if max_seq_len <= self.max_seq_len and self.rope_cos.dtype == rope_dtype:
            return
        grown = self.max_seq_len > 0 and self.rope_cos.dtype == rope_dtype  # a bigger cache of the same kind
        self.max_seq_len = max_seq_len
        scratch = None
        if exact and not kernel:
            scratch = torch.empty(2, 1, a.n_kv_heads, max_seq_len, a.head_dim, dtype=adt)
        for layer in self.blocks:
            cache = KVCache(a.n_kv_heads, max_seq_len, a.head_dim, torch.float32 if kernel else adt, scratch,
                            transposed_keys=kernel)
            before = layer.attention.kv_cache
            if grown and before is not None:  # keep what it holds: an engine may read a cached prefix
                cache.keep(before)
            layer.attention.kv_cache = cache
            layer.attention.exact_kernel = kernel
        self._table = None  # new caches: a new table
        if not grown:
            self.cache_version += 1  # what the cache held is gone
        cos, sin = rope_tables(self.args, rope_dtype)
        self.rope_cos, self.rope_sin = cos[:max_seq_len], sin[:max_seq_len]

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: int, last_only: bool = False) -> torch.Tensor:
        # tokens: (T,) int64 at positions [start, start + T) -> logits (T, V), or (1, V) with last_only
        return self.forward_hidden(tokens, start, last_only)[0]

    @torch.inference_mode()
    def forward_hidden(
        self, tokens: torch.Tensor, start: int, last_only: bool = False, tree: TokenTree | None = None,
        feature_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits as `forward`, and the final normed hidden state (T, D) in float32 of every position:
        the features a draft head (decoding/draft_head.py) reads. With `feature_layers` the residual
        stream after each of those blocks follows it, RMS-normalised: (T, (1 + L) D), what a head that
        reads several depths of the target takes (EAGLE-3). With a `tree` (decoding/tree.py) the
        tokens are its root and nodes, each at its depth's position, reading only its ancestors; their
        cache entries land in slots [start, start + T) until `keep_path` compacts the accepted ones."""
        t = tokens.shape[0]
        end = start + t
        if end > self.max_seq_len:
            raise ValueError(f"sequence of {end} tokens exceeds the KV cache of {self.max_seq_len}")
        self.cache_version += 1
        cos, sin = self.rope_cos[start:end], self.rope_sin[start:end]  # (T, hd)
        mask = None
        if tree is not None:
            positions = tree.positions(start)  # (T,)
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # (T, hd)
            mask = tree.attention_mask(start)  # (T, end)
        elif t > 1 and start > 0:  # from position 0 attention is plain causal (Attention.forward)
            # query i (position start + i) may read keys at positions <= start + i
            q_pos = torch.arange(start, end).unsqueeze(1)  # (T, 1)
            k_pos = torch.arange(end).unsqueeze(0)  # (1, end)
            mask = k_pos <= q_pos  # (T, end)
        elif t > 1 and self.dtype == torch.bfloat16:  # a prompt, from position 0
            # a bf16 model's prompt attends in float32 (see attention_dtype): its queries and keys rotate in
            # float32 too (a 2,300-token prompt: 2.39-2.54 -> 1.86-1.93 s); with the kernel every pass does
            cos, sin = cos.float(), sin.float()
        x = self.tok_embeddings(tokens).unsqueeze(0).to(self.residual_dtype)  # (1, T, D) residual stream
        taps: list[torch.Tensor] = []  # (T, D) each: the residual stream after the feature layers
        table = None if feature_layers else self.layer_table()
        if table is not None:  # every block in one kernel call: the bits of the loop below
            x = kernels.exact_layers(x, table, cos, sin, start, mask, causal=is_prompt_pass(t, start, mask))
        else:
            for i, layer in enumerate(self.blocks):
                x = layer(x, cos, sin, start, mask)
                if i in feature_layers:
                    taps.append(unit_rms(x[0]))  # (T, D) in the residual dtype, as the final state
        hidden = self.norm(x, out_dtype=self.residual_dtype)[0]  # (T, D) final hidden state, float32
        h = hidden[-1:] if last_only else hidden  # (T or 1, D)
        logits = self.output(h.to(self.dtype))  # (T or 1, V); float32 from exact linear layers
        if logits.dtype not in (torch.float32, torch.float64):  # rounded to bf16: its near-ties refined
            logits = self.refine_top_logits(h, logits.to(h.dtype)).float()
        if taps:
            hidden = torch.cat([hidden, *taps], dim=-1)  # (T, (1 + L) D)
        return logits, hidden

    def layer_table(self) -> kernels.LayerTable | None:
        """The blocks as one `kernels.exact_layers` call reads them, where each block would run as one
        `exact_layer` call (else None): a pass's ~30 calls from Python, ~12 us each of wrappers and checks
        (~0.36 ms of a ~5.4 ms step), become one. Built once, and again after `setup_cache` or
        `use_exact_linears` (what replaces the blocks' caches, kernel flags or weights)."""
        if self._table is None:
            weights, caches = [], []
            for block in self.blocks:
                cache = block.attention.kv_cache
                if block.exact_weights is None or not block.attention.exact_kernel or cache is None:
                    return None
                weights.append(block.exact_weights)
                caches.append((cache.k_storage, cache.v))
            if not weights:
                return None
            self._table = kernels.LayerTable(weights, caches)
        return self._table

    def use_exact_linears(self) -> bool:
        """Run every linear layer through decoding/kernels' exact bf16 kernel, where it runs here (a bf16
        model, a CPU with AVX512-BF16, even input widths): each row the same bits in any pass, as the
        exact attention, and a decode step's matmuls ~1.8x faster than oneDNN's on the 2-core development
        CPU. Their outputs are float32 (the accumulators, never rounded to bf16), and the blocks' norms
        before them run through the kernel too (each ~2 us against ~25 for torch's ops). All layers or
        none: returns whether it took them."""
        self._table = None
        return take_exact_linears(self, self.blocks)

    def keep_path(self, start: int, rows: list[int]) -> None:
        """After a tree pass at `start`: move the cache entries of the accepted rows (increasing, row 0
        the root stays) to the slots after the root, where a sequential pass would have put them."""
        if rows == list(range(1, len(rows) + 1)):
            return  # already in place (a chain, or the first branch all the way)
        src = torch.tensor(rows) + start  # (n,)
        for layer in self.blocks:
            cache = layer.attention.kv_cache
            assert cache is not None
            cache.k[:, :, start + 1 : start + 1 + len(rows)] = cache.k[:, :, src]
            cache.v[:, :, start + 1 : start + 1 + len(rows)] = cache.v[:, :, src]

    def refine_top_logits(self, h: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Recompute in float32 the logits near each row's maximum.

        A bf16 LM head rounds logits to 8 significant bits (steps of 0.125 around 20), so exact ties
        at the top are common, and a verify pass (k rows) and a single step (1 row) can round a tie
        differently. The few candidates within REFINE_MARGIN of the top get float32 dot products of
        the float32 hidden state and the weight rows; the rest keep their bf16 values, which are far
        enough below not to matter for the argmax.
        """
        # h: (T, D) float32; logits: (T, V) float32 from the bf16 head
        top = logits.max(dim=-1, keepdim=True).values  # (T, 1)
        rows, cols = (logits >= top - REFINE_MARGIN).nonzero(as_tuple=True)  # (n,), (n,)
        weight = self.output.weight[cols].to(h.dtype)  # (n, D)
        logits[rows, cols] = (h[rows] * weight).sum(-1)  # (n,)
        return logits
