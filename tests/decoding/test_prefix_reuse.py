"""An engine reads a prompt's prefix from the cache its previous request left, where that is exact: the
outputs are those of a fresh engine, token for token and (sampled, same seed) draw for draw."""

from __future__ import annotations

import pytest
import torch

from decoding import kernels
from decoding.drafters import FallbackDrafter, HeadDrafter, NgramDrafter
from decoding.drafters.head_tree import TreeShape
from decoding.generate import Engine, GenerationConfig, GenerationResult
from decoding.loading import LoadedModel
from decoding.sampling import SamplingParams
from tests.conftest import TinyFactory
from tests.decoding.heads import trained_head

pytestmark = pytest.mark.skipif(not kernels.available(), reason="prefix reuse needs the exact kernel (a C compiler)")

PROMPT = [0, 7, 2, 9, 11, 2, 9, 4, 4, 13, 2, 9]


def target(tiny_model: TinyFactory) -> LoadedModel:
    model = tiny_model(vocab_size=64, dtype=torch.bfloat16, seed=1, logit_scale=2.0)
    model.model.setup_cache(8)  # small: each request below grows the cache, which keeps what it holds
    assert model.model.split_invariant  # bf16 with the kernel
    return model


def speculative(model: LoadedModel, reach: int | None = None) -> Engine:
    tree = TreeShape(nodes=6, branch=3, width=1, depth=4, min_score=0.0)
    head = HeadDrafter(trained_head(model, "eagle"), max_tokens=6, tree=tree, reach=reach)
    # untimed: which passes carry the head's drafts must not depend on wall time here
    return Engine(model, FallbackDrafter([NgramDrafter(min_n=2, max_n=3), head], timed=False), max_draft_tokens=6)


def run(engine: Engine, prompt: list[int], temperature: float = 0.0, seed: int = 0) -> GenerationResult:
    sampling = SamplingParams(temperature=temperature, seed=seed)
    return engine.complete(prompt, GenerationConfig(max_new_tokens=24, sampling=sampling, ignore_eos=True))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_an_agents_next_turn_reads_its_history_from_the_cache_and_gets_a_fresh_engines_output(
        tiny_model: TinyFactory, temperature: float) -> None:
    model = target(tiny_model)
    engine = speculative(model)
    first = run(engine, PROMPT, temperature)
    assert first.stats.cached_prompt_tokens == 0
    # the next request carries this one's history: its prompt, its reply, then a new turn
    turn = [*PROMPT, *first.token_ids, 5, 17, 3]
    second = run(engine, turn, temperature, seed=1)
    # the prompt and the reply but its last token were written to the cache: the reply's last token
    # was emitted by the last pass and never read
    assert second.stats.cached_prompt_tokens == len(PROMPT) + len(first.token_ids) - 1
    fresh = run(speculative(model), turn, temperature, seed=1)  # a new engine reads the whole prompt
    assert fresh.stats.cached_prompt_tokens == 0
    assert second.token_ids == fresh.token_ids
    # the drafters read the cached prefix's features, the bits a whole prompt's pass gives: they
    # propose exactly what they propose on a fresh engine
    assert second.stats.draft_tokens > 0
    assert (second.stats.draft_tokens, second.stats.accepted_tokens, second.stats.target_passes) == (
        fresh.stats.draft_tokens, fresh.stats.accepted_tokens, fresh.stats.target_passes)


def test_the_same_prompt_again_reads_all_but_its_last_token_from_the_cache(tiny_model: TinyFactory) -> None:
    model = target(tiny_model)
    engine = speculative(model)
    base = Engine(model)
    first = run(engine, PROMPT)
    again = run(engine, PROMPT)
    assert again.stats.cached_prompt_tokens == len(PROMPT) - 1
    # speculation off needs no drafter features: it reuses what a speculative request left ...
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True, speculative=False)
    off = engine.complete(PROMPT, config)
    assert off.stats.cached_prompt_tokens == len(PROMPT) - 1
    # ... but the drafter did not see that request's passes: the next speculative one reads the prompt whole
    assert run(engine, PROMPT).stats.cached_prompt_tokens == 0
    assert again.token_ids == first.token_ids == off.token_ids == run(base, PROMPT).token_ids


