"""Drafters propose what they should, and a draft model's cache survives rollbacks."""

from __future__ import annotations

from dataclasses import replace

import torch

from decoding.drafters import CompositeDrafter, DraftModelDrafter, FallbackDrafter, NgramDrafter
from decoding.generate import Engine, GenerationConfig
from decoding.sampling import SamplingParams
from tests.conftest import TinyFactory, tiny_args, tiny_transformer

GREEDY = SamplingParams()
G = torch.Generator().manual_seed(0)


def test_ngram_proposes_what_followed_the_latest_match() -> None:
    d = NgramDrafter(min_n=2, max_n=3, max_tokens=4)
    context = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    # "1 2 3" occurred at the start (then 4 5 9 1) and later (then 7 8 1 2): the latest wins
    assert d.propose(context, 4, GREEDY, G).tokens == [7, 8, 1, 2]


def test_ngram_prefers_the_longest_match() -> None:
    d = NgramDrafter(min_n=1, max_n=3, max_tokens=2)
    context = [5, 6, 7, 8, 9, 6, 7, 1, 3, 5, 6, 7]
    # bigram "6 7" last continued with 1, but the trigram "5 6 7" continued with 8
    assert d.propose(context, 2, GREEDY, G).tokens == [8, 9]


def test_ngram_without_a_match_proposes_nothing_and_is_incremental() -> None:
    d = NgramDrafter(min_n=2, max_n=3)
    assert d.propose([1, 2, 3, 4], 4, GREEDY, G).tokens == []
    # the index grows with the context: the new bigram "3 4" now has a successor
    assert d.propose([1, 2, 3, 4, 9, 3, 4], 4, GREEDY, G).tokens == [9, 3, 4]
    # a different context (a new request) is re-indexed from scratch
    assert d.propose([7, 7, 8, 7, 7], 4, GREEDY, G).tokens == [8, 7, 7]


def test_ngram_draft_length_adapts_to_acceptance() -> None:
    d = NgramDrafter(min_n=1, max_n=1, max_tokens=6)
    context = [1, 2, 3, 4, 5, 6, 7, 8, 1]
    assert len(d.propose(context, 6, GREEDY, G)) == 6
    d.observe(6, 0)
    d.observe(5, 2)
    assert len(d.propose(context, 6, GREEDY, G)) == 4  # -1 per pass with a rejection
    d.observe(4, 4)
    assert len(d.propose(context, 6, GREEDY, G)) == 6  # +2 after a fully accepted pass
    d.observe(6, 0)
    d.observe(5, 0)
    assert len(d.propose(context, 6, GREEDY, G)) == 4
    # a context that does not extend the last (a composite's rejected forced tokens): the index is rebuilt,
    # what the request's acceptance taught about the length stays (it went back to 6)
    assert d.propose([1, 2, 3, 4, 5, 6, 7, 8, 2], 6, GREEDY, G).tokens == [3, 4, 5, 6]


def test_draft_model_reuses_its_cache_across_rollbacks(tiny_model: TinyFactory) -> None:
    model = tiny_model(vocab_size=32, seed=3).model
    reused = DraftModelDrafter(model, max_tokens=4)
    reused.prepare(64)
    context = [0, 5, 9, 12]
    first = reused.propose(context, 4, GREEDY, G)
    # the target kept 2 drafts and recovered a different third token
    context = context + first.tokens[:2] + [(first.tokens[2] + 1) % 32]
    calls: list[tuple[int, int]] = []  # (rows, start) of each forward pass of the draft model
    forward = model.forward
    model.forward = lambda tokens, start, **kw: calls.append((len(tokens), start)) or forward(tokens, start, **kw)
    second = reused.propose(context, 4, GREEDY, G)
    # it reads only what its cache lacks: the recovered token, after the 4 + 2 positions it kept (the same
    # tokens from a cache recomputed from scratch would pass the comparison below too: a review)
    assert calls[0] == (1, 6) and all(rows == 1 for rows, _ in calls)
    fresh_model = tiny_model(vocab_size=32, seed=3).model
    fresh = DraftModelDrafter(fresh_model, max_tokens=4)
    fresh.prepare(64)
    assert second.tokens == fresh.propose(context, 4, GREEDY, G).tokens
    assert second.probs is None and second.model_drafted == 4


def test_draft_model_samples_with_its_distribution(tiny_model: TinyFactory) -> None:
    model = tiny_model(vocab_size=32, seed=3).model
    d = DraftModelDrafter(model, max_tokens=3)
    d.prepare(64)
    p = d.propose([0, 1, 2], 3, SamplingParams(temperature=1.0, seed=1), torch.Generator().manual_seed(1))
    assert p.probs is not None and p.probs.shape == (3, 32)
    assert all(float(p.probs[i, t]) > 0 for i, t in enumerate(p.tokens))


