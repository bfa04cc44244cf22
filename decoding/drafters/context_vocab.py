"""A draft head's vocabulary for one request: its fixed tokens, then the context's tokens outside them.

A head scores a fixed subset of the target's vocabulary (the tokens the target emits most) to stay
cheap. What an agent copies from its context (names, ids, numbers, code identifiers) is often outside
that subset; a head trained with `context_vocab` also scores every token of the request's context, with
the same LM-head rows, so it can draft them too (drafter cost: one dot product per extra token).
"""

from __future__ import annotations

import torch


class ContextVocab:
    def __init__(self, vocab: torch.Tensor, vocab_size: int, enabled: bool) -> None:
        self.vocab = vocab  # (Vd,) the head's fixed target ids
        self.vocab_size = vocab_size
        self.enabled = enabled
        self.reset()

    def reset(self) -> None:
        self._known = torch.zeros(self.vocab_size, dtype=torch.bool)  # (V,) ids the vocabulary has
        self._known[self.vocab] = True
        self._extra: list[int] = []
        self._seen = 0  # context tokens [0, seen) looked at
        self._extra_t: torch.Tensor | None = None
        self._ids = self.vocab

    def update(self, context: list[int]) -> None:
        """Take in the context's tokens past the ones seen (a request's context only grows)."""
        if not self.enabled or len(context) <= self._seen:
            return
        new = torch.tensor(context[self._seen :]).unique()  # (m,)
        new = new[~self._known[new]]
        self._seen = len(context)
        if new.numel():
            self._known[new] = True
            self._extra += new.tolist()
            self._extra_t = torch.tensor(self._extra)
            self._ids = torch.cat([self.vocab, self._extra_t])

    @property
    def extra(self) -> torch.Tensor | None:
        """(n,) the context's ids outside the fixed vocabulary, scored after it; None without any."""
        return self._extra_t

    @property
    def ids(self) -> torch.Tensor:
        """(Vd + n,) the target id of each logit the head returns."""
        return self._ids
