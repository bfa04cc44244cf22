"""Copy hints: prompt lookup's guess at every position, the same whether computed over a whole sequence
(training) or over a context and then a draft path pushed and taken back (decoding)."""

from __future__ import annotations

import random

import torch

from decoding.copy_hints import MAX_N, ContextHints, HintIndex, sequence_hints


def brute_force_hint(tokens: list[int]) -> tuple[int, int]:
    """The token after the latest earlier occurrence of the longest suffix (n = MAX_N .. 1) that has one."""
    size = len(tokens)
    for n in range(min(MAX_N, size), 0, -1):
        suffix = tokens[size - n :]
        for end in range(size - 2, n - 2, -1):  # latest first; the occurrence needs a successor
            if tokens[end + 1 - n : end + 1] == suffix:
                return tokens[end + 1], n
    return 0, 0


def test_hints_match_a_brute_force_search() -> None:
    rng = random.Random(0)
    for _ in range(20):
        tokens = [rng.randrange(6) for _ in range(rng.randint(1, 40))]
        hints = sequence_hints(torch.tensor(tokens)).tolist()
        assert hints == [list(brute_force_hint(tokens[: k + 1])) for k in range(len(tokens))]


def test_a_hint_prefers_the_longest_match_then_the_latest() -> None:
    tokens = [5, 6, 7, 1, 6, 7, 2, 9, 7, 3, 6, 7]
    # "6 7" occurred twice before (followed by 1, then 2): the latest wins; "5 6 7" does not match "9 6 7"
    assert sequence_hints(torch.tensor(tokens))[-1].tolist() == [2, 2]
    assert sequence_hints(torch.tensor([4, 8]))[-1].tolist() == [0, 0]  # nothing seen before


def test_push_and_pop_restore_the_index() -> None:
    index = HintIndex()
    for token in [3, 4, 5, 3, 4]:
        index.push(token)
    index.forget_undo()
    before = index.hint()
    for token in [5, 3, 9, 9]:
        index.push(token)
    index.pop(4)
    assert index.tokens == [3, 4, 5, 3, 4] and index.hint() == before == (5, 2)


def test_context_hints_agree_with_whole_sequence_hints() -> None:
    """Decode time: the context synced in pieces, then draft paths beyond it == the sequence's own hints."""
    rng = random.Random(1)
    tokens = [rng.randrange(5) for _ in range(60)]
    whole = sequence_hints(torch.tensor(tokens))  # (60, 2)
    hints = ContextHints()
    for cut in (10, 11, 30, 45):
        hints.sync(tokens[:cut])
        torch.testing.assert_close(hints.at(0, cut), whole[:cut])
        for length in (1, 3):  # a draft path of the sequence's next tokens
            path = tokens[cut : cut + length]
            torch.testing.assert_close(hints.after(path), whole[cut + length - 1 : cut + length])
    hints.sync([9, 9, 9])  # not an extension: starts over
    assert hints.at(0, 3).tolist() == [[0, 0], [9, 1], [9, 2]]
