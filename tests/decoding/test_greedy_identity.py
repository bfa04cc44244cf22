"""Greedy speculative output equals target-only greedy output, token for token, for every drafter."""

from __future__ import annotations

import pytest
import torch

from decoding.build import MIN_DRAFT_PEAK
from decoding.drafters import CompositeDrafter, Drafter, DraftModelDrafter, FallbackDrafter, HeadDrafter, NgramDrafter
from decoding.drafters.head_tree import TreeShape
from decoding.generate import Engine, GenerationConfig
from decoding.loading import LoadedModel
from decoding.pass_costs import PassCosts
from decoding.stats import SpecStats
from tests.conftest import TinyFactory, perturbed_copy
from tests.decoding.heads import trained_head

TREE = TreeShape(nodes=8, branch=3, width=2, depth=5, min_score=0.0)
PROMPTS = [
    [0, 3, 4, 5, 3, 4, 5, 3, 4],  # repetitive: the n-gram drafter has matches
    [0, 7, 2, 9, 11, 2, 9],
    [0, 5],
    list(range(1, 40)) + list(range(1, 20)),
]


def _tokens(engine: Engine, prompt: list[int], n: int, speculative: bool) -> tuple[list[int], SpecStats]:
    stats = SpecStats()
    config = GenerationConfig(max_new_tokens=n, speculative=speculative, ignore_eos=True)
    out = [t for step in engine.decode_tokens(prompt, config, stats) for t in step]
    return out, stats


def _drafters(target: LoadedModel, kind: str) -> Drafter:
    if kind == "ngram":
        return NgramDrafter(min_n=1, max_n=3)
    if kind in ("eagle-head", "eagle3-head", "tokens-head", "eagle+copy-head"):  # each design, trained briefly
        return HeadDrafter(trained_head(target, kind.removesuffix("-head")), max_tokens=6)
    if kind == "eagle+copy-head-subset":  # half the vocabulary fixed, the rest scored from the context
        return HeadDrafter(trained_head(target, "eagle+copy", vocab=torch.arange(32)), max_tokens=6)
    if kind == "ngram+eagle-head":  # the head chains its own features over the n-gram's proposals
        return CompositeDrafter([NgramDrafter(min_n=2, max_n=3, max_tokens=2),
                                 HeadDrafter(trained_head(target, "eagle"), max_tokens=6)])
    if kind == "ngram|eagle-head-cut":  # the shipped arrangement, with the confidence cut of the shipped default
        return FallbackDrafter([NgramDrafter(min_n=2, max_n=3),
                                HeadDrafter(trained_head(target, "eagle"), max_tokens=6, min_peak=MIN_DRAFT_PEAK)])
    if kind == "eagle-head-tree":  # a draft tree per pass, verified by walking it (decoding/tree.py)
        return HeadDrafter(trained_head(target, "eagle"), max_tokens=6, tree=TREE)
    if kind in ("ngram|eagle-head-tree", "ngram|eagle3-head-tree", "ngram|eagle+copy-head-tree"):  # as shipped
        design = kind.split("|")[1].removesuffix("-head-tree")
        return FallbackDrafter([NgramDrafter(min_n=2, max_n=3),
                                HeadDrafter(trained_head(target, design), max_tokens=6, tree=TREE)])
    if kind == "ngram|eagle-head-tree-fitted":  # as shipped, sized for a machine where 5+ rows cost 1.6 steps
        drafter = FallbackDrafter([NgramDrafter(min_n=2, max_n=3),
                                   HeadDrafter(trained_head(target, "eagle"), max_tokens=6, tree=TREE)])
        drafter.fit(PassCosts((1.0, 1.05, 1.1, 1.1, 1.6, 1.6, 1.6, 1.6, 1.7)))
        return drafter
    if kind == "ngram+eagle-head-tree":  # chained after the n-gram's tokens, the tree's first branch
        return CompositeDrafter([NgramDrafter(min_n=2, max_n=3, max_tokens=2),
                                 HeadDrafter(trained_head(target, "eagle"), max_tokens=6, tree=TREE)])
    draft = DraftModelDrafter(perturbed_copy(target.model, seed=7, noise=0.05), max_tokens=6)
    if kind == "draft-cut":
        return DraftModelDrafter(perturbed_copy(target.model, seed=7, noise=0.05), max_tokens=6, min_peak=0.5)
    if kind == "draft":
        return draft
    return CompositeDrafter([NgramDrafter(min_n=2, max_n=3), draft])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["ngram", "draft", "composite", "eagle-head", "tokens-head", "ngram+eagle-head",
                                  "draft-cut", "ngram|eagle-head-cut", "eagle-head-tree", "ngram|eagle-head-tree",
                                  "ngram+eagle-head-tree", "eagle3-head", "ngram|eagle3-head-tree",
                                  "eagle+copy-head", "eagle+copy-head-subset", "ngram|eagle+copy-head-tree",
                                  "ngram|eagle-head-tree-fitted"])
