"""The fields OpenAI's Chat Completions API knows inside a request's nested objects: messages, their
content parts and tool calls, tools, and `response_format`. A field beyond them is a 400
`unknown_parameter` naming its path, as at the top level, on every route: a typo there (`"strictt":
false` in a `json_schema`) would otherwise be ignored, and the request served as if it were absent.

Only the keys are checked here; their values are checked where they are read (decoding/chat.py,
tools.py, structured.py), or by the provider on an upstream route. A message with an unknown role is
left to that check, which names the role.
"""

from __future__ import annotations

from typing import Any

# fields of a *response's* message that clients send back when they append it to the history as it came
# (the OpenAI SDK's stream helper and `.parse`, `model_dump()`, litellm's Message): accepted, and dropped
# (`strip_response_fields`) so neither the local engine nor a provider sees them
RESPONSE_ONLY = {
    "assistant": frozenset({"annotations", "parsed", "reasoning_content", "thinking_blocks",
                            "provider_specific_fields"}),
    "tool_call": frozenset({"index"}),
    "function": frozenset({"parsed_arguments"}),
}
_MESSAGE_FIELDS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "refusal", "tool_calls", "audio", "function_call",
                  *RESPONSE_ONLY["assistant"]},
    "tool": {"role", "content", "tool_call_id"},
}
# content parts by type (other types are refused by decoding/chat.py, by type)
_PART_FIELDS = {"text": {"type", "text"}, "input_text": {"type", "text"}, "refusal": {"type", "refusal"}}
_CALL_FIELDS = {"id", "type", "function", *RESPONSE_ONLY["tool_call"]}
_CALL_FUNCTION_FIELDS = {"name", "arguments", *RESPONSE_ONLY["function"]}
_TOOL_FIELDS = {"type", "function"}
_FUNCTION_FIELDS = {"name", "description", "parameters", "strict"}
_FORMAT_FIELDS = {"type", "json_schema"}
_JSON_SCHEMA_FIELDS = {"name", "description", "schema", "strict"}


def _extra(value: Any, known: set[str], where: str) -> str | None:
    """The path of `value`'s first key outside `known` (a dict's; anything else has none)."""
    if not isinstance(value, dict):
        return None
    return next((f"{where}.{key}" for key in value if key not in known), None)


def _message_field(i: int, message: Any) -> str | None:
    where = f"messages[{i}]"
    known = _MESSAGE_FIELDS.get(str(message.get("role"))) if isinstance(message, dict) else None
    if known is None:
        return None
    if problem := _extra(message, known, where):
        return problem
    content = message.get("content")
    for j, part in enumerate(content if isinstance(content, list) else ()):
        fields = _PART_FIELDS.get(str(part.get("type"))) if isinstance(part, dict) else None
        if fields is not None and (problem := _extra(part, fields, f"{where}.content[{j}]")):
            return problem
    calls = message.get("tool_calls")
    for j, call in enumerate(calls if isinstance(calls, list) else ()):
        if problem := (_extra(call, _CALL_FIELDS, f"{where}.tool_calls[{j}]")
                       or _extra(call.get("function") if isinstance(call, dict) else None, _CALL_FUNCTION_FIELDS,
                                 f"{where}.tool_calls[{j}].function")):
            return problem
    return None


def unknown_field(messages: list[Any], tools: list[Any] | None, response_format: Any) -> str | None:
    """The path of the first field inside a request's messages, tools or response_format that OpenAI's
    API does not have (`messages[0].nmae`), or None."""
    for i, message in enumerate(messages):
        if problem := _message_field(i, message):
            return problem
    for i, tool in enumerate(tools or ()):
        if problem := (_extra(tool, _TOOL_FIELDS, f"tools[{i}]")
                       or _extra(tool.get("function") if isinstance(tool, dict) else None, _FUNCTION_FIELDS,
                                 f"tools[{i}].function")):
            return problem
    return _extra(response_format, _FORMAT_FIELDS, "response_format") or _extra(
        response_format.get("json_schema") if isinstance(response_format, dict) else None, _JSON_SCHEMA_FIELDS,
        "response_format.json_schema")


def strip_response_fields(messages: list[Any]) -> list[Any]:
    """The messages without the response-only fields of an assistant message sent back (RESPONSE_ONLY);
    everything else as it came."""
    out = []
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "assistant":
            message = {k: v for k, v in message.items() if k not in RESPONSE_ONLY["assistant"]}
            calls = message.get("tool_calls")
            if isinstance(calls, list):
                message["tool_calls"] = [_strip_call(c) for c in calls]
        out.append(message)
    return out


def _strip_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    call = {k: v for k, v in call.items() if k not in RESPONSE_ONLY["tool_call"]}
    if isinstance(call.get("function"), dict):
        call["function"] = {k: v for k, v in call["function"].items() if k not in RESPONSE_ONLY["function"]}
    return call
