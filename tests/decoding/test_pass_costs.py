"""Fitting proposals to the machine: the pass-cost curve, the size it picks, and the per-request ceiling."""

from __future__ import annotations

import pytest
import torch

from decoding.adaptive import DraftLength
from decoding.drafters import NgramDrafter
from decoding.pass_costs import REFERENCE_ACCEPTANCE, PassCosts, measure_pass_costs, relative_costs
from decoding.sampling import SamplingParams
from tests.conftest import TinyFactory

# the two kinds of 2-core machine (decoding/drafts/README.md): AVX-512 bf16's 2 / 4 / 8 rows as measured,
# the sizes between interpolated; AVX2 float32's as pass_costs measured it
AVX512_BF16 = PassCosts((1.0, 1.09, 1.12, 1.15, 1.16, 1.17, 1.18, 1.19, 1.21))
AVX2_FP32 = PassCosts((1.0, 1.07, 1.17, 1.17, 1.63, 1.71, 1.71, 1.74, 1.74))


def test_long_passes_where_they_cost_little_short_ones_where_they_do_not() -> None:
    assert AVX512_BF16.best_rows() == 9  # 8 drafts a pass
    assert AVX2_FP32.best_rows() == 4  # 3 drafts a pass
    # nearly sure drafts (copying) pay for the big pass even where it costs more
    assert AVX2_FP32.best_rows(0.95) == 9
    # free passes: as long as measured; a pass that costs as many steps as rows: never speculate
    assert PassCosts((1.0,) * 9).best_rows(0.3) == 9
    assert PassCosts(tuple(float(r) for r in range(1, 10))).best_rows() == 1
    # a smaller pass that would earn only a little more (under 5%) leaves the largest: timings are noisy
    assert AVX512_BF16.best_rows(0.45) == 9
    assert AVX2_FP32.best_rows(0.8) == 9


def test_the_best_size_for_any_expected_gains() -> None:
    # a chain's gains a, a^2, ... are best_rows
    for costs in (AVX512_BF16, AVX2_FP32):
        for a in (0.3, 0.7, 0.95):
            assert costs.best_size([a**i for i in range(1, 9)]) == costs.best_rows(a)
    # a tree whose fourth node on adds almost nothing: three drafts where big passes cost more
    steep = [0.9, 0.8, 0.7] + [0.01] * 5
    assert AVX2_FP32.best_size(steep) == 4 and AVX512_BF16.best_size(steep) == 9
    # no more rows than there are drafts to fill them
    assert AVX512_BF16.best_size([0.9]) == 2


def test_costs_are_relative_to_one_row() -> None:
    with pytest.raises(ValueError, match=r"start at 1\.0"):
        PassCosts((1.2, 1.3))


def test_the_ceiling_follows_what_the_request_accepts() -> None:
    length = DraftLength(8, 8, AVX2_FP32)
    assert length.acceptance == pytest.approx(REFERENCE_ACCEPTANCE)
    assert (length.maximum, length.value) == (3, 3)
    for _ in range(10):  # every draft kept: a copy; the ceiling rises, the schedule climbs to it
        length.update(length.value, length.value)
    assert length.acceptance > 0.9 and length.maximum == 8 and length.value == 8
    for _ in range(20):  # the first draft missed every time
        length.update(length.value, 0)
    assert length.maximum < 8 and length.value == 1
    # without costs: the bound, whatever the acceptance (the HF schedule alone)
    plain = DraftLength(8, 8)
    for _ in range(10):
        plain.update(1, 0)
    assert plain.maximum == 8


def test_a_fitted_ngram_drafter_proposes_no_more_than_pays() -> None:
    drafter = NgramDrafter(min_n=1, max_n=2)
    context = list(range(20)) * 2 + list(range(5))  # the next 15 tokens are known from the first copy
    generator = torch.Generator()
    assert len(drafter.propose(context, 8, SamplingParams(), generator)) == 8
    drafter.fit(AVX2_FP32)
    assert len(drafter.propose(context, 8, SamplingParams(), generator)) == 3


def test_measured_costs_are_a_curve_from_one_that_never_falls(tiny_model: TinyFactory) -> None:
    model = tiny_model(vocab_size=64).model
    costs = measure_pass_costs(model, max_rows=5, context=10_000, repeats=2)  # past its context: shortened
    assert len(costs.relative) == 5 and costs.relative[0] == 1.0
    # a spent time budget still leaves one timed round after the warm-up
    costs = measure_pass_costs(model, max_rows=5, context=16, repeats=6, budget_s=0.0)
    assert len(costs.relative) == 5 and costs.relative[0] == 1.0
    assert all(a <= b for a, b in zip(costs.relative, costs.relative[1:], strict=False))


def test_a_size_dearer_than_a_bigger_one_is_priced_as_the_bigger() -> None:
    # 3 rows run padded to 4 on some kernels: noise can time them above 4 rows, and a pass is never priced
    # above a bigger one (the timed curve above rarely falls, so only this shows it: a review)
    rounds = [[6.0, 6.6, 8.4, 7.8, 9.0] for _ in range(3)]
    assert relative_costs(rounds).relative == (1.0, 1.1, 1.3, 1.3, 1.5)


def test_costs_are_read_within_each_round_so_the_machines_phases_and_spikes_do_not_move_them() -> None:
    curve = [1.0, 1.1, 1.2, 1.3]
    rounds = [[6.0 * c for c in curve] for _ in range(5)]  # 6 ms a step, ...
    rounds[1][0] = 4.6  # ... but one round's first pass ran in a moment the machine ran at 4.6
    rounds[2][3] *= 3  # and one pass was held up
    assert relative_costs(rounds).relative == (1.0, 1.1, 1.2, 1.3)
    # the fastest pass of each size, as costs were read before, priced 2 rows at 6.6 / 4.6 = 1.43 steps
