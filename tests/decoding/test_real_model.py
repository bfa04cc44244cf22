"""The real embedded target (SmolLM2-135M-Instruct from its GGUF file), on the CPU default dtype."""

from __future__ import annotations

import pytest
import torch

from decoding.bench.report import NEAR_TIE_GAP
from decoding.drafters import NgramDrafter
from decoding.generate import Engine, GenerationConfig
from decoding.loading import EMBEDDED_NAME, LoadedModel, embedded_gguf_path, load_model

pytestmark = pytest.mark.slow

PROMPTS = [
    "Repeat exactly: The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.",
    "Summarise in one sentence: Draftgate is a gateway. It speeds up agents with speculative decoding.",
    'Return this JSON with "age" changed to 41: {"name": "Ada", "age": 40, "city": "London"}',
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Fix the typo: 'Teh meeting is on Tuesday at noon in room 4B.'",
]


def test_embedded_model_shape_and_chat_template(embedded_model: LoadedModel) -> None:
    args = embedded_model.model.args
    assert (args.n_layers, args.dim, args.vocab_size) == (30, 576, 49152)
    assert embedded_model.name == EMBEDDED_NAME
    assert 134e6 < embedded_model.num_parameters < 135e6
    ids = embedded_model.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    text = embedded_model.tokenizer.hf.decode(ids)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")


def test_gguf_weights_match_transformers_own_gguf_loader(embedded_model: LoadedModel) -> None:
    """Our dequantisation and q/k un-permutation agree with transformers' GGUF loader (float32)."""
    from transformers import AutoModelForCausalLM

    path = embedded_gguf_path()
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    ours = load_model("embedded", "fp32").model
    tokens = torch.tensor(embedded_model.tokenizer.encode("The capital of France is Paris, and"))
    ours.setup_cache(64)
    with torch.no_grad():
        expected = theirs(tokens[None]).logits[0]
    got = ours(tokens, 0)
    assert (got.argmax(-1) == expected.argmax(-1)).all()
    torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3)


def test_bf16_verify_pass_reproduces_single_steps_bit_for_bit(embedded_model: LoadedModel) -> None:
    """The property that makes greedy speculation token-identical in bf16: a verify pass of k tokens
    gives exactly the logits of k single decode steps (float64 attention, row-stable matmuls)."""
    model = embedded_model.model
    if model.dtype != torch.bfloat16:  # "auto" without native bf16 is float32: rows agree to ~1e-5, not bits
        pytest.skip(f"this CPU has no native bf16 (the default dtype here is {model.dtype})")
    g = torch.Generator().manual_seed(0)
    context = torch.randint(0, 49152, (120,), generator=g)
    model.setup_cache(256)
    for k in (2, 5, 9):
        block = torch.randint(0, 49152, (k,), generator=g)
        model(context, 0)
        verify = model(block, 120)  # [k, V]
        singles = torch.stack([model(block[i : i + 1], 120 + i)[0] for i in range(k)])  # [k, V]
        assert torch.equal(verify, singles), f"k={k}: max difference {(verify - singles).abs().max():.3g}"


def _greedy(engine: Engine, model: LoadedModel, prompt: str, speculative: bool) -> list[int]:
    ids = model.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    return engine.complete(ids, GenerationConfig(max_new_tokens=48, speculative=speculative)).token_ids


def test_bf16_speculative_greedy_is_token_identical(embedded_model: LoadedModel) -> None:
    engine = Engine(embedded_model, NgramDrafter())
    identical, gaps = 0, []
    for prompt in PROMPTS:
        base = _greedy(engine, embedded_model, prompt, speculative=False)
        spec = _greedy(engine, embedded_model, prompt, speculative=True)
        if base == spec:
            identical += 1
            continue
        j = next(i for i in range(min(len(base), len(spec))) if base[i] != spec[i])
        ids = embedded_model.tokenizer.apply_chat_template([{"role": "user", "content": prompt}]) + base[:j]
        embedded_model.model.setup_cache(len(ids) + 1)
        logits = embedded_model.model(torch.tensor(ids), 0, last_only=True)[-1]
        gaps.append(float(logits[base[j]] - logits[spec[j]]))
    print(f"\nbf16 greedy agreement: {identical}/{len(PROMPTS)} prompts identical; divergence gaps {gaps}")
    assert all(abs(g) < NEAR_TIE_GAP for g in gaps), f"a divergence that is not a near-tie: {gaps}"
    assert identical == len(PROMPTS), f"bf16 near-tie flips despite exact attention: gaps {gaps}"


def test_fp32_speculative_greedy_is_identical() -> None:
    model = load_model("embedded", "fp32")
    engine = Engine(model, NgramDrafter())
    for prompt in PROMPTS[:3]:
        assert _greedy(engine, model, prompt, True) == _greedy(engine, model, prompt, False)
