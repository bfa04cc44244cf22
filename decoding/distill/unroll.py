"""The draft head unrolled over a whole sequence as it runs at decode time ("training-time test").

At decode time an eagle head reads the target's features up to the last verified position and its own
predicted features beyond it. Training on real features alone would teach a head that never sees its own
errors, so the sequence is run `steps` times:

- step 0: pair j = (f_j, x_{j+1}) with the target's features, causal attention over step-0 pairs;
- step u >= 1: pair j = (f̂_j, x_{j+1}), where f̂_j is step u-1's prediction at pair j-1. It stands for the
  u-th draft of a chain whose verified features end at position j-u, so it attends to step-0 pairs at
  positions <= j-u and to the step-v pair at position j-u+v for v = 1..u: exactly the keys its decode-time
  counterpart finds in the cache.

Step u at pair j predicts token x_{j+2}, the target's distribution at position j+1. An eagle3 head fuses
the target's several depths at step 0; its later steps read its own outputs, as at decode time. A "tokens" head reads
no features and needs one step: teacher forcing is already what it sees at decode time.

Sequences are padded to a multiple of `SHAPE_BUCKET` positions. oneDNN builds a matmul kernel for each
input shape (~15 ms for the head's LM-head shapes, more than the matmul itself) and keeps about a
thousand: sequences of every length made nearly every training matmul a new shape. With padding a few
dozen shapes recur, and an update of the shipped recipe runs 1.6-1.8x faster (60 updates side by side,
decoding/drafts/README.md). Attention is causal, so padding after the sequence changes none of its rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from decoding.copy_hints import sequence_hints
from decoding.draft_head import DraftHead
from decoding.model import Block, apply_rope

SHAPE_BUCKET = 64  # positions: sequences are padded to a multiple of this (see above)


def padded(x: torch.Tensor, bucket: int = SHAPE_BUCKET) -> torch.Tensor:
    """x (n, ...) followed by zero rows up to a multiple of `bucket` rows."""
    n = x.shape[0]
    extra = -n % bucket
    return torch.cat([x, x.new_zeros(extra, *x.shape[1:])]) if extra else x


def step_mask(n: int, u: int) -> torch.Tensor:
    """(n, (u + 1) n) bool: which keys (step 0 .. u, then position) a step-u query at pair j may read."""
    j = torch.arange(n).unsqueeze(1)  # (n, 1) query positions
    p = torch.arange(n).unsqueeze(0)  # (1, n) key positions
    parts = [p <= j - u] + [p == j - u + v for v in range(1, u + 1)]
    return torch.cat(parts, dim=1)


def _attention(block: Block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               keys: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> torch.Tensor:
    # x: (1, n, D) normed input of one step; keys: this layer's (k, v) of the earlier steps
    attn = block.attention
    _, n, d = x.shape
    kv_dim = attn.n_kv_heads * attn.head_dim
    q, k, v = attn.wqkv(x).split([d, kv_dim, kv_dim], dim=-1)
    q = apply_rope(q.view(1, n, attn.n_heads, attn.head_dim).transpose(1, 2), cos, sin)  # (1, nh, n, hd)
    k = apply_rope(k.view(1, n, attn.n_kv_heads, attn.head_dim).transpose(1, 2), cos, sin)  # (1, nkv, n, hd)
    v = v.view(1, n, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
    keys.append((k, v))
    all_k = torch.cat([kk for kk, _ in keys], dim=2)  # (1, nkv, (u+1) n, hd)
    all_v = torch.cat([vv for _, vv in keys], dim=2)
    y = F.scaled_dot_product_attention(q, all_k, all_v, attn_mask=mask,
                                       enable_gqa=attn.n_kv_heads != attn.n_heads)  # (1, nh, n, hd)
    return attn.wo(y.transpose(1, 2).reshape(1, n, d))


def unrolled(head: DraftHead, tokens: torch.Tensor, features: torch.Tensor | None, steps: int,
             bucket: int = SHAPE_BUCKET) -> list[torch.Tensor]:
    """Predicted features (T-1, D) of every pair j = 0 .. T-2, for steps 0 .. steps-1.

    tokens: (T,) the sequence; features: (T, F) the target's features (eagle heads: F = feature_width).
    The pairs run padded to a multiple of `bucket` (1: as they are); the padding's outputs are dropped."""
    real = tokens.shape[0] - 1
    if -real % bucket:
        tokens = torch.cat([tokens[:1], padded(tokens[1:], bucket)])  # (n + 1,) zeros after the sequence
        features = padded(features[:real], bucket) if features is not None else None  # (n, F)
    n = tokens.shape[0] - 1
    head.setup_cache(n)  # rope tables for the padded length (a no-op once they are long enough)
    cos, sin = head.rope_cos[:n], head.rope_sin[:n]
    keys: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in head.blocks]
    # pair j reads x_{j+1}: its copy hint is the one after tokens[: j + 2] (the same at every step, as the
    # unrolled chains follow the sequence's own tokens)
    hints = sequence_hints(tokens)[1:] if head.config.copy_hint else None  # (n, 2)
    outputs: list[torch.Tensor] = []
    feat = features[:n].float() if features is not None else None
    for u in range(steps):
        if u > 0:
            assert feat is not None, "unrolling past step 0 needs an eagle head"
            feat = torch.cat([torch.zeros_like(outputs[-1][:1]), outputs[-1][:-1]])  # (n, D) shifted by one
        x = head.inputs(tokens[1:], feat if head.uses_features else None, hints).unsqueeze(0)  # (1, n, D)
        mask = step_mask(n, u)
        for block, layer_keys in zip(head.blocks, keys, strict=True):
            x = x + _attention(block, block.attention_norm(x), cos, sin, layer_keys, mask)
            x = x + block.feed_forward(block.ffn_norm(x))
        outputs.append(head.norm(x)[0])  # (n, D)
    return [out[:real] for out in outputs]
