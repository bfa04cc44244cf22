"""Copy hints: what prompt lookup would guess next, as an input a draft head reads.

Agents copy from their context, and a one-layer draft head does not learn to copy by itself (measured:
`decoding/drafts/README.md`). So a head with `copy_hint` reads, at each position, the token that
followed the latest earlier occurrence of the context's last n tokens (n = 3, else 2, else 1; Saxena
2023's prompt lookup) and that n, and learns when to trust it. The same index gives the hint in
training (over a whole sequence) and at decode time (over the context, then over a draft's path,
pushed and popped), so the two agree token for token.
"""

from __future__ import annotations

import torch

MAX_N = 3


class HintIndex:
    """The latest position each n-gram (n = 1 .. MAX_N) ended at, among positions with a successor."""

    def __init__(self, max_n: int = MAX_N) -> None:
        self.max_n = max_n
        self.tokens: list[int] = []
        self._tables: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]  # [n] -> {n-gram: end}
        self._undo: list[list[tuple[int, tuple[int, ...], int | None]]] = []  # per pushed token: (n, key, old)

    def push(self, token: int) -> None:
        """Append a token: the n-grams ending just before it now have a successor."""
        changes = []
        end = len(self.tokens) - 1
        for n in range(1, min(self.max_n, end + 1) + 1):
            key = tuple(self.tokens[end + 1 - n : end + 1])
            table = self._tables[n]
            changes.append((n, key, table.get(key)))
            table[key] = end
        self.tokens.append(token)
        self._undo.append(changes)

    def pop(self, count: int = 1) -> None:
        """Take back the last `count` pushed tokens."""
        for _ in range(count):
            for n, key, old in reversed(self._undo.pop()):
                if old is None:
                    del self._tables[n][key]
                else:
                    self._tables[n][key] = old
            self.tokens.pop()

    def forget_undo(self) -> None:
        """Make the tokens so far permanent (a decode loop's verified context)."""
        self._undo.clear()

    def hint(self) -> tuple[int, int]:
        """(guessed next token, n of the match), or (0, 0) where no n-gram of the suffix occurred before."""
        size = len(self.tokens)
        for n in range(min(self.max_n, size), 0, -1):
            end = self._tables[n].get(tuple(self.tokens[size - n :]))
            if end is not None:
                return self.tokens[end + 1], n
        return 0, 0


def sequence_hints(tokens: torch.Tensor) -> torch.Tensor:
    """(T, 2) int64: for each position k of a sequence (T,), the hint after tokens[: k + 1]."""
    index = HintIndex()
    out = []
    for token in tokens.tolist():
        index.push(token)
        out.append(index.hint())
    return torch.tensor(out, dtype=torch.int64).view(-1, 2)


class ContextHints:
    """A request's copy hints: kept per position as its context grows, and computed for draft paths
    beyond it (pushed onto the index and taken back)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._index = HintIndex()
        self._hints: list[tuple[int, int]] = []  # [k] the hint after context[: k + 1]

    def sync(self, context: list[int]) -> None:
        """Take in the context's new tokens (a context that is not an extension starts over)."""
        known = self._index.tokens
        if len(known) > len(context) or context[: len(known)] != known:
            self.reset()
        for token in context[len(self._index.tokens) :]:
            self._index.push(token)
            self._hints.append(self._index.hint())
        self._index.forget_undo()

    def at(self, start: int, end: int) -> torch.Tensor:
        """(end - start, 2): the hints after context[: k + 1] for k in [start, end)."""
        return torch.tensor(self._hints[start:end], dtype=torch.int64).view(-1, 2)

    def after(self, path: list[int]) -> torch.Tensor:
        """(1, 2): the hint after the context followed by the draft tokens `path`."""
        for token in path:
            self._index.push(token)
        hint = self._index.hint()
        self._index.pop(len(path))
        return torch.tensor([hint], dtype=torch.int64)
