"""Verify draft tokens against the target: speculative sampling that keeps the target's distribution.

Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", Algorithm 1; Chen et
al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling". Words as in vLLM:
*accepted* drafts are kept, a *recovered* token is resampled where a draft was rejected, a *bonus* token
is sampled from the target when every draft was accepted. Every verification emits accepted + 1 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoding.sampling import sample


@dataclass(frozen=True)
class Verdict:
    num_accepted: int  # drafts kept, a prefix of the proposal
    next_token: int  # the recovered token, or the bonus token when every draft was accepted
    is_bonus: bool


def verify_greedy(
    # [k] proposed tokens
    draft_tokens: list[int],
    # [k + 1] the target's (masked) argmax after each prefix
    target_argmax: list[int],
) -> Verdict:
    """Greedy: keep drafts while they equal the target's argmax; the first mismatch is replaced by it."""
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == target_argmax[n]:
        n += 1
    return Verdict(n, target_argmax[n], n == len(draft_tokens))


def rejection_sample(
    # [k] proposed tokens
    draft_tokens: list[int],
    # [k, V] draft distribution q each token was sampled from; None: one-hot (n-gram, grammar-forced)
    draft_probs: torch.Tensor | None,
    # [k + 1, V] processed target distribution p after each prefix
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> Verdict:
    k = len(draft_tokens)
    if k == 0:
        return Verdict(0, sample(target_probs[0], generator), True)
    idx = torch.tensor(draft_tokens)  # [k]
    rows = torch.arange(k)
    p_x = target_probs[rows, idx]  # [k]
    q_x = draft_probs[rows, idx] if draft_probs is not None else torch.ones_like(p_x)  # [k]
    u = torch.rand(k, generator=generator, dtype=p_x.dtype)  # [k]
    # accept draft x with probability min(1, p(x) / q(x)):  u < p/q  <=>  u * q < p  (q(x) > 0: x ~ q)
    accepted = (u * q_x < p_x).tolist()
    n = accepted.index(False) if False in accepted else k
    if n == k:
        # every draft accepted: the bonus token comes from p after the last draft
        return Verdict(k, sample(target_probs[k], generator), True)
    # rejected at n: resample from the residual norm(max(p - q, 0)); for one-hot q that is p without x
    p = target_probs[n]
    if draft_probs is None:
        residual = p.clone()
        residual[draft_tokens[n]] = 0.0
    else:
        residual = (p - draft_probs[n]).clamp_min(0.0)
    if not bool(residual.sum() > 0):  # p == q up to rounding: the rejection had probability ~0; p is the residual
        residual = p
    return Verdict(n, sample(residual, generator), False)
