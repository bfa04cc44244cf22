"""Sampled draft trees: draws without replacement follow the sequential draw, recursive rejection
sampling emits exact draws from the target, and the plan spends a pass's rows where they keep most.

Statistical checks use a fixed seed and reject at p < 1e-4 (chi-square goodness of fit); each has a
deliberately biased counterpart that the same check must reject, so the checks can fail.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from scipy import stats as scipy_stats

from decoding.drafters import HeadDrafter
from decoding.drafters.head_tree import TreeShape
from decoding.drafters.sampled_tree import RETRY_ACCEPTANCE, plan_tree
from decoding.sampling import SamplingParams
from decoding.tree import TokenTree, TreeVerdict
from decoding.tree_sampling import draw_without_replacement, verify_sampled_tree
from tests.conftest import TinyFactory
from tests.decoding.heads import trained_head

ALPHA = 1e-4
TRIALS = 20000
V = 6


def _pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness of fit of counts [K] to probs [K] (cells expected under 5 pooled)."""
    counts, probs = counts.double(), probs.double()
    expected = probs / probs.sum() * counts.sum()
    big = expected >= 5
    obs = [*counts[big].tolist(), float(counts[~big].sum())]
    exp = [*expected[big].tolist(), float(expected[~big].sum())]
    if exp[-1] == 0:
        if obs[-1] > 0:
            return 0.0
        obs, exp = obs[:-1], exp[:-1]
    return float(scipy_stats.chisquare(obs, exp).pvalue)


def test_draws_without_replacement_follow_the_sequential_draw() -> None:
    q = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    g = torch.Generator().manual_seed(0)
    pairs = torch.zeros(5, 5)
    for _ in range(TRIALS):
        first, second = draw_without_replacement(q, 2, g)
        pairs[first, second] += 1
    # P(i then j) = q_i * q_j / (1 - q_i): the first draw from q, the second from q without it
    expected = torch.zeros(5, 5)
    for i in range(5):
        for j in range(5):
            if i != j:
                expected[i, j] = q[i] * q[j] / (1 - q[i])
    assert pairs.diagonal().sum() == 0 and pairs[4].sum() == 0 and pairs[:, 4].sum() == 0
    assert _pvalue(pairs.flatten(), expected.flatten()) > ALPHA
    # with replacement (two independent draws) is a different distribution, and the check sees it
    twice = torch.zeros(5, 5)
    for _ in range(TRIALS):
        i, j = (int(torch.multinomial(q, 1, generator=g)) for _ in range(2))
        twice[i, j] += 1
    assert _pvalue(twice.flatten(), expected.flatten()) < ALPHA
    # no more candidates than tokens with weight
    assert sorted(draw_without_replacement(q, 9, g)) == [0, 1, 2, 3]


# root -> three candidates a, b, c drawn from q0; a -> two candidates drawn from q1
def _dists(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(6, V, generator=g, dtype=torch.float64) * 1.5, -1)  # [rows, V]
    q0 = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 1.5, -1)  # [V]
    q1 = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 1.5, -1)
    q0[V - 1] = 0.0  # a drafter that cannot propose every token (a head's vocabulary subset)
    return p, q0 / q0.sum(), q1


Verifier = Callable[[TokenTree, torch.Tensor, torch.Tensor, torch.Generator], TreeVerdict]


