"""Model specs: missing or bad paths and mismatched drafts are clear errors naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from decoding.build import build_drafter
from decoding.errors import ModelLoadError, TokenizerMismatchError
from decoding.generate import Engine, GenerationConfig
from decoding.hf_weights import to_hf_llama
from decoding.loading import LoadedModel, check_same_tokenizer, load_model
from decoding.sampling import SamplingParams
from tests.conftest import TinyFactory


def test_missing_path_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match=str(missing)):
        load_model(str(missing))


def test_a_file_that_is_not_gguf_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "weights.bin"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match=r"weights\.bin.*expected a \.gguf file"):
        load_model(str(bad))


def test_a_corrupt_gguf_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelLoadError, match=r"broken\.gguf"):
        load_model(str(bad))


def test_a_directory_without_a_model_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=str(tmp_path)):
        load_model(str(tmp_path))


def test_hf_directory_round_trip(tiny_model: TinyFactory, tmp_path: Path) -> None:
    """Save a tiny llama in HF format (weights + tokenizer); load it back as a draftgate model."""
    source = tiny_model(vocab_size=24, dtype=torch.float32, seed=6)
    to_hf_llama(source.model).save_pretrained(tmp_path)
    source.tokenizer.hf.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), dtype="fp32")
    tokens = torch.tensor([0, 4, 9, 13])
    source.model.setup_cache(16)
    loaded.model.setup_cache(16)
    torch.testing.assert_close(loaded.model(tokens, 0), source.model(tokens, 0), rtol=1e-5, atol=1e-5)
    assert loaded.tokenizer.fingerprint() == source.tokenizer.fingerprint()


def test_a_draft_with_another_tokenizer_is_refused_by_name(tiny_model: TinyFactory) -> None:
    target = tiny_model(vocab_size=24)
    other = tiny_model(vocab_size=32)
    draft = LoadedModel("draft", "/models/other-draft", other.model, other.tokenizer)
    with pytest.raises(TokenizerMismatchError, match="/models/other-draft"):
        check_same_tokenizer(target, draft)
    with pytest.raises(TokenizerMismatchError):
        build_drafter(["ngram", "draft"], target, draft, 8)


def test_drafter_names_are_checked(tiny_model: TinyFactory) -> None:
    target = tiny_model()
    with pytest.raises(ModelLoadError, match="unknown drafter 'medusa'"):
        build_drafter(["medusa"], target, None, 8)
    with pytest.raises(ModelLoadError, match="needs a draft model"):
        build_drafter(["draft"], target, None, 8)
    assert build_drafter([], target, None, 8) is None


def test_the_draft_drafts_greedy_requests_and_sampled_ones_only_when_asked(tiny_model: TinyFactory) -> None:
    target, draft = tiny_model(vocab_size=24, seed=1), tiny_model(vocab_size=24, seed=2)
    prompt = [0, 5, 6, 7, 8, 9, 10]
    sampled = GenerationConfig(max_new_tokens=24, ignore_eos=True, sampling=SamplingParams(temperature=0.7, seed=0))
    greedy = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    shipped = Engine(target, build_drafter(["ngram", "draft"], target, draft, 8))
    asked = Engine(target, build_drafter(["ngram", "draft"], target, draft, 8, sampled_draft=True))
    assert "draft" in shipped.complete(prompt, greedy).stats.by_source
    assert "draft" not in shipped.complete(prompt, sampled).stats.by_source  # prompt lookup alone
    assert "draft" in asked.complete(prompt, sampled).stats.by_source
    alone = Engine(target, build_drafter(["draft"], target, draft, 8))  # a lone draft always drafts
    assert "draft" in alone.complete(prompt, sampled).stats.by_source
