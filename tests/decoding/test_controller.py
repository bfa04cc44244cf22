"""The speculation controller pauses speculation where its passes earn fewer tokens than they cost, backs
off doubling, probes again, and never changes which tokens come out; a fallback group's timed gate sits
a model drafter out where its passes are slower than plain steps."""

from __future__ import annotations

from collections.abc import Callable

import torch

from decoding.adaptive import ControllerConfig, SpeculationController
from decoding.constraints.base import Grammar
from decoding.drafters import DraftModelDrafter, FallbackDrafter, NgramDrafter
from decoding.drafters.base import Drafter, Proposal
from decoding.drafters.timed_gate import GateConfig, TimedGate
from decoding.generate import Engine, GenerationConfig
from decoding.sampling import SamplingParams
from tests.conftest import TinyFactory

CONFIG = ControllerConfig()  # 8 passes a window, first pause 16 steps, at most 256


def refusals(allows: Callable[[], bool]) -> int:
    """Passes until `allows` says yes (consumes them): a controller's pause, a gate's."""
    n = 0
    while not allows():
        n += 1
    return n


def paused_for(controller: SpeculationController) -> int:
    return refusals(controller.should_speculate)


def test_a_window_of_losing_passes_pauses_and_each_pause_in_a_row_doubles() -> None:
    controller = SpeculationController(CONFIG)
    assert controller.should_speculate()
    for _ in range(CONFIG.window - 1):  # 8 drafts, none kept: 1 token for 1.24 steps a pass
        controller.observe(8, 0)
    assert controller.should_speculate()  # a window not full yet decides nothing
    controller.observe(8, 0)
    assert paused_for(controller) == CONFIG.pause_steps
    pauses = []
    for _ in range(6):
        for _ in range(CONFIG.window):
            controller.observe(8, 0)
        pauses.append(paused_for(controller))
    assert pauses == [32, 64, 128, 256, 256, 256]  # doubling, up to max_pause_steps


def test_a_window_that_pays_keeps_speculating_and_resets_the_back_off() -> None:
    controller = SpeculationController(CONFIG)
    for _ in range(2 * CONFIG.window):  # each pass 3 tokens for 1.12 steps
        controller.observe(4, 2)
        assert controller.should_speculate()
    for _ in range(CONFIG.window):
        controller.observe(8, 0)
    assert paused_for(controller) == 16
    for _ in range(CONFIG.window):
        controller.observe(8, 0)
    assert paused_for(controller) == 32
    for _ in range(CONFIG.window):  # a window well above break-even: the next pause starts over
        controller.observe(4, 3)
    for _ in range(CONFIG.window):
        controller.observe(8, 0)
    assert paused_for(controller) == 16


def test_a_model_drafter_pays_for_its_drafts() -> None:
    # 2 tokens a pass of 2 drafts: 1.06 steps free, 2.06 steps when each draft costs half a step
    free, dear = SpeculationController(CONFIG), SpeculationController(CONFIG, draft_cost=0.5)
    for _ in range(CONFIG.window):
        free.observe(2, 1, model_drafted=2)
        dear.observe(2, 1, model_drafted=2)
    assert free.should_speculate() and paused_for(dear) == 16


class WrongDrafter(Drafter):
    """Proposes a token the target never picks next (the tiny model's greedy choice plus one)."""

    name = "wrong"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.proposals = 0

    def propose(self, context: list[int], max_tokens: int, params: SamplingParams, generator: torch.Generator,
                grammar: Grammar | None = None) -> Proposal:
        model = self.engine.target.model
        model.setup_cache(len(context) + 1)
        best = int(model(torch.tensor(context), 0, last_only=True)[-1].argmax())
        self.proposals += 1
        wrong = (best + 1) % model.args.vocab_size
        return Proposal(tokens=[wrong] * min(max_tokens, 4), sources=[self.name] * min(max_tokens, 4))


