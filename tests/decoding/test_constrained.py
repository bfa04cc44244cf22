"""Constrained decoding fused with speculation: exact under the grammar, greedy and sampled.

A tiny float64 model over a small JSON vocabulary (with two ways to tokenize `"a":`), the outlines-core
backend, and a schema whose every valid output can be enumerated: the exact constrained target
distribution is computed by walking the grammar, then compared with speculative samples.
"""

from __future__ import annotations

import json

import pytest
import torch
from scipy import stats as scipy_stats

from decoding.constraints.base import ConstraintError, Grammar
from decoding.constraints.outlines_backend import OutlinesBackend
from decoding.constraints.xgrammar_backend import XGrammarBackend
from decoding.drafters import CompositeDrafter, DraftModelDrafter, GrammarForcedDrafter, NgramDrafter
from decoding.drafters.base import Drafter, Proposal
from decoding.generate import Engine, GenerationConfig
from decoding.loading import LoadedModel
from decoding.sampling import SamplingParams, processed_probs
from decoding.stats import SpecStats
from decoding.tokenizer import Tokenizer
from tests.conftest import perturbed_copy, tiny_args, tiny_transformer

Backend = OutlinesBackend | XGrammarBackend

WORDS = ["<s>", "</s>", "<unk>", "{", "}", '"a"', ":", '"a":', "1", "2", "3", ",", '"b"', "true", "false", ',"b":']
SCHEMA = {
    "type": "object",
    "properties": {"a": {"enum": [1, 2, 3]}, "b": {"type": "boolean"}},
    "required": ["a", "b"],
}
EOS = 1


def json_tokenizer() -> Tokenizer:
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    return Tokenizer(hf, "json word tokenizer")


@pytest.fixture(scope="module", params=["outlines", "xgrammar"])
def backend(request: pytest.FixtureRequest) -> Backend:
    cls = OutlinesBackend if request.param == "outlines" else XGrammarBackend
    return cls(json_tokenizer(), EOS)


def _target(seed: int = 0, scale: float = 0.7) -> LoadedModel:
    model = tiny_transformer(tiny_args(len(WORDS), n_layers=1), seed=seed, dtype=torch.float64, logit_scale=scale)
    return LoadedModel("tiny-json", "tiny", model, json_tokenizer())


def _text(tokens: tuple[int, ...]) -> str:
    return "".join(WORDS[t] for t in tokens if t != EOS)


def exact_constrained(target: LoadedModel, grammar: Grammar, prompt: list[int], params: SamplingParams
                      ) -> dict[tuple[int, ...], float]:
    """P(sequence) for every complete grammar-valid sequence (ending in EOS), by walking the grammar."""
    model = target.model
    model.setup_cache(64)
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], mass: float) -> None:
        if prefix and prefix[-1] == EOS:
            out[prefix] = mass
            return
        logits = model(torch.tensor([*prompt, *prefix]), 0, last_only=True)  # [1, V]
        probs = processed_probs(logits, params, grammar.allowed_mask().unsqueeze(0))[0]
        for token in probs.nonzero()[:, 0].tolist():
            grammar.accept(token)
            walk((*prefix, token), mass * float(probs[token]))
            grammar.rollback(1)

    walk((), 1.0)
    return out


def _drafter(target: LoadedModel, kind: str) -> CompositeDrafter:
    draft = DraftModelDrafter(perturbed_copy(target.model, seed=5, noise=0.1), max_tokens=3)
    forced = GrammarForcedDrafter(target.tokenizer)  # the forced text too: '"a":' after '{', ',"b":' after 1
    if kind == "grammar+draft":
        return CompositeDrafter([forced, draft])
    return CompositeDrafter([forced, NgramDrafter(min_n=1, max_n=2, max_tokens=3)])


def _run(engine: Engine, prompt: list[int], config: GenerationConfig) -> tuple[tuple[int, ...], SpecStats]:
    stats = SpecStats()
    out: list[int] = []
    for step in engine.decode_tokens(prompt, config, stats):
        out.extend(step)
        if EOS in out:
            return tuple(out[: out.index(EOS) + 1]), stats
    return tuple(out), stats


PROMPT = [0, 3, 5, 6, 8, 11, 12, 6, 13, 4, 1, 0]  # an earlier answer in the context, for the n-gram drafter


def test_every_valid_output_is_enumerated_and_parses(backend: Backend) -> None:
    grammar = backend.compile_json_schema(SCHEMA).new()
    joint = exact_constrained(_target(), grammar, PROMPT, SamplingParams(temperature=1.0))
    assert abs(sum(joint.values()) - 1.0) < 1e-9
    values = {json.dumps(json.loads(_text(seq)), sort_keys=True) for seq in joint}
    assert len(values) == 6  # a in {1, 2, 3} x b in {true, false}
    assert len(joint) > len(values)  # and several tokenizations of each


@pytest.mark.parametrize("kind", ["grammar+draft", "grammar+ngram"])
def test_constrained_greedy_speculation_equals_constrained_target_only(backend: Backend, kind: str) -> None:
    factory = backend.compile_json_schema(SCHEMA)
    drafted, sources = 0, set()
    for seed in range(6):
        target = _target(seed, scale=2.0)
        config = GenerationConfig(max_new_tokens=20, grammar=factory)
        expected, _ = _run(Engine(target), PROMPT, config)
        got, stats = _run(Engine(target, _drafter(target, kind), max_draft_tokens=4), PROMPT, config)
        assert got == expected
        assert json.loads(_text(got))["a"] in (1, 2, 3)
        drafted += stats.draft_tokens
        sources |= set(stats.by_source)
    assert drafted > 0
    assert "grammar" in sources, "forced tokens (':' after '\"a\"', '}' after a boolean) should be drafted"


