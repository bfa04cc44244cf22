"""The processed distribution: temperature, top-k, top-p and masks as target-only sampling applies them."""

from __future__ import annotations

import pytest
import torch

from decoding.errors import InvalidRequestError
from decoding.sampling import TOP_P_CANDIDATES, SamplingParams, next_token, processed_probs, sample

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]], dtype=torch.float64)


def test_greedy_is_one_hot_at_the_argmax() -> None:
    probs = processed_probs(LOGITS, SamplingParams(temperature=0.0))
    assert probs.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]


def test_temperature_scales_logits() -> None:
    probs = processed_probs(LOGITS, SamplingParams(temperature=0.5))
    torch.testing.assert_close(probs, torch.softmax(LOGITS / 0.5, -1))


def test_top_k_keeps_k_tokens_renormalised() -> None:
    probs = processed_probs(LOGITS, SamplingParams(temperature=1.0, top_k=2))[0]
    assert (probs > 0).sum() == 2
    torch.testing.assert_close(probs[:2], torch.softmax(LOGITS[0, :2], -1))


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    full = torch.softmax(LOGITS[0], -1)  # [0.553, 0.204, 0.124, 0.075, 0.028]
    probs = processed_probs(LOGITS, SamplingParams(temperature=1.0, top_p=0.7))[0]
    assert (probs > 0).tolist() == [True, True, False, False, False]
    torch.testing.assert_close(probs[:2], full[:2] / full[:2].sum())


def test_mask_removes_disallowed_tokens_before_everything_else() -> None:
    allowed = torch.tensor([[False, True, True, False, False]])
    probs = processed_probs(LOGITS, SamplingParams(temperature=1.0), allowed)[0]
    assert probs[0] == 0 and probs[3] == 0 and abs(float(probs.sum()) - 1) < 1e-12
    g = torch.Generator().manual_seed(0)
    assert next_token(LOGITS[0], SamplingParams(), g, allowed[0]) == 1


@pytest.mark.parametrize("temperature", [1e-38, 1e-300, 5e-324])
def test_a_temperature_too_small_for_float32_is_one_hot_not_nan(temperature: float) -> None:
    logits = torch.tensor([[0.5, 2.0, 1.99, float("-inf")]])  # float32, as the engine's logits; one masked
    probs = processed_probs(logits, SamplingParams(temperature=temperature))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert next_token(logits[0], SamplingParams(temperature=temperature), torch.Generator().manual_seed(0)) == 1


@pytest.mark.parametrize("top_p", [1e-46, 0.0])  # one that rounds to 0 in float32, and 0 (OpenAI takes it)
def test_a_top_p_of_zero_keeps_the_likeliest_token(top_p: float) -> None:
    probs = processed_probs(LOGITS.float(), SamplingParams(temperature=1.0, top_p=top_p))
    assert probs.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]


def test_the_whole_64_bit_seed_range_is_accepted() -> None:
    for seed in (-(2**63), 2**64 - 1):
        SamplingParams(temperature=1.0, seed=seed).generator()


@pytest.mark.parametrize("kwargs", [{"temperature": -1.0}, {"top_k": -2}, {"top_p": -0.1}, {"top_p": 1.5},
                                    {"seed": 2**64}, {"seed": -(2**63) - 1}])
def test_out_of_range_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidRequestError):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def _top_p_by_full_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    # the definition, by distinct values: keep a token when the tokens strictly likelier hold less than
    # top_p (the likeliest always)
    rows = []
    for row in probs:
        values, inverse, counts = torch.unique(row, sorted=True, return_inverse=True, return_counts=True)
        mass = (values * counts).flip(0)  # descending values' total mass
        strictly_more = (mass.cumsum(0) - mass).flip(0)[inverse]  # [V]
        rows.append(row * ((strictly_more < top_p) | (row == row.max())))
    kept = torch.stack(rows)
    return kept / kept.sum(-1, keepdim=True)


@pytest.mark.parametrize("spread", [0.05, 1.0, 20.0])  # peaked: nucleus among the candidates; flat: past them
def test_top_p_equals_sorting_the_whole_vocabulary(spread: float) -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 49152, generator=g) / spread  # [T, V]
    params = SamplingParams(temperature=1.0, top_p=0.9)
    ours = processed_probs(logits, params)
    assert torch.equal(ours, _top_p_by_full_sort(torch.softmax(logits, -1), 0.9))
    kept = int((ours[0] > 0).sum())
    assert (kept < TOP_P_CANDIDATES) if spread < 1 else (kept > TOP_P_CANDIDATES)  # both paths are taken


def test_a_rows_nucleus_is_the_same_alone_and_beside_a_flat_row() -> None:
    """Tied probabilities at the nucleus's edge are kept or dropped together. The set depended on how a sort
    ordered ties, and a verify pass sorts the whole vocabulary where one flat row needs it while a step
    ranks the candidates only: a row's nucleus differed between the two (found by a review)."""
    g = torch.Generator().manual_seed(0)
    row = torch.randn(1, 4096, generator=g).mul(3).round()  # integer logits: ties everywhere, as bf16's
    flat = torch.zeros(1, 4096)  # its nucleus runs past the candidates: the whole batch is sorted
    params = SamplingParams(temperature=1.0, top_p=0.9)
    alone = processed_probs(row, params)[0]
    beside = processed_probs(torch.cat([row, flat]), params)[0]
    assert torch.equal(alone, beside)
    assert torch.equal(alone, _top_p_by_full_sort(torch.softmax(row, -1), 0.9)[0])
    kept = alone > 0  # a tie group is whole: every token of a kept logit value is kept
    assert set(row[0][kept].tolist()).isdisjoint(row[0][~kept].tolist())


def test_a_draw_follows_the_weights_and_never_takes_a_zero_weight_token() -> None:
    weights = torch.tensor([0.0, 1.5, 0.0, 0.9, 0.6, 0.0])  # any positive total: a residual is unnormalised
    p = weights / weights.sum()
    g = torch.Generator().manual_seed(7)
    n = 30_000
    counts = torch.bincount(torch.tensor([sample(weights, g) for _ in range(n)]), minlength=6).double()
    assert counts[p == 0].sum() == 0
    # each count within 5 standard deviations of n p (binomial): a wrong draw fails by ~100 sigma
    sigma = (n * p * (1 - p)).sqrt()
    assert bool(((counts - n * p).abs() <= 5 * sigma).all()), (counts, n * p)


def test_weights_with_nothing_to_draw_are_refused() -> None:
    with pytest.raises(ValueError, match="summing to 0"):
        sample(torch.zeros(4), torch.Generator().manual_seed(0))
