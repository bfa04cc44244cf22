"""The draft loop both model drafters share: up to k tokens from a model's logits, each drawn from the
same masked, processed distribution the verifier will use for q (argmax when greedy), the grammar
advanced over them and rolled back at the end (the engine re-advances over what the target accepts).

The chain stops early where the model is unsure: before drawing a draft whose distribution's peak (its
most likely token's probability, after the mask and sampling processing) is below `min_peak`. The rule
reads the distribution, never the token drawn from it, so every token proposed is still a plain sample
of q and rejection sampling stays exact; it only saves verifying drafts that would mostly be rejected."""

from __future__ import annotations

from collections.abc import Callable

import torch

from decoding.constraints.base import Grammar
from decoding.drafters.base import Proposal
from decoding.sampling import SamplingParams, processed_probs, sample


def draft_chain(
    name: str,
    logits: torch.Tensor,  # [Vd] the model's logits for the first draft, over `vocab` ([V] when None)
    k: int,
    params: SamplingParams,
    generator: torch.Generator,
    grammar: Grammar | None,
    step: Callable[[int, int], torch.Tensor],  # (token, i) -> [Vd] logits for draft i + 1
    vocab: torch.Tensor | None = None,  # [Vd] the target ids a model with a vocabulary subset can emit
    vocab_size: int = 0,  # V, the target's vocabulary: the width of q (with `vocab`)
    min_peak: float = 0.0,  # stop before a draft whose distribution peaks below this
) -> Proposal:
    """A subset model drafts in its own Vd-wide space (mask, softmax, top-p, argmax over 8192 ids, not
    49152); q outside the subset is 0, and rows of q are widened to [V] for the verifier."""
    tokens: list[int] = []
    rows: list[torch.Tensor] = []
    for i in range(k):
        allowed = grammar.allowed_mask() if grammar is not None else None  # [V]
        if allowed is not None and vocab is not None:
            allowed = allowed[vocab]  # [Vd]
            if not bool(allowed.any()):
                break  # the grammar wants a token this model cannot emit
        if params.greedy:
            masked = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))  # [Vd]
            if min_peak > 0 and float(torch.softmax(masked.float(), dim=-1).max()) < min_peak:
                break
            j = int(masked.argmax().item())
        else:
            mask = None if allowed is None else allowed.unsqueeze(0)
            q = processed_probs(logits.unsqueeze(0), params, mask)[0]  # [Vd]
            if min_peak > 0 and float(q.max()) < min_peak:
                break
            j = sample(q, generator)
            rows.append(q if vocab is None else torch.zeros(vocab_size, dtype=q.dtype).index_copy_(0, vocab, q))
        token = j if vocab is None else int(vocab[j])
        tokens.append(token)
        if grammar is not None:
            grammar.accept(token)
        if i + 1 < k:
            logits = step(token, i)
    if grammar is not None:
        grammar.rollback(len(tokens))
    probs = torch.stack(rows) if rows else None  # [k, V]
    return Proposal(tokens=tokens, probs=probs, sources=[name] * len(tokens), model_drafted=len(tokens))
