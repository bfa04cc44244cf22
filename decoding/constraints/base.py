"""The grammar protocol the engine speaks, after vLLM's StructuredOutputGrammar.

A `GrammarFactory` is compiled once per schema (and cached); each request gets a fresh `Grammar`, the
matcher state: the mask of allowed next tokens, `accept` to advance over a token, `rollback(n)` to undo
the last n, the tokens the grammar forces next, and whether it has finished. The engine applies the
same mask to the draft's distribution and the target's at every verified position, advances over the
tokens it proposes to build those masks, and rolls back over the rejected ones.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import torch

from decoding.errors import DecodingError


class ConstraintError(DecodingError):
    """A schema the backend cannot compile or does not fully enforce, or a token outside the grammar."""

    code = "invalid_schema"


class UnsupportedKeywordError(ConstraintError):
    """A schema keyword the chosen backend would not enforce (named in the message)."""

    code = "unsupported_schema_keyword"


class CompileTimeoutError(ConstraintError):
    """A schema the backend could not compile within the route's time limit."""

    code = "schema_too_complex"


_SHIFTS = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 words, bit j of word i = token 32 i + j  ->  [V] bool."""
    # bitmask: [ceil(V / 32)] int32
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS) & 1  # [W, 32]
    return bits.reshape(-1)[:vocab_size].bool()


class Grammar(ABC):
    """Per-request matcher state over the token vocabulary."""

    vocab_size: int

    @abstractmethod
    def allowed_mask(self) -> torch.Tensor:
        """[V] bool: the tokens the grammar allows next."""

    @abstractmethod
    def accept(self, token: int) -> None:
        """Advance over `token`; raises ConstraintError if the grammar does not allow it."""

    @abstractmethod
    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens."""

    @abstractmethod
    def is_finished(self) -> bool:
        """True when the grammar is complete (only the end token may follow)."""

    def allows(self, token: int) -> bool:
        return bool(self.allowed_mask()[token])

    def forced_tokens(self, limit: int) -> list[int]:
        """The tokens the grammar leaves no choice about from here (at most `limit`); state unchanged."""
        forced: list[int] = []
        while len(forced) < limit and not self.is_finished():
            allowed = self.allowed_mask().nonzero()
            if allowed.numel() != 1:
                break
            token = int(allowed[0, 0])
            self.accept(token)
            forced.append(token)
        self.rollback(len(forced))
        return forced

    def forced_text(self) -> str:
        """The text every continuation from here starts with, across token boundaries ("" if none, or
        if the backend cannot tell); state unchanged. Unlike `forced_tokens` it sees `age":` forced
        where `a`, `ag` and `age` are all allowed tokens."""
        return ""

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens` the grammar accepts in a row from here; state unchanged."""
        n = 0
        for token in tokens:
            if not self.allows(token):
                break
            self.accept(token)
            n += 1
        self.rollback(n)
        return n


class GrammarFactory(ABC):
    """A compiled grammar; `new()` starts a request's matcher."""

    @abstractmethod
    def new(self) -> Grammar: ...


class TimedGrammar(Grammar):
    """A grammar that adds the time spent in it to `seconds` (what the bench calls the mask cost)."""

    def __init__(self, inner: Grammar) -> None:
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.seconds = 0.0

    def allowed_mask(self) -> torch.Tensor:
        start = time.perf_counter()
        mask = self.inner.allowed_mask()
        self.seconds += time.perf_counter() - start
        return mask

    def accept(self, token: int) -> None:
        start = time.perf_counter()
        try:
            self.inner.accept(token)
        finally:
            self.seconds += time.perf_counter() - start

    def rollback(self, n: int) -> None:
        start = time.perf_counter()
        self.inner.rollback(n)
        self.seconds += time.perf_counter() - start

    def is_finished(self) -> bool:
        start = time.perf_counter()
        done = self.inner.is_finished()
        self.seconds += time.perf_counter() - start
        return done

    def forced_text(self) -> str:
        start = time.perf_counter()
        text = self.inner.forced_text()
        self.seconds += time.perf_counter() - start
        return text
