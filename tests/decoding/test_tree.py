"""Draft trees: one target pass over a tree gives each node the logits its own path would, the cache
keeps the accepted path as a sequential pass would, and the head grows well-formed trees."""

from __future__ import annotations

import pytest
import torch

from decoding import kernels
from decoding.drafters import HeadDrafter
from decoding.drafters.context_vocab import ContextVocab
from decoding.drafters.head_tree import TreeShape, grow_tree
from decoding.pass_costs import PassCosts
from decoding.sampling import SamplingParams
from decoding.tree import TokenTree, verify_tree
from tests.conftest import TinyFactory
from tests.decoding.heads import trained_head

# bf16 models attend through the exact kernel (its cache keeps keys transposed): the bits of sequential passes
with_kernel = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not kernels.available(), reason="no C compiler"))

# root -> 5 -> (7 -> 9, 8), root -> 6 -> 7
TREE = TokenTree(tokens=[5, 6, 7, 8, 7, 9], parents=[-1, -1, 0, 0, 1, 2])


def _path(tree: TokenTree, node: int) -> list[int]:
    tokens: list[int] = []
    while node >= 0:
        tokens.insert(0, tree.tokens[node])
        node = tree.parents[node]
    return tokens


def test_tree_shape_positions_and_mask() -> None:
    assert TREE.depths == [1, 1, 2, 2, 2, 3]
    assert TREE.positions(10).tolist() == [10, 11, 11, 12, 12, 12, 13]
    mask = TREE.attention_mask(10)  # (7, 17)
    assert mask.shape == (7, 17) and bool(mask[:, :10].all())
    # node 5 (row 6) reads the root, 5, 7 and itself; not 6's branch
    assert mask[6, 10:].tolist() == [True, True, False, True, False, False, True]
    assert TREE.first_path() == [0, 2, 5]  # the nodes of tokens 5, 7, 9
    with pytest.raises(ValueError, match="parent must come before"):
        TokenTree([1, 2], [1, -1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, with_kernel])
def test_tree_pass_rows_equal_each_paths_own_pass(tiny_model: TinyFactory, dtype: torch.dtype) -> None:
    model = tiny_model(vocab_size=50, dtype=dtype, seed=5).model
    prefix = [0, 8, 13, 21]
    model.setup_cache(64)
    model(torch.tensor(prefix[:-1]), 0)
    root = prefix[-1]
    start = len(prefix) - 1
    tree_logits, _ = model.forward_hidden(torch.tensor([root, *TREE.tokens]), start, tree=TREE)  # (7, V)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    for node in range(len(TREE)):
        path = torch.tensor([root, *_path(TREE, node)])
        logits = model(path, start)  # (len, V) a plain causal pass over this branch alone
        if dtype == torch.bfloat16:
            assert torch.equal(tree_logits[node + 1], logits[-1]), f"node {node}"
        else:
            torch.testing.assert_close(tree_logits[node + 1], logits[-1], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, with_kernel])
def test_keep_path_leaves_the_cache_a_sequential_pass_would(tiny_model: TinyFactory, dtype: torch.dtype) -> None:
    model = tiny_model(vocab_size=50, dtype=dtype, seed=6).model
    model.setup_cache(64)
    assert model.blocks[0].attention.exact_kernel == (dtype == torch.bfloat16)
    seq = [0, 8, 13, 21]
    model(torch.tensor(seq[:-1]), 0)
    start = len(seq) - 1
    model.forward_hidden(torch.tensor([seq[-1], *TREE.tokens]), start, tree=TREE)
    model.keep_path(start, [2, 5])  # accept 6 -> 7 (rows 2 and 5)
    after_tree = model(torch.tensor([11]), start + 3)[0]  # the next token after root, 6, 7
    expected = model(torch.tensor([*seq, 6, 7, 11]), 0)[-1]  # everything afresh
    if dtype == torch.bfloat16:  # split-invariant: the same bits as one prompt pass
        assert torch.equal(after_tree, expected)
    else:
        torch.testing.assert_close(after_tree, expected, rtol=1e-10, atol=1e-10)


