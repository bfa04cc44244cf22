"""Speculative sampling reproduces the target's distribution exactly.

On a tiny float64 model with a vocabulary of 5, the joint distribution of the first four sampled tokens
is computed exactly by enumerating every prefix with target-only forwards. Speculative generations (one
fixed seed each) are then counted and compared with a chi-square goodness-of-fit test. The first token
comes from prefill; the next three go through the verifier with up to two drafts per pass (accepted,
recovered and bonus paths, rejection at either position).

The bound: with N samples the statistic is ~chi2(df) under exactness; we reject at p < 1e-4. A
deliberately wrong sampler (emit the draft's own samples) must be rejected by the same test, which
shows the test has the power to fail.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy import stats as scipy_stats

from decoding.drafters import (
    CompositeDrafter,
    Drafter,
    DraftModelDrafter,
    FallbackDrafter,
    HeadDrafter,
    NgramDrafter,
)
from decoding.drafters.base import Proposal
from decoding.drafters.head_tree import TreeShape
from decoding.generate import Engine, GenerationConfig
from decoding.loading import LoadedModel
from decoding.model import Transformer
from decoding.sampling import SamplingParams, processed_probs
from decoding.stats import SpecStats
from tests.conftest import TinyFactory, perturbed_copy
from tests.decoding.heads import trained_head

VOCAB = 5
NEW_TOKENS = 4
SAMPLES = 4000
ALPHA = 1e-4
PROMPT = [0, 2, 3, 4, 2, 3, 4, 2, 3]  # repeats, so the n-gram drafter proposes


def exact_joint(model: Transformer, prompt: list[int], params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(t1, ..., t4) under target-only sampling, by enumeration of all prefixes."""
    model.setup_cache(len(prompt) + NEW_TOKENS + 1)

    def extend(prefix: tuple[int, ...], mass: float, joint: dict[tuple[int, ...], float]) -> None:
        if len(prefix) == NEW_TOKENS:
            joint[prefix] = mass
            return
        logits = model(torch.tensor([*prompt, *prefix]), 0, last_only=True)  # [1, V]
        probs = processed_probs(logits, params)[0]  # [V]
        for token in range(VOCAB):
            if probs[token] > 0:
                extend((*prefix, token), mass * float(probs[token]), joint)

    joint: dict[tuple[int, ...], float] = {}
    extend((), 1.0, joint)
    return joint


def sample_counts(engine: Engine, params: SamplingParams, n: int) -> tuple[dict[tuple[int, ...], int], SpecStats]:
    counts: dict[tuple[int, ...], int] = {}
    total = SpecStats()
    for seed in range(n):
        config = GenerationConfig(
            max_new_tokens=NEW_TOKENS,
            sampling=SamplingParams(params.temperature, params.top_k, params.top_p, seed=seed),
            ignore_eos=True,
        )
        stats = SpecStats()
        out = tuple(t for step in engine.decode_tokens(PROMPT, config, stats) for t in step)
        counts[out] = counts.get(out, 0) + 1
        total.merge(stats)
    return counts, total


def chi_square_pvalue(counts: dict[tuple[int, ...], int], joint: dict[tuple[int, ...], float]) -> float:
    """Goodness of fit; cells with expected count < 5 are pooled into one."""
    n = sum(counts.values())
    outside = sum(c for key, c in counts.items() if key not in joint)
    if outside:
        return 0.0  # a sequence the target cannot produce
    observed, expected = [], []
    pooled_obs, pooled_exp = 0.0, 0.0
    for key, p in joint.items():
        if n * p >= 5:
            observed.append(counts.get(key, 0))
            expected.append(n * p)
        else:
            pooled_obs += counts.get(key, 0)
            pooled_exp += n * p
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    return float(scipy_stats.chisquare(observed, expected).pvalue)


def _target(tiny_model: TinyFactory) -> LoadedModel:
    return tiny_model(vocab_size=VOCAB, dtype=torch.float64, seed=3, logit_scale=0.5, n_layers=1)


# a small tree: greedy, the root's 3 most likely tokens, each expanded by its 2 best (VOCAB is tiny); under
# sampling, drawn from q (tree_sampling.py) in the shape the head's plan gives
TREE = TreeShape(nodes=6, branch=3, width=3, depth=2, min_score=0.0, sampled=True)
# confidence cuts (drafters/chain.py) that bind for a good share of these drafts' distributions
CUT = 0.4
HEAD_CUT = 0.6


class CutCounter:
    """Counts a model drafter's proposals that the confidence cut made shorter than it could draft."""

    def __init__(self, drafter: DraftModelDrafter | HeadDrafter) -> None:
        self.cut = self.whole = 0
        inner = drafter.propose

        def propose(context: list[int], max_tokens: int, *args: object, **kwargs: object) -> Proposal:
            proposal = inner(context, max_tokens, *args, **kwargs)
            if len(proposal) < min(max_tokens, drafter.length.value):
                self.cut += 1
            else:
                self.whole += 1
            return proposal

        drafter.propose = propose


CUTS: dict[str, CutCounter] = {}


