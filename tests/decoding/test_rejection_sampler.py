"""The verifier: hand-built distributions make the outcome certain; a statistical test for the rest."""

from __future__ import annotations

import torch
from scipy import stats as scipy_stats

from decoding.rejection_sampler import rejection_sample, verify_greedy


def _onehot_rows(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).double()


def test_greedy_perfect_match_takes_the_bonus() -> None:
    v = verify_greedy([3, 1, 4], [3, 1, 4, 2])
    assert (v.num_accepted, v.next_token, v.is_bonus) == (3, 2, True)


def test_greedy_early_mismatch_recovers_the_target_token() -> None:
    v = verify_greedy([3, 1, 4], [3, 5, 4, 2])
    assert (v.num_accepted, v.next_token, v.is_bonus) == (1, 5, False)


def test_sampling_certain_acceptance_and_certain_rejection() -> None:
    g = torch.Generator().manual_seed(0)
    p = _onehot_rows([2, 0, 4], 5)  # the target is certain of 2, then 0, then 4
    accepted = rejection_sample([2, 0], None, p, g)
    assert (accepted.num_accepted, accepted.next_token, accepted.is_bonus) == (2, 4, True)
    rejected = rejection_sample([2, 3], None, p, g)  # p(3) = 0 at position 1: rejected, recovered = 0
    assert (rejected.num_accepted, rejected.next_token, rejected.is_bonus) == (1, 0, False)


def test_one_hot_rejection_never_resamples_the_rejected_token() -> None:
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    for _ in range(300):
        v = rejection_sample([0], None, p, g)
        if v.num_accepted == 0:
            assert v.next_token != 0


def test_first_emitted_token_follows_the_target_distribution() -> None:
    """Whatever q is, the first emitted token is distributed as p[0] (dense q and one-hot q)."""
    g = torch.Generator().manual_seed(2)
    vocab, n = 6, 20000
    p = torch.softmax(torch.randn(2, vocab, generator=g, dtype=torch.float64), -1)  # [k + 1, V]
    q = torch.softmax(torch.randn(1, vocab, generator=g, dtype=torch.float64) * 2, -1)  # [k, V]
    for dense in (True, False):
        counts = torch.zeros(vocab)
        for _ in range(n):
            if dense:
                x = int(torch.multinomial(q[0], 1, generator=g))
                v = rejection_sample([x], q, p, g)
            else:
                v = rejection_sample([1], None, p, g)  # a fixed one-hot proposal
            first = ([x] if dense else [1])[0] if v.num_accepted else v.next_token
            counts[first] += 1
        pvalue = scipy_stats.chisquare(counts.numpy(), (p[0] * n).numpy()).pvalue
        assert pvalue > 1e-4, f"dense={dense}: first token not distributed as p (p={pvalue:.2e})"