def test_the_engine_stops_proposing_drafts_that_never_pay_and_its_output_is_unchanged(tiny_model: TinyFactory) -> None:
    target = tiny_model(vocab_size=16, seed=5)
    plain = Engine(target)
    config = GenerationConfig(max_new_tokens=60, ignore_eos=True)
    want = plain.complete([0, 3, 4, 5], config).token_ids
    oracle = Engine(tiny_model(vocab_size=16, seed=5))  # a second copy the drafter may run freely
    drafter = WrongDrafter(oracle)
    result = Engine(target, drafter).complete([0, 3, 4, 5], config)
    assert result.token_ids == want
    assert result.stats.accepted_tokens == 0 and result.stats.verify_passes == drafter.proposals
    # after the prompt's token: 8 losing passes, a pause of 16 steps, 8 more passes, then the second pause
    # (32) outlasts the request: every step left but the last, which has no room for drafts anyway
    assert drafter.proposals == 16 and result.stats.paused_steps == 16 + (60 - 1 - 8 - 16 - 8 - 1)


def test_a_timed_gate_waits_for_plain_steps_then_keeps_a_drafter_while_it_beats_them() -> None:
    config = GateConfig()
    gate = TimedGate(config)
    assert not gate.allows()  # no plain step timed yet
    for _ in range(config.warmup):
        gate.plain(0.010)  # a plain step: 100 tokens/s
    for _ in range(5 * config.window):  # 2 tokens in 15 ms: 133 tokens/s
        assert gate.allows()
        gate.drafted(2, 0.015)
    assert gate.sat_out == 1  # only the pass before the first plain step


def test_a_timed_gate_sits_a_slower_drafter_out_longer_each_time_and_forgives_a_fast_window() -> None:
    config = GateConfig()
    gate = TimedGate(config)
    for _ in range(config.warmup):
        gate.plain(0.010)
    pauses = []
    for _ in range(4):
        assert refusals(gate.allows) == (pauses[-1] if pauses else 0)
        for _ in range(config.window):  # 2 tokens in 25 ms: 80 tokens/s, slower than plain steps
            gate.drafted(2, 0.025)
        pauses.append(gate._pause_left)
    assert pauses == [16, 32, 64, 128]
    assert refusals(gate.allows) == 128
    for _ in range(config.window):  # a window faster than plain steps: the next pause starts over
        gate.drafted(3, 0.020)
    for _ in range(config.window):
        gate.drafted(1, 0.020)
    assert refusals(gate.allows) == config.pause


def test_behind_lookup_a_drafter_slower_than_plain_steps_sits_out_and_lookup_goes_on(tiny_model: TinyFactory) -> None:
    model = tiny_model(vocab_size=32, seed=3).model
    draft = DraftModelDrafter(model, max_tokens=2)
    ngram = NgramDrafter(min_n=2, max_n=2, max_tokens=2)
    fallback = FallbackDrafter([ngram, draft])
    fallback.prepare(256)
    fallback.reset()
    g = torch.Generator().manual_seed(0)
    no_match = [0, 4, 5, 6, 7]  # "6 7" never occurred before
    sources = []
    for i in range(40):
        proposal = fallback.propose([*no_match, 8 + i % 20], 2, SamplingParams(), g)
        sources.append(proposal.sources[0] if proposal.sources else "plain")
        # a plain step takes 10 ms; a pass the draft ran takes 40 ms for 2 tokens
        fallback.observe_time(0.040 if proposal.sources else 0.010, 2 if proposal.sources else 1)
    w, warm, pause = GateConfig().window, GateConfig().warmup, GateConfig().pause
    probe = warm + w + pause  # where the draft runs again
    assert sources[:warm] == ["plain"] * warm  # timing plain steps first
    assert sources[warm : warm + w] == ["draft"] * w  # one window of the draft's passes: slower than plain steps
    assert sources[warm + w : probe] == ["plain"] * pause  # then a pause
    assert sources[probe : probe + w] == ["draft"] * w  # a probe, slower again
    assert sources[probe + w :] == ["plain"] * (40 - probe - w) and 40 - probe - w <= 2 * pause  # a longer pause
    assert fallback.sat_out == warm + pause + (40 - probe - w)
    matched = fallback.propose([0, 4, 5, 6, 7, 4, 5], 2, SamplingParams(), g)
    assert matched.sources == ["ngram", "ngram"]  # prompt lookup is never held back