def test_verify_tree_follows_the_targets_argmax() -> None:
    logits = torch.full((7, 12), -5.0)  # rows: root, then nodes 0..5
    logits[0, 5] = logits[1, 7] = logits[3, 3] = 1.0  # root wants 5, then 7, then 3 (not the drafted 9)
    verdict = verify_tree(TREE, logits, SamplingParams(temperature=0.0), torch.Generator())
    assert verdict.rows == [1, 3] and verdict.next_token == 3


def test_head_grows_a_well_formed_tree(tiny_model: TinyFactory) -> None:
    target = tiny_model(vocab_size=64, dtype=torch.float32, seed=1, logit_scale=2.0)
    head = trained_head(target, "eagle")
    head.setup_cache(64)
    context = torch.tensor([0, 3, 4, 5, 3, 4])
    feature, logits = head.step(context[1:], torch.randn(5, head.config.dim), 0)
    shape = TreeShape(nodes=10, branch=3, width=2, depth=4, min_score=0.0)
    tree, steps = grow_tree(head, logits[-1], feature[-1:], 5, shape, 8,
                             ContextVocab(head.vocab, 64, enabled=False))
    assert len(tree) == 10 and tree.depth <= 4 and steps == 3
    assert sorted(tree.depths) == tree.depths  # breadth first
    # the root's three best tokens are all children of the root
    best = head.vocab[torch.topk(logits[-1], 3).indices].tolist()
    assert sorted(t for t, p in zip(tree.tokens, tree.parents, strict=True) if p < 0) == sorted(best)
    # a pass capped at 3 drafts (a machine where bigger passes do not pay): the 3 best nodes, no deeper
    small, _ = grow_tree(head, logits[-1], feature[-1:], 5, shape, 8,
                         ContextVocab(head.vocab, 64, enabled=False), max_nodes=3)
    assert len(small) == 3 and small.depth <= 3


def test_head_drafter_proposes_a_tree_and_its_first_branch_as_a_chain(tiny_model: TinyFactory) -> None:
    target = tiny_model(vocab_size=64, dtype=torch.float32, seed=1, logit_scale=2.0)
    drafter = HeadDrafter(trained_head(target, "eagle"), max_tokens=4, tree=TreeShape(nodes=6, min_score=0.0))
    drafter.prepare(64)
    drafter.observe_features(0, torch.randn(4, target.model.args.dim))
    proposal = drafter.propose([0, 3, 4, 5], 4, SamplingParams(temperature=0.0), torch.Generator())
    assert proposal.parents is not None and len(proposal) == 6 and proposal.probs is None
    chain = proposal.chain()  # what a composite drafter chains after other drafters' tokens
    path = TokenTree(proposal.tokens, proposal.parents).first_path()
    assert chain.parents is None and chain.tokens == [proposal.tokens[i] for i in path]
    assert len(chain) >= 2


def test_a_fitted_head_verifies_only_the_nodes_whose_scores_pay_for_their_rows(tiny_model: TinyFactory) -> None:
    target = tiny_model(vocab_size=64, dtype=torch.float32, seed=1, logit_scale=2.0)
    head = trained_head(target, "eagle")

    def fitted(costs: PassCosts) -> tuple[HeadDrafter, int]:
        drafter = HeadDrafter(head, max_tokens=6, tree=TreeShape(nodes=6, min_score=0.0))
        drafter.fit(costs)
        drafter.reset()
        drafter.prepare(64)
        drafter.observe_features(0, torch.randn(4, target.model.args.dim))
        proposal = drafter.propose([0, 3, 4, 5], 6, SamplingParams(temperature=0.0), torch.Generator())
        return drafter, len(proposal)

    assert fitted(PassCosts(relative=(1.0,) * 7))[1] == 6  # rows cost nothing: every node pays
    # a second row costs two more steps: no tree's expected tokens pay for it, so a plain step
    assert fitted(PassCosts(relative=(1.0, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5)))[1] == 0
    drafter, _ = fitted(PassCosts(relative=(1.0, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8)))
    scores = [0.9, 0.8, 0.7, 0.01, 0.01, 0.01]  # decreasing, as the tree ranks its nodes
    assert drafter._tree_size(scores) == 3  # the likely nodes pay for their rows, the unlikely do not
    assert drafter._tree_size([]) == 0
    # a request whose trees kept far fewer tokens than their scores promised: the same scores, no pass
    drafter._tree_kept, drafter._tree_expected = 1.0, 20.0
    assert drafter._tree_size(scores) == 0