@pytest.mark.parametrize("kind", ["grammar+draft", "grammar+ngram"])
def test_constrained_speculative_sampling_is_exact(backend: Backend, kind: str) -> None:
    target = _target()
    params = SamplingParams(temperature=1.0)
    factory = backend.compile_json_schema(SCHEMA)
    joint = exact_constrained(target, factory.new(), PROMPT, params)
    engine = Engine(target, _drafter(target, kind), max_draft_tokens=4)
    counts: dict[tuple[int, ...], int] = {}
    total = SpecStats()
    n = 3000
    for seed in range(n):
        config = GenerationConfig(max_new_tokens=20, sampling=SamplingParams(1.0, seed=seed), grammar=factory)
        seq, stats = _run(engine, PROMPT, config)
        counts[seq] = counts.get(seq, 0) + 1
        total.merge(stats)
    assert set(counts) <= set(joint), "a sequence outside the grammar"
    assert 0 < total.accepted_tokens < total.draft_tokens
    keys = [k for k in joint if joint[k] * n >= 5]
    rest = [k for k in joint if joint[k] * n < 5]
    observed = [counts.get(k, 0) for k in keys] + [sum(counts.get(k, 0) for k in rest)]
    expected = [joint[k] * n for k in keys] + [sum(joint[k] for k in rest) * n]
    if not rest:
        observed, expected = observed[:-1], expected[:-1]
    pvalue = scipy_stats.chisquare(observed, expected).pvalue
    assert pvalue > 1e-4, f"{kind}: constrained samples do not follow the constrained target (p={pvalue:.2e})"


def test_a_token_outside_the_grammar_is_refused(backend: Backend) -> None:
    grammar = backend.compile_json_schema(SCHEMA).new()
    with pytest.raises(ConstraintError):
        grammar.accept(4)  # "}" cannot open the object
    grammar.accept(3)
    assert grammar.forced_tokens(4) == []  # '"a"' or '"a":': a choice, nothing forced
    grammar.accept(5)
    assert grammar.forced_tokens(4) == [6]  # after '"a"' the colon is forced


def test_forced_text_spans_token_boundaries(backend: Backend) -> None:
    grammar = backend.compile_json_schema(SCHEMA).new()
    assert grammar.forced_text() == '{"a":'  # across the boundary after "{"
    grammar.accept(3)
    assert grammar.forced_text() == '"a":'  # no single token is forced ('"a"' or '"a":'), the text is
    assert grammar.forced_tokens(4) == []
    for token in (5, 6, 8):  # '"a"', ':', '1'
        grammar.accept(token)
    assert grammar.forced_text() == ',"b":'
    grammar.accept(15)
    assert grammar.forced_text() == ""  # true or false: a choice
    assert grammar.is_finished() is False


def test_forced_text_drafts_are_tokenized_then_resplit_as_the_target_writes_them(backend: Backend) -> None:
    factory = backend.compile_json_schema(SCHEMA)
    drafter = GrammarForcedDrafter(json_tokenizer())
    params, gen = SamplingParams(), torch.Generator()
    grammar = factory.new()
    grammar.accept(3)
    context = [0, 3]
    assert drafter.propose(context, 4, params, gen, grammar).tokens == [7]  # '"a":', the tokenizer's way
    assert grammar.forced_text() == '"a":', "the grammar's state is unchanged"
    drafter.observe(1, 0)  # rejected: the target wrote '"a"' instead
    assert drafter.propose([*context, 5], 4, params, gen, _advanced(factory, [3, 5])).tokens == [6]
    drafter.observe(1, 1)
    # from now on in this request '"a":' is drafted as the target wrote it: '"a"', ':'
    assert drafter.propose(context, 4, params, gen, grammar).tokens == [5, 6]
    drafter.reset()
    assert drafter.propose(context, 4, params, gen, grammar).tokens == [7]
    assert GrammarForcedDrafter().propose(context, 4, params, gen, grammar).tokens == []  # no tokenizer


def _advanced(factory: object, tokens: list[int]) -> Grammar:
    grammar = factory.new()  # type: ignore[attr-defined]
    for token in tokens:
        grammar.accept(token)
    return grammar


class AllowedTokensTree(Drafter):
    """A tree of every token the grammar allows next, each a child of the root: the tree walk, which
    applies no mask, then ends on the target's unmasked choice, allowed or not."""

    name = "allowed"

    def propose(self, context: list[int], max_tokens: int, params: SamplingParams, generator: torch.Generator,
                grammar: Grammar | None = None) -> Proposal:
        allowed = grammar.allowed_mask().nonzero()[:, 0].tolist() if grammar is not None else [0]
        return Proposal(tokens=allowed, sources=[self.name] * len(allowed), parents=[-1] * len(allowed))

    @property
    def max_nodes(self) -> int:
        return len(WORDS)


def test_a_tree_proposed_under_a_grammar_is_verified_as_its_masked_first_branch(backend: Backend) -> None:
    """The tree walk ignored the grammar (no mask, no accept): a drafter's tree under a constraint gave
    tokens the grammar forbids (a review; the shipped head drafts chains there, so only a new drafter
    could hit it)."""
    factory = backend.compile_json_schema(SCHEMA)
    for seed in range(4):
        target = _target(seed, scale=2.0)
        config = GenerationConfig(max_new_tokens=20, grammar=factory)
        expected, _ = _run(Engine(target), PROMPT, config)
        got, stats = _run(Engine(target, AllowedTokensTree(), max_draft_tokens=4), PROMPT, config)
        assert got == expected and stats.tree_passes == 0 and stats.draft_tokens > 0
