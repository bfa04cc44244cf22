"""Request parsing alone (no model): fields read, every fault named with its code."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.protocol import RequestError, parse_request

BASE: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def parse(**fields: Any) -> Any:
    return parse_request(json.dumps({**BASE, **fields}).encode())


def test_fields_are_read_with_their_defaults_and_aliases() -> None:
    r = parse(max_tokens=7, stop="END", stream=True, stream_options={"include_usage": True}, seed=3)
    assert r.max_new_tokens == 7 and r.stop_sequences == ("END",) and r.include_usage and r.seed == 3
    assert parse(max_completion_tokens=5).max_new_tokens == 5
    plain = parse()
    assert plain.max_new_tokens is None and plain.stop_sequences == () and not plain.include_usage


def test_no_op_values_of_unsupported_fields_are_accepted() -> None:
    r = parse(n=1, logprobs=False, presence_penalty=0, frequency_penalty=0.0, logit_bias={}, store=False,
              modalities=["text"])
    assert r.n == 1


def test_passthrough_keeps_openai_fields_only() -> None:
    r = parse(temperature=0.2, speculative=False, top_k=5, tools=[{"type": "function"}])
    assert r.passthrough() == {"temperature": 0.2, "tools": [{"type": "function"}]}


@pytest.mark.parametrize(("body", "code", "param"), [
    (b"{not json", "invalid_json", None),
    (b"[1, 2]", "invalid_json", None),
    (json.dumps({**BASE, "temperature": float("nan")}).encode(), "invalid_json", None),  # Python's, not JSON's
    (json.dumps({**BASE, "top_p": float("-inf")}).encode(), "invalid_json", None),
    # nesting past the decoder's recursion limit, and past ours
    (json.dumps(BASE).encode()[:-1] + b', "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "invalid_json", None),
    (json.dumps({**BASE, "metadata": {"a": json.loads("[" * 70 + "]" * 70)}}).encode(), "invalid_json", None),
    (json.dumps({"messages": BASE["messages"]}).encode(), "missing_required_parameter", "model"),
    # an empty array is named by OpenAI's code for it
    (json.dumps({**BASE, "messages": []}).encode(), "empty_array", "messages"),
    (json.dumps({**BASE, "tools": []}).encode(), "empty_array", "tools"),
    (json.dumps({**BASE, "temperature": "0.5"}).encode(), "invalid_type", "temperature"),
    (json.dumps({**BASE, "temperature": 3}).encode(), "invalid_value", "temperature"),
    (json.dumps({**BASE, "max_tokens": 0}).encode(), "invalid_value", "max_tokens"),
    (json.dumps({**BASE, "stream": "yes"}).encode(), "invalid_type", "stream"),
    (json.dumps({**BASE, "stream_options": {"include_usage": 1}}).encode(), "invalid_type",
     "stream_options.include_usage"),
    (json.dumps({**BASE, "stream_options": {"extra": True}}).encode(), "unknown_parameter", "stream_options.extra"),
    (json.dumps({**BASE, "messages": ["hi"]}).encode(), "invalid_type", "messages[0]"),
    (json.dumps({**BASE, "n": 3}).encode(), "unsupported_parameter", "n"),
    (json.dumps({**BASE, "max_tokens": 9, "max_completion_tokens": 5}).encode(), "invalid_parameter_combination",
     "max_tokens"),  # as OpenAI: never one of them silently
    (json.dumps({**BASE, "presence_penalty": 0.5}).encode(), "unsupported_parameter", "presence_penalty"),
    (json.dumps({**BASE, "functions": []}).encode(), "unsupported_parameter", "functions"),
    (json.dumps({**BASE, "stop": ["a", "b", "c", "d", "e"]}).encode(), "invalid_value", "stop"),
    (json.dumps({**BASE, "service_tier": "flex"}).encode(), "invalid_type", "service_tier"),
    (json.dumps({**BASE, "mystery": 1}).encode(), "unknown_parameter", "mystery"),
    (json.dumps({**BASE, "seed": 2**64}).encode(), "invalid_value", "seed"),
    (json.dumps({**BASE, "seed": -(2**63) - 1}).encode(), "invalid_value", "seed"),
    (json.dumps({**BASE, "stop": ["END", ""]}).encode(), "invalid_value", "stop"),
    # a field of several types is named as the request has it, never by pydantic's branch ("stop.str")
    (json.dumps({**BASE, "stop": ["a", 5]}).encode(), "invalid_type", "stop[1]"),
    (json.dumps({**BASE, "stop": 5}).encode(), "invalid_type", "stop"),
    (json.dumps({**BASE, "tool_choice": 5}).encode(), "invalid_type", "tool_choice"),
    # refused here, so on upstream routes too (the local engine's own check says the same)
    (json.dumps({**BASE, "stop": "}", "tools": [{"type": "function", "function": {"name": "f"}}]}).encode(),
     "invalid_parameter_combination", "stop"),
    (json.dumps({**BASE, "stop": "}", "response_format": {"type": "json_object"}}).encode(),
     "invalid_parameter_combination", "stop"),
    # a lone UTF-16 surrogate is valid JSON but not text: named wherever it is, keys included
    (b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800 hi"}]}', "invalid_value",
     "messages[0].content"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": {"k\\udfff": "v"}}',
     "invalid_value", "metadata.k\\udfff"),  # escaped in the error, which must itself be sendable
])
def test_faults_are_named(body: bytes, code: str, param: str | None) -> None:
    with pytest.raises(RequestError) as info:
        parse_request(body)
    assert info.value.code == code and info.value.param == param


def test_surrogate_pairs_and_escaped_backslashes_are_text() -> None:
    pair = parse_request(b'{"model": "m", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}')
    assert pair.messages[0]["content"] == "\U0001F600"
    literal = parse_request(b'{"model": "m", "messages": [{"role": "user", "content": "\\\\ud800"}]}')
    assert literal.messages[0]["content"] == "\\ud800"  # a backslash, then the letters


TOOL: dict[str, Any] = {"type": "function", "function": {"name": "f", "description": "d", "strict": True,
                                                           "parameters": {"type": "object"}}}
SCHEMA: dict[str, Any] = {"type": "json_schema", "json_schema": {"name": "x", "description": "d", "strict": False,
                                                                  "schema": {"type": "object"}}}
CALL: dict[str, Any] = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_every_field_openai_has_inside_messages_tools_and_response_format_is_accepted() -> None:
    messages = [{"role": "developer", "content": "be brief", "name": "ops"},
                {"role": "user", "name": "ann", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": None, "name": "bot", "refusal": None, "audio": None,
                 "function_call": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]
    r = parse(messages=messages, tools=[TOOL], response_format=SCHEMA)
    assert len(r.messages) == 5 and r.response_format == SCHEMA


def test_a_response_message_sent_back_as_it_came_is_accepted_without_its_response_fields() -> None:
    """What the OpenAI SDK's stream helper, `.parse` or `model_dump()` append to the history: the response's
    message with `annotations`, `parsed`, a call's `index` and `parsed_arguments` (a trial's agent loop got
    a 400 on its second turn). They are dropped, for the engine and for an upstream provider alike."""
    sent_back = {"role": "assistant", "content": None, "refusal": None, "annotations": [], "parsed": None,
                 "audio": None, "function_call": None, "reasoning_content": None,
                 "tool_calls": [{**CALL, "index": 0, "function": {**CALL["function"], "parsed_arguments": None}}]}
    r = parse(messages=[{"role": "user", "content": "hi"}, sent_back, {"role": "tool", "tool_call_id": "c1",
                                                                       "content": "42"}])
    assert r.messages[1] == {"role": "assistant", "content": None, "refusal": None, "audio": None,
                             "function_call": None, "tool_calls": [CALL]}
    assert sent_back["annotations"] == [] and sent_back["tool_calls"][0]["index"] == 0  # the caller's, untouched


@pytest.mark.parametrize(("fields", "param"), [
    ({"messages": [{"role": "user", "content": "hi", "nmae": "bob"}]}, "messages[0].nmae"),
    ({"messages": [{"role": "tool", "tool_call_id": "c1", "content": "x", "name": "f"}]}, "messages[0].name"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {}}]}]},
     "messages[0].content[0].cache_control"),
    ({"messages": [{"role": "assistant", "tool_calls": [{**CALL, "idx": 0}]}]}, "messages[0].tool_calls[0].idx"),
    ({"messages": [{"role": "user", "content": "hi", "parsed": None}]}, "messages[0].parsed"),  # assistant's only
    ({"messages": [{"role": "assistant", "tool_calls": [{**CALL, "function": {**CALL["function"], "x": 1}}]}]},
     "messages[0].tool_calls[0].function.x"),
    ({"tools": [{**TOOL, "cache": True}]}, "tools[0].cache"),
    ({"tools": [{"type": "function", "function": {**TOOL["function"], "strictt": True}}]}, "tools[0].function.strictt"),
    ({"response_format": {"type": "json_object", "foo": 1}}, "response_format.foo"),
    # the typo that made a non-strict schema strict, silently
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strictt": False, "schema": {}}}},
     "response_format.json_schema.strictt"),
])
def test_an_unknown_field_inside_is_named_by_its_path(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as info:
        parse(**fields)
    assert info.value.code == "unknown_parameter" and info.value.param == param
    assert f"'{param}'" in str(info.value)
