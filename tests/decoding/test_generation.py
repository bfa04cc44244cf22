"""Generation behaviour: stop sequences, EOS, max tokens 0/1, empty prompt, UTF-8 streaming, errors."""

from __future__ import annotations

import pytest
import torch

from decoding.drafters import NgramDrafter
from decoding.errors import ContextLengthError, InvalidRequestError
from decoding.generate import Engine, GenerationConfig
from decoding.loading import LoadedModel
from decoding.tokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, Tokenizer, load_tokenizer
from tests.conftest import TinyFactory, tiny_args, tiny_transformer


@pytest.fixture(scope="module")
def real_tokenizer() -> Tokenizer:
    from decoding.loading import embedded_gguf_path

    path = embedded_gguf_path()
    return load_tokenizer(path.parent, gguf_file=path.name)


@pytest.fixture
def tiny_real_vocab(real_tokenizer: Tokenizer) -> LoadedModel:
    """A tiny random model over the real 49152-token vocabulary: real text, real byte-level merges."""
    model = tiny_transformer(tiny_args(real_tokenizer.vocab_size, dim=32), seed=0, dtype=torch.float32)
    return LoadedModel("tiny-real-vocab", "tiny", model, real_tokenizer)


PROMPT = [1, 504, 3437, 314, 260, 1345, 28, 504, 3437, 314]


def test_stop_sequence_cuts_the_text_and_is_never_streamed(tiny_real_vocab: LoadedModel) -> None:
    engine = Engine(tiny_real_vocab, NgramDrafter())
    free = engine.complete(PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True))
    assert len(free.text) > 12
    stop = free.text[8:12]
    cut = free.text.find(stop)
    generation = engine.generate(PROMPT, GenerationConfig(max_new_tokens=40, stop=(stop,), ignore_eos=True))
    streamed = "".join(generation)
    result = generation.result
    assert result.text == free.text[:cut] == streamed
    assert result.finish_reason == "stop"
    assert result.completion_tokens < 40


def test_a_stop_sequence_ends_usage_where_target_only_decoding_does(tiny_real_vocab: LoadedModel) -> None:
    """A speculative pass emits several tokens at once; those past the one that completes the stop are
    not counted (a trial through the gateway saw completion_tokens 32 with speculation, 31 without)."""
    from decoding.drafters import DraftModelDrafter

    plain = Engine(tiny_real_vocab)
    # the target as its own draft: every draft accepted, so each pass emits up to 9 tokens
    speculative = Engine(tiny_real_vocab, DraftModelDrafter(tiny_real_vocab.model))
    free = plain.complete(PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True))
    cases = 0
    for k in range(2, len(free.text) - 2, 3):
        config = GenerationConfig(max_new_tokens=40, stop=(free.text[k : k + 2],), ignore_eos=True)
        want = plain.complete(PROMPT, config)
        got = speculative.complete(PROMPT, config)
        assert (got.text, got.token_ids, got.finish_reason) == (want.text, want.token_ids, want.finish_reason), k
        cases += got.stats.verify_passes < len(got.token_ids)  # passes emitted several tokens
    assert cases > 3


def test_eos_ends_generation_and_is_not_in_the_text(tiny_real_vocab: LoadedModel) -> None:
    engine = Engine(tiny_real_vocab)
    free = engine.complete(PROMPT, GenerationConfig(max_new_tokens=20, ignore_eos=True))
    eos = free.token_ids[6]
    end = free.token_ids.index(eos)
    tiny_real_vocab.tokenizer.eos_token_ids = frozenset({eos})
    try:
        result = engine.complete(PROMPT, GenerationConfig(max_new_tokens=20))
    finally:
        del tiny_real_vocab.tokenizer.eos_token_ids
    assert result.finish_reason == "stop"
    assert result.token_ids == free.token_ids[: end + 1]
    assert result.text == tiny_real_vocab.tokenizer.decode(free.token_ids[:end])


def test_max_tokens_zero_and_one(tiny_model: TinyFactory) -> None:
    engine = Engine(tiny_model(vocab_size=16))
    zero = engine.complete([0, 3, 4], GenerationConfig(max_new_tokens=0))
    assert (zero.token_ids, zero.text, zero.finish_reason, zero.stats.target_passes) == ([], "", "length", 0)
    one = engine.complete([0, 3, 4], GenerationConfig(max_new_tokens=1, ignore_eos=True))
    assert len(one.token_ids) == 1 and one.finish_reason == "length" and one.stats.target_passes == 1


def test_max_tokens_is_exact_under_speculation(tiny_model: TinyFactory) -> None:
    engine = Engine(tiny_model(vocab_size=16), NgramDrafter(min_n=1, max_n=2), max_draft_tokens=8)
    for n in (2, 3, 7, 13):
        result = engine.complete([0, 3, 4, 3, 4, 3, 4], GenerationConfig(max_new_tokens=n, ignore_eos=True))
        assert len(result.token_ids) == n and result.finish_reason == "length"


def test_empty_prompt_starts_from_bos(tiny_model: TinyFactory) -> None:
    target = tiny_model(vocab_size=16)
    engine = Engine(target)
    config = GenerationConfig(max_new_tokens=5, ignore_eos=True)
    assert engine.complete([], config).token_ids == engine.complete([0], config).token_ids


def test_context_length_and_bad_parameters_are_clear_errors(tiny_model: TinyFactory) -> None:
    engine = Engine(tiny_model(vocab_size=16))
    with pytest.raises(ContextLengthError, match="max_tokens 100 exceeds the context of 256: at most 56 new") as err:
        engine.complete([0] * 200, GenerationConfig(max_new_tokens=100))
    assert err.value.param == "max_tokens"  # the prompt fits: the limit asked for is at fault
    with pytest.raises(ContextLengthError, match="the prompt is 256 tokens: the context of 256 leaves no room") as err:
        engine.complete([0] * 256, GenerationConfig(max_new_tokens=1))
    assert err.value.param == "messages"
    with pytest.raises(InvalidRequestError):
        GenerationConfig(max_new_tokens=-1)
    with pytest.raises(InvalidRequestError):
        GenerationConfig(stop=("",))


def test_closing_a_generation_stops_decoding(tiny_model: TinyFactory) -> None:
    engine = Engine(tiny_model(vocab_size=16))
    generation = engine.generate([0, 3], GenerationConfig(max_new_tokens=100, ignore_eos=True))
    next(iter(generation))
    generation.close()
    assert generation.result.finish_reason == "cancelled"
    assert generation.result.stats.target_passes < 5


TEXTS = ["naïve café — 5 €", "日本語のテキスト", "emoji 🙂🚀 and ZWJ 👩‍💻", "plain ascii"]


@pytest.mark.parametrize("text", TEXTS)
def test_streaming_never_splits_a_utf8_character(real_tokenizer: Tokenizer, text: str) -> None:
    ids = real_tokenizer.encode(text)
    detok = IncrementalDetokenizer(real_tokenizer, prompt_tail=real_tokenizer.encode("Say:"))
    deltas = [detok.push([t]) for t in ids]
    deltas.append(detok.flush())
    assert all(REPLACEMENT_CHAR not in d for d in deltas)
    assert "".join(deltas) == text
    split = any(REPLACEMENT_CHAR in real_tokenizer.decode([t]) for t in ids)  # a character over two tokens
    if split:
        assert "" in deltas[:-1], "a token holding part of a character must be held back"
    if "🙂" in text or "日本" in text:
        assert split, "this text is meant to exercise characters split across byte-level tokens"
