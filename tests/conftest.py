"""Shared fixtures: tiny llama models built in the test (float32/float64), and the real embedded model."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # scripts/test.sh runs two workers on two cores: one thread
    os.environ["OMP_NUM_THREADS"] = "1"  # each, and for the `draftgate serve` processes they start

from collections.abc import Callable

import pytest
import torch

from decoding.loading import LoadedModel
from decoding.model import ModelArgs, Transformer
from decoding.tokenizer import Tokenizer

torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))


def word_tokenizer(vocab_size: int) -> Tokenizer:
    """A real (tokenizers-library) word-level tokenizer over the words t0 .. t{V-1}; t0 is BOS, t1 EOS."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    raw = RawTokenizer(models.WordLevel(vocab, unk_token="t2"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="t0", eos_token="t1", unk_token="t2")
    return Tokenizer(hf, f"word-level tokenizer of {vocab_size} tokens")


def tiny_args(vocab_size: int = 8, dim: int = 32, n_layers: int = 2, **kw: object) -> ModelArgs:
    kw.setdefault("max_seq_len", 256)
    return ModelArgs(
        vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=4, n_kv_heads=2,
        intermediate_size=2 * dim, **kw,  # type: ignore[arg-type]
    )


def tiny_transformer(args: ModelArgs, seed: int, dtype: torch.dtype, logit_scale: float = 1.0) -> Transformer:
    """Random weights; `logit_scale` sharpens the next-token distributions so they are not ~uniform."""
    g = torch.Generator().manual_seed(seed)
    model = Transformer(args)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        for layer in model.layers:
            layer.attention_norm.weight.fill_(1.0)
            layer.ffn_norm.weight.fill_(1.0)
        model.norm.weight.fill_(logit_scale)
    return model.to(dtype).eval().requires_grad_(False)


def perturbed_copy(model: Transformer, seed: int, noise: float) -> Transformer:
    """A draft that resembles the target: its weights plus Gaussian noise."""
    g = torch.Generator().manual_seed(seed)
    draft = Transformer(model.args).to(model.dtype)
    draft.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * noise)
    return draft.eval().requires_grad_(False)


TinyFactory = Callable[..., LoadedModel]


@pytest.fixture
def tiny_model() -> TinyFactory:
    def make(
        vocab_size: int = 8, dtype: torch.dtype = torch.float64, seed: int = 0, logit_scale: float = 3.0,
        n_layers: int = 2,
    ) -> LoadedModel:
        args = tiny_args(vocab_size, n_layers=n_layers)
        model = tiny_transformer(args, seed, dtype, logit_scale)
        return LoadedModel("tiny", f"tiny-{seed}", model, word_tokenizer(vocab_size))

    return make


@pytest.fixture(scope="session")
def embedded_model() -> LoadedModel:
    """The real SmolLM2-135M-Instruct in the CPU default dtype (bf16 where the CPU has native bf16, else
    float32); loaded once per test session."""
    from decoding.loading import load_model

    return load_model("embedded", "auto")


@pytest.fixture(scope="session")
def embedded_tokenizer() -> Tokenizer:
    """The embedded model's tokenizer alone (no weights): the real 49k vocabulary for grammar tests."""
    from decoding.loading import embedded_gguf_path
    from decoding.tokenizer import load_tokenizer

    path = embedded_gguf_path()
    return load_tokenizer(path.parent, path.name)
