"""The text a grammar forces from here, found from its token masks (for backends with no jump-forward).

After `{"name":"Ann","` a schema with ordered properties leaves no choice about `age":`, but no single
token is forced: `age`, `a` and `ag` are all allowed, so `Grammar.forced_tokens` sees nothing. At the
byte level the choice is clear: every allowed token starts with the same bytes. `text_forced_by_masks`
follows those shared bytes, token boundary after token boundary, and returns them; the grammar-forced
drafter tokenizes that text as the tokenizer would and proposes the tokens (the target verifies them).
xgrammar finds the same text itself (`find_jump_forward_string`); outlines-core has no such call.
"""

from __future__ import annotations

import torch

from decoding.constraints.base import Grammar

MAX_CANDIDATES = 2048  # more allowed tokens than this: a real choice, not worth comparing bytes


class VocabBytes:
    """The bytes of every token, the first byte as a tensor, and the token that is exactly a byte string."""

    def __init__(self, table: list[bytes | None]) -> None:
        self.table = table
        self.first_byte = torch.tensor([b[0] if b else -1 for b in table])  # [V] -1: no bytes (special)
        self.exact: dict[bytes, int] = {}
        for tid, b in enumerate(table):
            if b:
                self.exact.setdefault(b, tid)


def text_forced_by_masks(grammar: Grammar, vocab: VocabBytes, eos_token_id: int, max_bytes: int = 64) -> str:
    """The longest text every continuation from the grammar's state starts with (state unchanged)."""
    out = b""
    accepted = 0
    try:
        while len(out) < max_bytes:
            mask = grammar.allowed_mask()  # [V]
            if bool(mask[eos_token_id]):
                break  # the output may end here: nothing further is forced
            if not 0 < int(mask.sum()) <= MAX_CANDIDATES:  # cheaper than listing ~49k allowed ids
                break
            ids = mask.nonzero()[:, 0]  # [n]
            first = vocab.first_byte[ids]  # [n]
            if int(first[0]) < 0 or bool((first != first[0]).any()):
                break
            shared = _common_prefix([vocab.table[int(i)] or b"" for i in ids])
            out += shared
            token = vocab.exact.get(shared)
            if token is None or not bool(mask[token]):
                break  # the shared bytes end inside every allowed token: they are forced, the rest is not
            grammar.accept(token)
            accepted += 1
    finally:
        grammar.rollback(accepted)
    return _complete_utf8(out)


def _common_prefix(items: list[bytes]) -> bytes:
    low, high = min(items), max(items)  # the sorted extremes share what every item shares
    n = 0
    while n < min(len(low), len(high)) and low[n] == high[n]:
        n += 1
    return low[:n]


def _complete_utf8(data: bytes) -> str:
    """`data` decoded, without a character cut at its end."""
    for cut in range(min(4, len(data)) + 1):
        try:
            return data[: len(data) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""