def _emitted_pairs(verify: Verifier, select: Callable[[list[int], torch.Tensor], list[int]] | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Counts of the first emitted token [V], and of (first, second) [V, V] where two were emitted;
    and p's rows by the first token's row."""
    p, q0, q1 = _dists(7)
    g = torch.Generator().manual_seed(1)
    first = torch.zeros(V)
    second = torch.zeros(V, V)
    for _ in range(TRIALS):
        top = draw_without_replacement(q0, 3, g)
        if select is not None:
            top = select(top, q0)
        below = draw_without_replacement(q1, 2, g)
        tree = TokenTree([*top, *below], [-1] * len(top) + [0, 0])
        target = torch.stack([p[0], *(p[1 + i] for i in range(len(tree)))])  # [N + 1, V]
        draft = torch.stack([q0] * len(top) + [q1] * 2)  # [N, V]
        verdict = verify(tree, target, draft, g)
        emitted = [*(tree.tokens[r - 1] for r in verdict.rows), verdict.next_token]
        first[emitted[0]] += 1
        if verdict.rows and verdict.rows[0] == 1:  # the spine node a: its row's p gives the next token
            second[emitted[0], emitted[1]] += 1
    return first, second, p


def test_recursive_rejection_sampling_emits_the_targets_draws() -> None:
    first, second, p = _emitted_pairs(verify_sampled_tree)
    assert _pvalue(first, p[0]) > ALPHA  # the root's candidates tried in turn, then the residual
    # after the spine node a: its two candidates, then the residual; whatever a was
    rows = second.sum(-1) > 200
    assert int(rows.sum()) >= 2
    for token in rows.nonzero().flatten().tolist():
        assert _pvalue(second[token], p[1]) > ALPHA


def test_the_check_rejects_candidates_kept_for_their_own_value() -> None:
    """Power check: a drafter that keeps a candidate only when q rates it (a choice made after seeing
    it) biases the emitted tokens, and the same check sees it."""
    def likeliest_only(top: list[int], q: torch.Tensor) -> list[int]:
        return [t for t in top if q[t] > 0.15] or top[:1]

    first, _, p = _emitted_pairs(verify_sampled_tree, likeliest_only)
    assert _pvalue(first, p[0]) < ALPHA


def test_one_hot_draft_distributions_walk_the_tree() -> None:
    """Deterministic candidates (one-hot q) are kept with probability p(x), as tree.verify_tree does."""
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7], [0.25, 0.25, 0.25, 0.25]])
    tree = TokenTree([1, 0], [-1, -1])
    draft = torch.eye(4)[[1, 0]]  # [2, 4] one-hot rows
    g = torch.Generator().manual_seed(3)
    counts = torch.zeros(4)
    for _ in range(TRIALS):
        verdict = verify_sampled_tree(tree, p, draft, g)
        emitted = [tree.tokens[r - 1] for r in verdict.rows] or [verdict.next_token]
        counts[emitted[0]] += 1
    assert _pvalue(counts, p[0]) > ALPHA


def _keep(rank: int, a: float, r: float) -> float:
    return a if rank == 1 else (1 - a) * (1 - r) ** (rank - 2) * r


@pytest.mark.parametrize(("nodes", "depth", "a", "r", "branch"),
                         [(6, 6, 0.5, 0.2, 4), (8, 8, 0.7, 0.25, 4), (8, 2, 0.6, 0.2, 3), (12, 5, 0.3, 0.4, 4)])
def test_the_plan_is_the_likeliest_kept_paths(nodes: int, depth: int, a: float, r: float, branch: int) -> None:
    plan = plan_tree(nodes, depth, a, r, branch)
    assert len(plan.parents) == nodes and max(plan.depths) <= depth
    value: list[float] = []  # each node's chance to be reached and kept: the product along its path
    for p, rank in zip(plan.parents, plan.ranks, strict=True):
        value.append((value[p] if p >= 0 else 1.0) * _keep(rank, a, r))
    assert sorted(value, reverse=True) == pytest.approx(plan.gains)
    # a parent's candidates are ranks 1..m in draw order, parents come first, depth by depth
    for parent in range(-1, nodes):
        ranks = [plan.ranks[i] for i, p in enumerate(plan.parents) if p == parent]
        assert ranks == list(range(1, len(ranks) + 1)) and len(ranks) <= branch
    assert all(p < i for i, p in enumerate(plan.parents)) and plan.depths == sorted(plan.depths)
    # nothing left out is worth more than what was chosen: each node's next sibling and first child
    frontier = []
    for node in range(-1, nodes):
        if node >= 0 and plan.depths[node] == depth:
            continue  # no deeper
        base = value[node] if node >= 0 else 1.0
        ranks = [plan.ranks[i] for i, p in enumerate(plan.parents) if p == node]
        if len(ranks) < branch:
            frontier.append(base * _keep(len(ranks) + 1, a, r))
    assert max(frontier) <= min(value) + 1e-12


def test_the_plan_is_a_chain_where_drafts_are_kept_and_wide_where_not() -> None:
    assert plan_tree(6, 6, acceptance=0.95).parents == [-1, 0, 1, 2, 3, 4]
    wide = plan_tree(6, 6, acceptance=0.3, retry=0.2)
    assert wide.parents.count(-1) >= 3
    assert plan_tree(1, 5, acceptance=0.3).parents == [-1]


def _drafter(tiny_model: TinyFactory) -> tuple[HeadDrafter, int]:
    target = tiny_model(vocab_size=64, dtype=torch.float32, seed=1, logit_scale=2.0)
    drafter = HeadDrafter(trained_head(target, "eagle"), max_tokens=6, tree=TreeShape(nodes=6, branch=3, sampled=True))
    drafter.prepare(64)
    drafter.observe_features(0, torch.randn(4, target.model.args.dim))
    return drafter, target.model.args.vocab_size


def test_a_sampled_tree_follows_its_plan_with_siblings_drawn_from_one_q(tiny_model: TinyFactory) -> None:
    drafter, vocab = _drafter(tiny_model)
    drafter.length.record(0, 4)  # a request whose first drafts were rejected: more candidates pay
    params = SamplingParams(temperature=1.0)
    proposal = drafter.propose([0, 3, 4, 5], 6, params, torch.Generator().manual_seed(0))
    assert proposal.parents is not None and proposal.probs is not None
    plan = plan_tree(6, 6, drafter.length.acceptance, RETRY_ACCEPTANCE, 3)
    assert proposal.parents == plan.parents and plan.parents.count(-1) > 1
    assert proposal.probs.shape == (6, vocab) and proposal.model_drafted == max(plan.depths)
    tree = TokenTree(proposal.tokens, proposal.parents)
    for kids in tree.children():
        nodes = [r - 1 for r in kids.values()]
        assert len(nodes) == len({tree.tokens[n] for n in nodes})  # siblings differ
        for n in nodes:  # siblings share the q they were drawn from, and each had weight in it
            torch.testing.assert_close(proposal.probs[n], proposal.probs[nodes[0]])
            assert proposal.probs[n, tree.tokens[n]] > 0
    # children of different parents were drawn from different distributions
    assert not torch.equal(proposal.probs[0], proposal.probs[-1])
    chain = proposal.chain()  # the first path, with the q each of its drafts was drawn from
    path = tree.first_path()
    assert chain.probs is not None and chain.tokens == [tree.tokens[i] for i in path]
    torch.testing.assert_close(chain.probs, proposal.probs[path])


def test_under_sampling_a_tree_drafter_drafts_its_chain_unless_asked(tiny_model: TinyFactory) -> None:
    drafter, _ = _drafter(tiny_model)
    drafter.tree = TreeShape(nodes=6, branch=3)  # the default: trees for greedy decoding only
    proposal = drafter.propose([0, 3, 4, 5], 6, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert proposal.parents is None and proposal.probs is not None and len(proposal) >= 1
    greedy = drafter.propose([0, 3, 4, 5], 6, SamplingParams(temperature=0.0), torch.Generator())
    assert greedy.parents is not None and greedy.probs is None


def test_the_drafter_learns_first_and_later_candidates_keep_rates(tiny_model: TinyFactory) -> None:
    drafter, _ = _drafter(tiny_model)
    a0, r0 = drafter.length.acceptance, drafter._retry_kept / drafter._retry_tried
    drafter.observe_candidates((2, 0))  # the root's first candidate rejected, its second kept (a leaf)
    a1, r1 = drafter.length.acceptance, drafter._retry_kept / drafter._retry_tried
    assert a1 < a0 and r1 > r0
    drafter.observe_candidates((1, 1, 3))  # two first candidates kept, then three tried and rejected
    a2 = drafter.length.acceptance
    assert a2 > a1 and drafter._retry_kept / drafter._retry_tried < r1
    drafter.observe(6, 2)  # the engine's summary of the same pass is not counted again
    assert drafter.length.acceptance == a2
    # a sampled tree that a composite verified as a chain (its first path) counts as a chain
    proposal = drafter.propose([0, 3, 4, 5], 6, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert proposal.parents is not None
    drafter.observe(3, 0)
    assert drafter.length.acceptance < a2
