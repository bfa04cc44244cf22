"""Tool calls end to end on a tiny random model over the real 49k vocabulary, both backends.

Every tool_choice mode, the text-or-call grammar's language, greedy speculation equal to target-only
under it, and the request errors that must come before any token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from decoding.chat_engine import ChatEngine, ChatRequest, ConstraintOptions
from decoding.constraints.backends import make_backend
from decoding.constraints.bounds import Bounds
from decoding.constraints.spec import GrammarSpec
from decoding.drafters import CompositeDrafter, DraftModelDrafter, GrammarForcedDrafter, NgramDrafter
from decoding.errors import InvalidRequestError, UnknownToolError
from decoding.generate import Engine, GenerationConfig
from decoding.loading import LoadedModel
from decoding.sampling import SamplingParams
from decoding.tokenizer import Tokenizer
from tests.conftest import perturbed_copy, tiny_args, tiny_transformer

BACKENDS = ["outlines", "xgrammar"]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Oslo", "Rome", "Lima"]},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "enum": [1, 2, 3]},
                                         "b": {"type": "boolean"}},
        "required": ["a", "b"], "additionalProperties": False}}},
]
MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]
CALLS = {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
    "name": {"const": "f"}, "arguments": {"type": "object", "properties": {"x": {"type": "integer"}},
                                          "required": ["x"], "additionalProperties": False}},
    "required": ["name", "arguments"], "additionalProperties": False}}


def _tiny(tokenizer: Tokenizer, seed: int = 0) -> LoadedModel:
    args = tiny_args(tokenizer.vocab_size, n_layers=1, max_seq_len=1024)
    model = tiny_transformer(args, seed, torch.float64, logit_scale=4.0)
    return LoadedModel("tiny", f"tiny-{seed}", model, tokenizer)


def _chat(target: LoadedModel, backend: str, speculative: bool = True) -> ChatEngine:
    drafter = CompositeDrafter([GrammarForcedDrafter(), NgramDrafter(),
                                DraftModelDrafter(perturbed_copy(target.model, seed=9, noise=0.05), max_tokens=4)])
    engine = Engine(target, drafter if speculative else None, max_draft_tokens=6)
    return ChatEngine(engine, ConstraintOptions(backend=backend, bounds=Bounds(string_length=8)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("text", "allowed", "complete"), [
    ('<tool_call>[{"name":"f","arguments":{"x":3}}]', True, True),
    ("Hello <tool_call>", True, True),
    ("<b>bold</b>", True, True),
    ("<tool_cx", True, True),
    ("<tool", True, False),  # a bare prefix of the marker is not an answer
    ("", True, False),  # nor is nothing
    ("<tool_call>hi", False, False),
])
def test_text_or_call_language(embedded_tokenizer: Tokenizer, backend: str, text: str, allowed: bool,
                               complete: bool) -> None:
    eos = embedded_tokenizer.turn_end_id
    assert eos is not None
    grammar = make_backend(backend, embedded_tokenizer).compile(GrammarSpec(calls_schema=CALLS, free_text=True)).new()
    ok = True
    for token in embedded_tokenizer.encode(text):
        if not grammar.allows(token):
            ok = False
            break
        grammar.accept(token)
    assert ok == allowed
    assert (ok and grammar.allows(eos)) == complete


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_tool_choice_mode(embedded_tokenizer: Tokenizer, backend: str) -> None:
    chat = _chat(_tiny(embedded_tokenizer), backend)
    config = GenerationConfig(max_new_tokens=160)

    def run(choice: object, parallel: bool | None = None) -> tuple:
        request = ChatRequest(MESSAGES, config, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel)
        return chat.complete(request)

    required, result = run("required", parallel=False)
    assert required.finish_reason == "tool_calls", result.text
    assert len(required.tool_calls) == 1 and required.content is None
    call = required.tool_calls[0]
    args = json.loads(call.arguments)
    assert call.name in ("get_weather", "add") and call.id.startswith("call_")
    assert set(args) == ({"city", "unit"} if call.name == "get_weather" else {"a", "b"})

    named, _ = run({"type": "function", "function": {"name": "add"}})
    assert named.finish_reason == "tool_calls" and [c.name for c in named.tool_calls] == ["add"]
    assert json.loads(named.tool_calls[0].arguments)["a"] in (1, 2, 3)

    parallel, _ = run("required", parallel=True)
    assert parallel.finish_reason in ("tool_calls", "length")
    assert parallel.tool_calls and all(c.name in ("get_weather", "add") for c in parallel.tool_calls)

    none, _ = run("none")
    assert none.tool_calls == [] and none.finish_reason in ("stop", "length")

    auto, result = run("auto")
    if result.text.startswith("<tool_call>"):  # a call, whole or cut by max_tokens: never marker text
        assert auto.content is None and auto.finish_reason in ("tool_calls", "length")
        assert auto.tool_calls or auto.finish_reason == "length"
    else:
        assert auto.tool_calls == [] and auto.content == result.text


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_greedy_speculation_under_the_tool_grammar_equals_target_only(
    embedded_tokenizer: Tokenizer, backend: str, choice: str
) -> None:
    drafted = 0
    for seed in range(3):
        target = _tiny(embedded_tokenizer, seed)
        request = ChatRequest(MESSAGES, GenerationConfig(max_new_tokens=48), tools=TOOLS, tool_choice=choice)
        expected = _chat(target, backend, speculative=False).complete(request)[1]
        got = _chat(target, backend).complete(request)[1]
        assert got.token_ids == expected.token_ids
        assert got.finish_reason == expected.finish_reason
        drafted += got.stats.draft_tokens
    assert drafted > 0


def test_request_errors_come_before_any_token(embedded_tokenizer: Tokenizer) -> None:
    chat = _chat(_tiny(embedded_tokenizer), "xgrammar")
    with pytest.raises(UnknownToolError) as err:
        chat.prepare(ChatRequest(MESSAGES, tools=TOOLS, tool_choice={"type": "function",
                                                                     "function": {"name": "send_email"}}))
    assert err.value.param == "tool_choice"
    with pytest.raises(InvalidRequestError) as stop:
        chat.prepare(ChatRequest(MESSAGES, GenerationConfig(stop=("}",)), tools=TOOLS, tool_choice="required"))
    assert stop.value.param == "stop" and stop.value.code == "invalid_parameter_combination"


def test_outlines_indexes_persist_on_disk(embedded_tokenizer: Tokenizer, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from decoding.constraints import outlines_backend

    spec = GrammarSpec(calls_schema=CALLS, free_text=True)
    make_backend("outlines", embedded_tokenizer, cache_dir=tmp_path).compile(spec)
    [stored] = list(tmp_path.iterdir())
    assert stored.suffix == ".index" and stored.stat().st_size > 0

    def no_compiling(*args: object) -> None:
        raise AssertionError("compiled again despite the cache")

    monkeypatch.setattr(outlines_backend, "build_index", no_compiling)  # the child-process compile path
    again = make_backend("outlines", embedded_tokenizer, compile_timeout_s=30, cache_dir=tmp_path).compile(spec).new()
    for token in embedded_tokenizer.encode('<tool_call>[{"name":"f","arguments":{"x":1}}]'):
        again.accept(token)  # raises if the loaded index does not allow it
    assert again.allows(embedded_tokenizer.turn_end_id or 0)
    fresh = make_backend("outlines", embedded_tokenizer, 30, tmp_path).compile(spec).new()
    assert not fresh.allows(embedded_tokenizer.turn_end_id or 0)  # and still refuses an empty answer


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_forced_text_is_drafted_and_taken_back_at_any_point(embedded_tokenizer: Tokenizer, backend: str) -> None:
    """A long `const` string is forced text: drafted 32 tokens at a time on top of a walk of up to 64, all
    of it taken back after. outlines kept 64 states, and the request failed with "cannot roll back"."""
    sentence = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore "
                "et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation")
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "note": {"const": sentence}},
              "required": ["id", "note"]}
    factory = make_backend(backend, embedded_tokenizer).compile(GrammarSpec(json_schema=schema))
    full = '{"id":5,"note":' + json.dumps(sentence) + "}"
    text = embedded_tokenizer.encode(full)
    drafter = GrammarForcedDrafter(embedded_tokenizer)
    drafted = 0
    for n in range(0, len(text), 3):
        grammar = factory.new()
        for token in text[:n]:
            grammar.accept(token)
        before = grammar.allowed_mask()
        proposal = drafter.propose([1], 32, SamplingParams(), torch.Generator(), grammar)
        assert torch.equal(grammar.allowed_mask(), before)  # the state is as it was
        assert full.startswith(embedded_tokenizer.decode(text[:n] + proposal.tokens))  # forced: the text itself
        drafted += len(proposal.tokens)
    assert drafted > len(text)  # much of it drafted from every point