def test_another_pass_in_between_leaves_nothing_to_reuse(tiny_model: TinyFactory) -> None:
    model = target(tiny_model)
    engine = speculative(model)
    run(engine, PROMPT)
    run(Engine(model), [0, 1, 2])  # another engine on the same model writes the cache
    assert run(engine, PROMPT).stats.cached_prompt_tokens == 0
    engine.reuse_prefixes = False
    run(engine, PROMPT)
    assert run(engine, PROMPT).stats.cached_prompt_tokens == 0


def test_without_the_kernel_prompts_are_read_whole(tiny_model: TinyFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # float64 attention past the prompt and torch's float32 for it: a prompt cut in two would round
    # differently, so nothing is reused
    monkeypatch.setattr(kernels, "available", lambda: False)
    model = tiny_model(vocab_size=64, dtype=torch.bfloat16, seed=1, logit_scale=2.0)
    model.model.setup_cache(128)
    assert not model.model.split_invariant
    engine = Engine(model, NgramDrafter(min_n=2, max_n=3))
    run(engine, PROMPT)
    assert run(engine, PROMPT).stats.cached_prompt_tokens == 0


def spied_head(engine: Engine) -> tuple[HeadDrafter, list[tuple[int, int]]]:
    """The engine's head drafter, and the (first cache slot, rows) of each of its head's steps from now on."""
    drafter = engine.drafter.drafters[1]  # type: ignore[union-attr]
    assert isinstance(drafter, HeadDrafter)
    steps: list[tuple[int, int]] = []
    inner = drafter.head.step

    def spy(tokens: torch.Tensor, features: torch.Tensor | None, start: int,
            *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        steps.append((start, int(tokens.shape[0])))
        return inner(tokens, features, start, *args, **kwargs)  # type: ignore[arg-type]

    drafter.head.step = spy  # type: ignore[method-assign]
    return drafter, steps


def test_the_head_keeps_its_pairs_for_the_next_turn_unless_another_drafter_stepped_it(
        tiny_model: TinyFactory) -> None:
    model = target(tiny_model)
    engine = speculative(model)
    drafter, steps = spied_head(engine)
    first = run(engine, PROMPT)
    assert steps[0][1] >= len(PROMPT) - 1  # the first proposal caught up over the whole prompt
    turn = [*PROMPT, *first.token_ids, 5, 17, 3]
    steps.clear()
    run(engine, turn)
    assert steps and steps[0][1] <= len(turn) - len(PROMPT)  # only past the pairs it kept from the last turn
    other = HeadDrafter(drafter.head, max_tokens=2)  # another drafter steps the same head
    other.prepare(64)
    other.observe_features(0, torch.randn(4, drafter.head.config.feature_width))
    other.propose([0, 7, 2, 9, 11], 2, SamplingParams(), torch.Generator().manual_seed(0))
    steps.clear()
    run(engine, [*turn, 8, 6])
    assert steps[0][1] >= len(turn) - 1  # its pairs may be gone: it caught up from the start


def test_a_head_with_a_reach_catches_up_over_the_latest_pairs_only(tiny_model: TinyFactory) -> None:
    model = target(tiny_model)
    engine = speculative(model, reach=5)
    _, steps = spied_head(engine)
    first = run(engine, PROMPT)
    assert first.stats.accepted_tokens > 0
    assert steps[0] == (0, 5)  # the prompt's latest 5 pairs, from the head's first slot
    # every later step lands past them, within the pairs this request added (24 tokens, drafts of 4)
    assert all(start >= 5 and start + rows <= 5 + 24 + 4 for start, rows in steps[1:])
    assert first.token_ids == run(Engine(model, None), PROMPT).token_ids
    steps.clear()
    turn = [*PROMPT, *first.token_ids, 5, 17, 3]  # more than 5 new pairs: it starts over
    again = run(engine, turn)
    assert steps[0] == (0, 5)
    assert again.token_ids == run(Engine(model, None), turn).token_ids
