"""Token trees: a drafter proposes several continuations at once, the target verifies all in one pass.

After SpecInfer (Miao et al. 2024) and EAGLE-2 (Li et al. 2024). A tree's nodes are draft tokens, each
with a parent: -1 for the root (the last emitted token, not yet in the target's cache), else an earlier
node, so the nodes are in an order where a parent comes before its children. The target reads the root
and every node in one pass (input row 0 is the root, row i + 1 is node i); each row attends to the cache
and to its own ancestors only, at the position its depth gives it.

Verification is exact for any sampling settings: at the root, draw the next token from the target's
processed distribution (its argmax when greedy); where a child carries that token, keep the child and
draw again from its row; else emit the drawn token and stop. Every emitted token is a plain draw from the
target given the tokens before it; the drafts only decide how many draws one pass makes. That suits
deterministic drafts (greedy: a head's most likely tokens), which carry no q. Under sampling a head
draws its tree from its own q and the tree is verified by recursive rejection sampling instead, which
keeps more of it (decoding/tree_sampling.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoding.sampling import SamplingParams, next_token


def depths_of(parents: list[int]) -> list[int]:
    """[N] each node's depth from its parent ([N], -1 for the root, parents first): 1 for the root's
    children, 2 for theirs, ..."""
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths


@dataclass(frozen=True)
class TokenTree:
    tokens: list[int]  # [N] node tokens
    parents: list[int]  # [N] each node's parent node, -1 for the root

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"a tree of {len(self.tokens)} tokens with {len(self.parents)} parents")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"node {i} has parent {p}: a parent must come before its child")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> list[int]:
        """[N] 1 for the root's children, 2 for theirs, ..."""
        return depths_of(self.parents)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    def truncated(self, n: int) -> TokenTree:
        """The first n nodes: still a tree, since parents come first."""
        return TokenTree(self.tokens[:n], self.parents[:n])

    def positions(self, start: int) -> torch.Tensor:
        """(N + 1,) int64 sequence positions of the input rows: the root at `start`, a node at start + depth."""
        return torch.tensor([start, *(start + d for d in self.depths)])

    def attention_mask(self, start: int) -> torch.Tensor:
        """(N + 1, start + N + 1) bool: row r reads the cache [0, start) and its ancestors and itself."""
        n = len(self) + 1
        tree = torch.zeros(n, n, dtype=torch.bool)  # (N + 1, N + 1) ancestor-or-self among the rows
        tree[0, 0] = True
        for i, p in enumerate(self.parents):
            tree[i + 1] = tree[p + 1]
            tree[i + 1, i + 1] = True
        return torch.cat([torch.ones(n, start, dtype=torch.bool), tree], dim=1)

    def children(self) -> list[dict[int, int]]:
        """[N + 1] for each input row, its children's rows by token."""
        kids: list[dict[int, int]] = [{} for _ in range(len(self) + 1)]
        for i, (token, p) in enumerate(zip(self.tokens, self.parents, strict=True)):
            kids[p + 1].setdefault(token, i + 1)
        return kids

    def first_path(self) -> list[int]:
        """[N'] the nodes of each node's first child from the root: the drafter's single best guess."""
        path: list[int] = []
        row = 0
        kids = self.children()
        while kids[row]:
            row = next(iter(kids[row].values()))
            path.append(row - 1)
        return path


@dataclass(frozen=True)
class TreeVerdict:
    rows: list[int]  # input rows of the accepted nodes, root to leaf (the root, row 0, not included)
    next_token: int  # the target's own draw after the last accepted node
    # sampled trees: candidates tried at each row visited (the root, then each accepted node): the last
    # one tried was kept, except at the final row, where every one tried was rejected
    tried: tuple[int, ...] = ()

    @property
    def num_accepted(self) -> int:
        return len(self.rows)


def verify_tree(tree: TokenTree, logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator) -> TreeVerdict:
    """Walk the tree along the target's own draws. logits: (N + 1, V) the target's, one row per input row."""
    kids = tree.children()
    rows: list[int] = []
    row = 0
    while True:
        token = next_token(logits[row], params, generator)
        child = kids[row].get(token)
        if child is None:
            return TreeVerdict(rows, token)
        rows.append(child)
        row = child
