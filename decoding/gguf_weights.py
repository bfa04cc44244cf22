"""Read a llama-architecture GGUF file (llama.cpp's format) into `Transformer` weights.

Quantised tensors (Q4_1, Q8_0, ...) are dequantised with the `gguf` package. llama.cpp's converter
permutes the q and k projections into the interleaved rotary layout; they are permuted back here into
the half-split layout that `decoding.model` (and HF transformers) use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from decoding.errors import ModelLoadError
from decoding.model import ModelArgs

SUPPORTED_ARCHITECTURES = ("llama",)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise KeyError(key)
        return default
    return field.contents()


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    # w: (n_heads * hd, D) in llama.cpp's interleaved rotary layout -> half-split layout
    hd_half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, hd_half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf(path: Path, max_seq_len: int | None = None) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """Return the model's arguments and a float32 state dict for `decoding.model.Transformer`."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({exc})") from exc
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"{path}: GGUF architecture {arch!r} is not supported (supported: llama)")
    tensors = {t.name: t for t in reader.tensors}
    n_heads = int(_field(reader, f"{arch}.attention.head_count"))
    n_kv = int(_field(reader, f"{arch}.attention.head_count_kv", n_heads))
    context = int(_field(reader, f"{arch}.context_length", 4096))
    args = ModelArgs(
        vocab_size=int(tensors["token_embd.weight"].shape[-1]),
        dim=int(_field(reader, f"{arch}.embedding_length")),
        n_layers=int(_field(reader, f"{arch}.block_count")),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
        norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        max_seq_len=min(context, max_seq_len) if max_seq_len else context,
        tie_embeddings="output.weight" not in tensors,
    )

    def load(name: str) -> np.ndarray:
        t = tensors[name]
        return np.array(gguf.dequantize(t.data, t.tensor_type), dtype=np.float32)  # a writable copy

    sd: dict[str, np.ndarray] = {
        "tok_embeddings.weight": load("token_embd.weight"),  # (V, D)
        "norm.weight": load("output_norm.weight"),
    }
    if not args.tie_embeddings:
        sd["output.weight"] = load("output.weight")
    for i in range(args.n_layers):
        p = f"blk.{i}."
        q = _unpermute(load(p + "attn_q.weight"), n_heads)  # (D, D)
        k = _unpermute(load(p + "attn_k.weight"), n_kv)  # (kv_dim, D)
        v = load(p + "attn_v.weight")  # (kv_dim, D)
        o = f"layers.{i}."
        sd[o + "attention.wqkv.weight"] = np.concatenate([q, k, v])
        sd[o + "attention.wo.weight"] = load(p + "attn_output.weight")
        sd[o + "feed_forward.w13.weight"] = np.concatenate([load(p + "ffn_gate.weight"), load(p + "ffn_up.weight")])
        sd[o + "feed_forward.w2.weight"] = load(p + "ffn_down.weight")
        sd[o + "attention_norm.weight"] = load(p + "attn_norm.weight")
        sd[o + "ffn_norm.weight"] = load(p + "ffn_norm.weight")
    return args, {name: torch.from_numpy(w) for name, w in sd.items()}
