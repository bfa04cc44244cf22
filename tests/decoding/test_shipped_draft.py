"""The draft head shipped for the embedded target: it loads by default, shares the target's tokenizer,
drafts tokens the target accepts, and leaves greedy output unchanged."""

from __future__ import annotations

import pytest

from decoding.build import build_drafter, load_draft
from decoding.draft_head import DraftHead, card_of
from decoding.drafts import shipped_draft
from decoding.generate import Engine, GenerationConfig
from decoding.loading import LoadedModel

pytestmark = pytest.mark.slow


def test_shipped_draft_loads_for_the_embedded_target(embedded_model: LoadedModel) -> None:
    path = shipped_draft(embedded_model.name)
    assert path is not None and path.stat().st_size <= 25 * 2**20
    card = card_of(path)
    assert card["target"] == embedded_model.name and card["design"] in ("eagle", "tokens")
    head = load_draft(None, embedded_model)  # the default: no draft named
    assert isinstance(head, DraftHead)
    assert head.config.target_vocab_size == embedded_model.model.args.vocab_size


def test_shipped_draft_is_accepted_and_greedy_output_is_unchanged(embedded_model: LoadedModel) -> None:
    draft = load_draft("embedded", embedded_model)
    engine = Engine(embedded_model, build_drafter(["draft"], embedded_model, draft, 8))
    prompt = embedded_model.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog."}])
    config = GenerationConfig(max_new_tokens=32)
    spec = engine.complete(prompt, config)
    plain = engine.complete(prompt, GenerationConfig(max_new_tokens=32, speculative=False))
    assert spec.token_ids == plain.token_ids
    assert spec.stats.accepted_tokens > 0 and spec.stats.target_passes < plain.stats.target_passes


def test_the_model_card_beside_the_weights_is_the_card_inside_them() -> None:
    from decoding.distill.card import card_markdown

    path = shipped_draft("smollm2-135m")
    assert path is not None
    card = card_of(path)
    title = f"Draft head for {card['target']} ({card['design']})"
    assert path.with_suffix(".md").read_text() == card_markdown(card, title)  # as `draftgate distill` writes it
    resumed = {**card, "training": {**card["training"], "resumed_at_update": 1200}}
    assert "resumed at update 1200" in card_markdown(resumed, title)
