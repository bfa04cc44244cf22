"""Map between HF transformers llama-family checkpoints and `decoding.model.Transformer` weights.

`from_hf` reads a local HF model directory (llama, mistral, qwen2 layouts); `to_hf_llama` builds the
equivalent `LlamaForCausalLM` from our weights, so HF `generate` can be benchmarked on the very same
weights and dtype.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from decoding.errors import ModelLoadError
from decoding.model import ModelArgs, Transformer

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def _rope_base(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ModelLoadError(f"rope scaling {rope_type!r} is not supported by the lean decoder")
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def args_from_config(config: Any, max_seq_len: int | None = None) -> ModelArgs:
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"model type {config.model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    n_heads = config.num_attention_heads
    context = int(getattr(config, "max_position_embeddings", 4096))
    return ModelArgs(
        vocab_size=config.vocab_size,
        dim=config.hidden_size,
        n_layers=config.num_hidden_layers,
        n_heads=n_heads,
        n_kv_heads=getattr(config, "num_key_value_heads", None) or n_heads,
        intermediate_size=config.intermediate_size,
        norm_eps=float(config.rms_norm_eps),
        rope_base=_rope_base(config),
        max_seq_len=min(context, max_seq_len) if max_seq_len else context,
        qkv_bias=config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
    )


def state_dict_from_hf(hf: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """HF parameter names -> ours; q, k and v fused, gate and up fused."""
    sd = {"tok_embeddings.weight": hf["model.embed_tokens.weight"], "norm.weight": hf["model.norm.weight"]}
    if not args.tie_embeddings:
        sd["output.weight"] = hf["lm_head.weight"]
    for i in range(args.n_layers):
        p, o = f"model.layers.{i}.", f"layers.{i}."
        att = p + "self_attn."
        sd[o + "attention.wqkv.weight"] = torch.cat([hf[att + f"{n}_proj.weight"] for n in "qkv"])
        if args.qkv_bias:
            sd[o + "attention.wqkv.bias"] = torch.cat([hf[att + f"{n}_proj.bias"] for n in "qkv"])
        sd[o + "attention.wo.weight"] = hf[att + "o_proj.weight"]
        sd[o + "feed_forward.w13.weight"] = torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])
        sd[o + "feed_forward.w2.weight"] = hf[p + "mlp.down_proj.weight"]
        sd[o + "attention_norm.weight"] = hf[p + "input_layernorm.weight"]
        sd[o + "ffn_norm.weight"] = hf[p + "post_attention_layernorm.weight"]
    return sd


def read_hf_dir(path: Path, max_seq_len: int | None = None) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """Arguments and float32 weights of a local HF model directory."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not a HF model directory ({exc})") from exc
    args = args_from_config(config, max_seq_len)
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: could not load weights ({exc})") from exc
    return args, state_dict_from_hf(hf_model.state_dict(), args)


def to_hf_llama(model: Transformer) -> Any:
    """The same weights as a transformers `LlamaForCausalLM` (for HF baselines in the bench)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    a = model.args
    config = LlamaConfig(
        vocab_size=a.vocab_size,
        hidden_size=a.dim,
        intermediate_size=a.intermediate_size,
        num_hidden_layers=a.n_layers,
        num_attention_heads=a.n_heads,
        num_key_value_heads=a.n_kv_heads,
        rms_norm_eps=a.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": a.rope_base},
        max_position_embeddings=a.max_seq_len,
        tie_word_embeddings=a.tie_embeddings,
        attention_bias=a.qkv_bias,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    ours = model.state_dict()
    kv_dim = a.n_kv_heads * a.head_dim
    hf: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": ours["tok_embeddings.weight"],
        "model.norm.weight": ours["norm.weight"],
        "lm_head.weight": ours["output.weight"],
    }
    for i in range(a.n_layers):
        p, o = f"model.layers.{i}.", f"layers.{i}."
        q, k, v = ours[o + "attention.wqkv.weight"].split([a.dim, kv_dim, kv_dim])
        for proj, w in zip("qkv", (q, k, v), strict=True):
            hf[p + f"self_attn.{proj}_proj.weight"] = w
        if a.qkv_bias:
            biases = ours[o + "attention.wqkv.bias"].split([a.dim, kv_dim, kv_dim])
            for proj, b in zip("qkv", biases, strict=True):
                hf[p + f"self_attn.{proj}_proj.bias"] = b
        hf[p + "self_attn.o_proj.weight"] = ours[o + "attention.wo.weight"]
        gate, up = ours[o + "feed_forward.w13.weight"].split(a.intermediate_size)
        hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"] = gate, up
        hf[p + "mlp.down_proj.weight"] = ours[o + "feed_forward.w2.weight"]
        hf[p + "input_layernorm.weight"] = ours[o + "attention_norm.weight"]
        hf[p + "post_attention_layernorm.weight"] = ours[o + "ffn_norm.weight"]
    hf_model: Any = LlamaForCausalLM(config)
    hf_model = hf_model.to(model.dtype)
    missing, unexpected = hf_model.load_state_dict(hf, strict=False)
    missing = [k for k in missing if not (a.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ModelLoadError(f"HF llama does not fit our weights: missing {missing[:3]}, unexpected {unexpected[:3]}")
    hf_model.eval()
    return hf_model