def test_composite_chains_and_marks_deterministic_rows_one_hot(tiny_model: TinyFactory) -> None:
    model = tiny_model(vocab_size=32, seed=3).model
    ngram = NgramDrafter(min_n=2, max_n=2, max_tokens=2)
    draft = DraftModelDrafter(model, max_tokens=4)
    composite = CompositeDrafter([ngram, draft])
    composite.prepare(64)
    context = [0, 4, 5, 6, 7, 4, 5]
    p = composite.propose(context, 4, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert p.tokens[:2] == [6, 7] and len(p.tokens) == 4
    assert p.sources == ["ngram", "ngram", "draft", "draft"]
    assert p.probs is not None
    assert p.probs[0, 6] == 1.0 and p.probs[1, 7] == 1.0  # one-hot q for the n-gram's tokens
    composite.observe(4, 1)  # the n-gram's second token was rejected: it shortens, the draft is not told
    assert ngram.length.value == 1 and draft.length.value == 4


def test_fallback_drafts_with_the_first_drafter_that_proposes(tiny_model: TinyFactory) -> None:
    model = tiny_model(vocab_size=32, seed=3).model
    ngram = NgramDrafter(min_n=2, max_n=2, max_tokens=4)
    draft = DraftModelDrafter(model, max_tokens=3)
    either = FallbackDrafter([ngram, draft])
    either.prepare(64)
    matched = either.propose([0, 4, 5, 6, 7, 4, 5], 4, GREEDY, G)
    assert matched.sources == ["ngram"] * 4 and matched.tokens == [6, 7, 4, 5]  # no draft tokens appended
    either.observe(4, 0)  # only the n-gram hears of its rejection
    assert ngram.length.value == 3 and draft.length.value == 3
    unmatched = either.propose([0, 4, 5, 6, 7, 4, 5, 9], 4, GREEDY, G)  # "5 9" never occurred before
    assert unmatched.sources == ["draft"] * 3 and unmatched.model_drafted == 3
    either.observe(3, 1)
    assert ngram.length.value == 3 and draft.length.value == 2


def test_behind_lookup_a_model_drafter_sits_out_sampled_requests_unless_asked(tiny_model: TinyFactory) -> None:
    model = tiny_model(vocab_size=32, seed=3).model
    sampled = SamplingParams(temperature=0.7)
    matched, unmatched = [0, 4, 5, 6, 7, 4, 5], [0, 4, 5, 6, 7, 4, 5, 9]  # "5 9" never occurred before
    for sampled_models in (False, True):
        ngram = NgramDrafter(min_n=2, max_n=2, max_tokens=4)
        draft = DraftModelDrafter(model, max_tokens=3)
        either = FallbackDrafter([ngram, draft], sampled_models=sampled_models)
        either.prepare(64)
        # prompt lookup drafts a sampled request either way; greedy ones get the draft where it has no match
        assert either.propose(matched, 4, sampled, G).sources == ["ngram"] * 4
        assert either.propose(unmatched, 4, GREEDY, G).sources == ["draft"] * 3
        proposal = either.propose(unmatched, 4, sampled, torch.Generator().manual_seed(0))
        if sampled_models:
            assert proposal.sources == ["draft"] * 3 and proposal.probs is not None
        else:  # the model did not run: nothing drafted, nothing to verify
            assert len(proposal) == 0 and proposal.model_drafted == 0


def test_a_confidence_cut_stops_the_draft_chain_before_unsure_tokens(tiny_model: TinyFactory) -> None:
    model = tiny_model(vocab_size=32, seed=3, logit_scale=2.0).model
    context = [0, 1, 2, 3]
    sure = DraftModelDrafter(model, max_tokens=6, min_peak=0.0)
    sure.prepare(64)
    full = sure.propose(context, 6, GREEDY, G)
    assert len(full) == 6
    # the draft's own probability of each greedy draft, to place the cut between them
    model.setup_cache(64)
    peaks = []
    for i in range(6):
        logits = model(torch.tensor(context + full.tokens[:i]), 0, last_only=True)[-1]  # [V]
        peaks.append(float(torch.softmax(logits.float(), -1).max()))
    assert max(peaks) > min(peaks)
    threshold = (max(peaks) + min(peaks)) / 2
    first_below = next(i for i, p in enumerate(peaks) if p < threshold)
    unsure = DraftModelDrafter(model, max_tokens=6, min_peak=threshold)
    unsure.prepare(64)
    assert unsure.propose(context, 6, GREEDY, G).tokens == full.tokens[:first_below]
    never = DraftModelDrafter(model, max_tokens=6, min_peak=1.01)
    never.prepare(64)
    assert never.propose(context, 6, GREEDY, G).tokens == []


def test_a_draft_with_a_shorter_context_drafts_nothing_past_it(tiny_model: TinyFactory) -> None:
    """It raised at its cache's end and failed the whole request (a review); now the target goes on alone."""
    target = tiny_model(vocab_size=16, seed=2)  # a context of 256
    draft = tiny_transformer(tiny_args(16, max_seq_len=32), 2, torch.float64, 3.0)  # the same weights, 32
    prompt = [0, *[3, 4, 5, 6, 7] * 8]  # 41 tokens: past the draft's context from the start
    config = GenerationConfig(max_new_tokens=10, ignore_eos=True)
    expected = Engine(target).complete(prompt, replace(config, speculative=False)).token_ids
    result = Engine(target, DraftModelDrafter(draft, max_tokens=4)).complete(prompt, config)
    assert result.token_ids == expected and result.stats.draft_tokens == 0
    short = Engine(target, DraftModelDrafter(draft, max_tokens=4)).complete(prompt[:20], config)
    assert short.stats.draft_tokens > 0  # within its context it drafts