def _drafter(kind: str, target: LoadedModel) -> Drafter:
    draft_model = perturbed_copy(target.model, seed=11, noise=0.1)
    if kind == "draft":
        return DraftModelDrafter(draft_model, max_tokens=2)
    if kind == "draft-cut":
        cut = DraftModelDrafter(draft_model, max_tokens=2, min_peak=CUT)
        CUTS[kind] = CutCounter(cut)
        return cut
    if kind == "ngram|eagle-head-cut":  # the shipped arrangement: n-gram where it matches, else the head
        head = HeadDrafter(trained_head(target, "eagle", updates=20), max_tokens=2, min_peak=HEAD_CUT)
        CUTS[kind] = CutCounter(head)
        # untimed: the head drafts from the first pass (its timed gate would wait for plain steps first)
        return FallbackDrafter([NgramDrafter(min_n=2, max_n=3, max_tokens=2), head], timed=False)
    if kind == "ngram":
        return NgramDrafter(min_n=1, max_n=3, max_tokens=2)
    if kind == "eagle-head":  # emits 4 of the 5 tokens: q is zero on the last, as for a real head's subset
        return HeadDrafter(trained_head(target, "eagle", updates=6, vocab=torch.arange(4)), max_tokens=2)
    if kind == "eagle+copy-head":  # a fixed vocabulary of 3 tokens; the prompt's 3 and 4 are scored as context
        head = trained_head(target, "eagle+copy", updates=6, vocab=torch.arange(3))
        return HeadDrafter(head, max_tokens=2)
    if kind == "eagle-head-tree":  # at most 2 deep, as many nodes as the head's 2 drafts allow
        return HeadDrafter(trained_head(target, "eagle", updates=20), max_tokens=2, tree=TREE)
    if kind == "eagle-head-sampled-tree":  # room for 6 nodes 2 deep: 3 candidates per depth (sampled_tree.py)
        return HeadDrafter(trained_head(target, "eagle", updates=20), max_tokens=6, tree=TREE)
    if kind == "eagle3-head-tree":  # a head reading two depths of the target
        return HeadDrafter(trained_head(target, "eagle3", updates=20), max_tokens=2, tree=TREE)
    if kind == "ngram|eagle-head-tree":
        return FallbackDrafter([NgramDrafter(min_n=2, max_n=3, max_tokens=2),
                                HeadDrafter(trained_head(target, "eagle", updates=20), max_tokens=2, tree=TREE)],
                               timed=False)
    if kind == "ngram+eagle-head":
        return CompositeDrafter([NgramDrafter(min_n=2, max_n=3, max_tokens=1),
                                 HeadDrafter(trained_head(target, "eagle", updates=20), max_tokens=2)])
    return CompositeDrafter([NgramDrafter(min_n=2, max_n=3, max_tokens=1), DraftModelDrafter(draft_model)])


PARAMS = {
    "t1.0": SamplingParams(temperature=1.0),
    "t0.7": SamplingParams(temperature=0.7),
    "topk3": SamplingParams(temperature=1.0, top_k=3),
    "topp0.8": SamplingParams(temperature=0.9, top_p=0.8),
}


@pytest.mark.parametrize(
    ("kind", "params_name"),
    [("draft", "t1.0"), ("draft", "t0.7"), ("draft", "topk3"), ("draft", "topp0.8"),
     ("ngram", "t1.0"), ("ngram", "topk3"), ("ngram", "topp0.8"), ("composite", "t0.7"),
     ("eagle-head", "t1.0"), ("eagle-head", "topk3"), ("ngram+eagle-head", "t0.7"),
     ("draft-cut", "t1.0"), ("draft-cut", "topp0.8"), ("ngram|eagle-head-cut", "t1.0"),
     ("eagle-head-tree", "t1.0"), ("eagle-head-tree", "topp0.8"), ("ngram|eagle-head-tree", "t0.7"),
     ("eagle-head-sampled-tree", "t1.0"), ("eagle-head-sampled-tree", "topk3"),
     ("eagle3-head-tree", "t0.7"), ("eagle+copy-head", "t1.0"), ("eagle+copy-head", "topp0.8")],
)
def test_speculative_sampling_matches_target_distribution(tiny_model: TinyFactory, kind: str, params_name: str) -> None:
    target = _target(tiny_model)
    params = PARAMS[params_name]
    joint = exact_joint(target.model, PROMPT, params)
    assert abs(sum(joint.values()) - 1.0) < 1e-9
    engine = Engine(target, _drafter(kind, target), max_draft_tokens=2)
    counts, stats = sample_counts(engine, params, SAMPLES)
    # every path of the verifier ran: accepted drafts, rejected drafts (recovered tokens)
    assert stats.accepted_tokens > 0.05 * stats.draft_tokens
    assert stats.accepted_tokens < 0.95 * stats.draft_tokens
    if kind == "eagle-head-sampled-tree":  # second and third candidates were verified
        assert stats.tree_passes > 0.5 * SAMPLES and stats.draft_tokens > 2 * stats.tree_passes  # > a chain
    if kind in CUTS:  # the cut both bound and let whole chains through
        counter = CUTS[kind]
        calls = counter.cut + counter.whole
        assert calls > 0.1 * SAMPLES and counter.cut > 0.05 * calls and counter.whole > 0.05 * calls
    pvalue = chi_square_pvalue(counts, joint)
    assert pvalue > ALPHA, f"{kind}/{params_name}: samples do not follow the target distribution (p={pvalue:.2e})"


def test_the_test_rejects_a_biased_sampler(tiny_model: TinyFactory) -> None:
    """Power check: the draft's own distribution (what a sampler that accepts everything emits) fails."""
    target = _target(tiny_model)
    params = PARAMS["t1.0"]
    joint = exact_joint(target.model, PROMPT, params)
    draft = LoadedModel("draft", "draft", perturbed_copy(target.model, seed=11, noise=0.1), target.tokenizer)
    counts, _ = sample_counts(Engine(draft), params, SAMPLES)  # target-only decoding of the draft
    assert chi_square_pvalue(counts, joint) < ALPHA


def test_enumeration_covers_all_sequences(tiny_model: TinyFactory) -> None:
    target = _target(tiny_model)
    joint = exact_joint(target.model, PROMPT, PARAMS["t1.0"])
    assert len(joint) == len(list(itertools.product(range(VOCAB), repeat=NEW_TOKENS)))
