"""Sampled draft trees: several candidates per node, drawn from q without replacement, verified by
recursive rejection sampling so that every emitted token is still an exact draw from the target.

After Jeon et al. 2024, "Recursive Speculative Decoding: Accelerating LLM Inference via Sampling
Without Replacement" (RSD-C), which generalises Leviathan et al.'s speculative sampling (one candidate)
to several. At a node with target distribution p, its candidates x1, x2, ... are a sample without
replacement from the drafter's q (x_i ~ q_i: q with x1 .. x_{i-1} removed, renormalised):

    accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), and go on from x_i's row;
    else p_{i+1} = norm(max(p_i - q_i, 0)) and try the next candidate;
    when every candidate is rejected, emit a draw from the last residual p_{m+1}.

Why it is exact: for any q_i, one such step emits x_i with probability min(p_i, q_i)(x_i) and otherwise
hands on the residual, whose mass is exactly what is left of p_i; by induction from the last candidate,
each step's output follows p_i whatever x1 .. x_{i-1} were, so the node's output follows p_1 = p. The
number of candidates a node gets may depend on anything drawn before them (a stopping rule), never on
the candidates' own values: a drafter that kept only the candidates it likes would bias the draw.

With one candidate per node this is the chain's rejection sampler; with greedy decoding (one-hot p) or
deterministic drafts (one-hot q) it reduces to walking the tree along the target's own draws (tree.py).
"""

from __future__ import annotations

import torch

from decoding.sampling import sample
from decoding.tree import TokenTree, TreeVerdict


def draw_without_replacement(q: torch.Tensor, m: int, generator: torch.Generator) -> list[int]:
    """The first `m` tokens of a draw without replacement from q ([V] weights, any positive total), in
    draw order: the Gumbel top-k trick (each key log q + Gumbel noise; the keys' order is a sequential
    draw without replacement). Fewer than m where q has fewer tokens with weight."""
    u = torch.rand(q.shape[0], generator=generator, dtype=torch.float64)  # [V] in [0, 1)
    keys = q.to(torch.float64).log() - (-u.log()).log()  # [V] -inf where q is 0
    m = min(m, int((q > 0).sum()))
    if m <= 0:
        return []
    return [int(i) for i in torch.topk(keys, m).indices.tolist()]


def verify_sampled_tree(
    tree: TokenTree,
    # [N + 1, V] the processed target distribution p after each input row (row 0 the root)
    target_probs: torch.Tensor,
    # [N, V] the distribution node i was drawn from before its earlier siblings were taken out of it:
    # siblings drawn without replacement share their parent's q; a deterministic node's row is one-hot
    draft_probs: torch.Tensor,
    generator: torch.Generator,
) -> TreeVerdict:
    """Recursive rejection sampling down the tree; a node's children are tried in the order they were
    drawn (node order)."""
    kids = tree.children()  # each row's children in node order: the draw order
    rows: list[int] = []
    counts: list[int] = []  # candidates tried at each row visited
    row = 0
    while True:
        p = target_probs[row]  # [V] p_1
        tried: list[int] = []  # the candidates rejected so far
        counts.append(0)
        for child in kids[row].values():
            counts[-1] += 1
            x = tree.tokens[child - 1]
            q = draft_probs[child - 1]  # [V]
            if tried:  # drawn without the candidates before it (a one-hot q is unchanged)
                q = q.clone()
                q[tried] = 0.0
                q = q / q.sum()
            # accept x with probability min(1, p(x) / q(x)):  u * q < p  (q(x) > 0: x was drawn from q)
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if u * float(q[x]) < float(p[x]):
                rows.append(child)
                row = child
                break
            residual = (p - q).clamp_min(0.0)
            mass = residual.sum()
            if bool(mass > 0):  # else p == q: the rejection had probability ~0; p stays
                p = residual / mass
            tried.append(x)
        else:
            return TreeVerdict(rows, sample(p, generator), tuple(counts))