def test_speculative_greedy_equals_target_only(tiny_model: TinyFactory, dtype: torch.dtype, kind: str) -> None:
    target = tiny_model(vocab_size=64, dtype=dtype, seed=1, logit_scale=2.0)
    base = Engine(target)
    spec = Engine(target, _drafters(target, kind), max_draft_tokens=6)
    total, baseline = SpecStats(), SpecStats()
    for prompt in PROMPTS:
        expected, plain = _tokens(base, prompt, 40, speculative=False)
        got, stats = _tokens(spec, prompt, 40, speculative=True)
        assert got == expected, f"{kind}/{dtype}: speculative output diverged for prompt {prompt[:6]}..."
        total.merge(stats)
        baseline.merge(plain)
    # the comparison means something only if drafts were actually verified and some accepted
    assert total.draft_tokens > 0 and total.accepted_tokens > 0
    # and some were rejected too, so the rollback path ran
    assert total.accepted_tokens < total.draft_tokens
    # and the accepted drafts saved passes: fewer than target-only took for the same tokens (a bound of
    # 4 * 40 + 4 could not fail: every pass yields a token, a review showed)
    assert total.target_passes < baseline.target_passes == len(PROMPTS) * 40, "speculation should save passes"
    if kind.endswith("-tree") and not kind.startswith("ngram+"):
        assert total.tree_passes > 0, "the tree path ran"


def test_speculation_off_per_request_uses_no_drafts(tiny_model: TinyFactory) -> None:
    target = tiny_model(vocab_size=64, seed=1)
    spec = Engine(target, NgramDrafter(min_n=1, max_n=3))
    _, stats = _tokens(spec, PROMPTS[0], 20, speculative=False)
    assert stats.draft_tokens == 0 and stats.target_passes == 20


def test_a_head_that_finds_no_tree_worth_its_rows_takes_plain_steps(tiny_model: TinyFactory) -> None:
    """Fitted to a machine where every extra row costs 4 steps, the head's trees have no nodes: those are
    plain steps, not verify passes (they were counted as tree passes that accepted nothing, a review found)."""
    target = tiny_model(vocab_size=64, dtype=torch.float64, seed=1, logit_scale=2.0)
    drafter = HeadDrafter(trained_head(target, "eagle"), max_tokens=6, tree=TREE)
    drafter.fit(PassCosts((1.0,) + (4.0,) * 8))
    for prompt in PROMPTS:
        expected, _ = _tokens(Engine(target), prompt, 12, speculative=False)
        got, stats = _tokens(Engine(target, drafter, max_draft_tokens=6), prompt, 12, speculative=True)
        assert got == expected
        assert (stats.draft_tokens, stats.verify_passes, stats.tree_passes) == (0, 0, 0)
        assert stats.target_passes == 12  # the prompt's pass, then one plain step per token after the first
