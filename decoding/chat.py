"""OpenAI chat messages -> the model's prompt: tools described in the system turn, calls and results inline.

The embedded model's chat template is plain ChatML with string contents, so the conversation is first
normalised to `{"role", "content": str}` turns:
- `developer` is a system turn; text content parts are joined; other parts (images, audio) are refused;
- the tools (unless `tool_choice` is "none") are described in the system turn, with the exact call
  format the grammar enforces;
- an assistant turn with `tool_calls` is written as the model would have written the calls;
- tool results become a user turn of `<tool_response>` blocks naming the function they answer.
"""

from __future__ import annotations

import json
from typing import Any

from decoding.constraints.spec import TOOL_CALL_MARKER
from decoding.errors import EmptyArrayError, MessageError
from decoding.tokenizer import Tokenizer
from decoding.tools import Tool, ToolChoice, render_calls

ROLES = ("system", "developer", "user", "assistant", "tool")


def tools_prompt(tools: list[Tool], choice: ToolChoice, answer_schema: dict[str, Any] | None = None) -> str:
    """The system prompt's description of the tools. With `answer_schema` (a JSON response_format) the
    answer besides a call is JSON of that schema, not text: the grammar allows no other."""
    listed = "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools if t.name in choice.allowed)
    how_many = "one or more calls" if choice.max_calls is None else "exactly one call"
    otherwise = ("answer in plain text." if answer_schema is None else
                 "give your final answer as JSON matching this JSON Schema, and nothing else: "
                 + json.dumps(answer_schema, ensure_ascii=False, separators=(",", ":")))
    when = ("You must call a function." if choice.mode == "required"
            else f"Call a function when it helps; otherwise {otherwise}")
    return (
        "You can call functions. Their signatures, as JSON Schema, are within <tools></tools>:\n"
        f"<tools>\n{listed}\n</tools>\n"
        f"{when} To call, reply with {TOOL_CALL_MARKER} followed by a JSON array of {how_many}, and nothing "
        f'else:\n{TOOL_CALL_MARKER}[{{"name":"<function name>","arguments":{{<arguments>}}}}]'
    )


def _text(content: Any, where: str, allow_none: bool = False) -> str:
    if content is None and allow_none:
        return ""
    if isinstance(content, str):
        return content
    if content == []:
        raise EmptyArrayError(f"{where} is an empty array: give a string, or at least one text part", param=where)
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            field = "refusal" if kind == "refusal" else "text"  # (a refusal part: an assistant's earlier refusal)
            if kind not in ("text", "input_text", "refusal"):
                raise MessageError(f"{where}[{j}]: only text content parts are supported, got {kind!r}",
                                   param=f"{where}[{j}]")
            assert isinstance(part, dict)
            if not isinstance(part.get(field), str):
                raise MessageError(f"{where}[{j}].{field} must be a string, got {_json_type(part.get(field))}",
                                   param=f"{where}[{j}].{field}")
            parts.append(part[field])
        return "".join(parts)
    raise MessageError(f"{where} must be a string or a list of text parts", param=where)


def _json_type(value: Any) -> str:
    if value is None:
        return "nothing"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
             dict: "an object"}
    return next((name for kind, name in names.items() if isinstance(value, kind)), type(value).__name__)


def _check_string(message: dict[str, Any], field: str, where: str, optional: bool = True) -> None:
    value = message.get(field)
    if not (isinstance(value, str) or (optional and value is None)):
        raise MessageError(f"{where}.{field} must be a string, got {_json_type(value)}", param=f"{where}.{field}")


def _check_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's tool_calls, each with an id, type "function", a name and its arguments as a
    JSON string (OpenAI's types: an object there was rendered into the prompt as it came)."""
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise MessageError(f"{where}.tool_calls must be an array", param=f"{where}.tool_calls")
    if not calls:
        raise EmptyArrayError(f"{where}.tool_calls is an empty array: leave it out, or give at least one call",
                              param=f"{where}.tool_calls")
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(call.get("id"), str):
            raise MessageError(f"{at} needs an id and function.name", param=at)
        if call.get("type") != "function":
            raise MessageError(f"{at}.type must be \"function\", got {json.dumps(call.get('type'))}",
                               param=f"{at}.type")
        _check_string(fn, "arguments", f"{at}.function", optional=False)
    return calls


def _check_answered(at: int, ids: list[str]) -> None:
    """An assistant message's tool calls are each answered by a tool message before any other message
    (OpenAI refuses the same): a call left unanswered would leave the model to guess its result."""
    if ids:
        raise MessageError(f"messages[{at}] (an assistant message with tool_calls) must be followed by tool messages "
                           f"answering each call; no result for {', '.join(map(repr, ids))}",
                           param=f"messages[{at}].tool_calls")


def normalize_messages(messages: Any, tools: list[Tool], choice: ToolChoice,
                       answer_schema: dict[str, Any] | None = None) -> list[dict[str, str]]:
    """OpenAI messages -> plain ChatML turns; every error names the message and field. `answer_schema`:
    a JSON response_format beside the tools (see `tools_prompt`)."""
    if not isinstance(messages, list) or not messages:
        raise MessageError("'messages' must be a non-empty array", param="messages")
    turns: list[dict[str, str]] = []
    call_names: dict[str, str] = {}  # tool_call_id -> function name, from earlier assistant turns
    unanswered: tuple[int, list[str]] = (-1, [])  # the latest assistant message's calls with no result yet
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise MessageError(f"{where} must be an object", param=where)
        role = message.get("role")
        if role not in ROLES:
            raise MessageError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", param=f"{where}.role")
        if role != "tool":
            _check_answered(*unanswered)
        _check_string(message, "name", where)  # (the chat template has no place for it: not rendered)
        if role == "assistant":
            _check_string(message, "refusal", where)
            calls = _check_calls(message.get("tool_calls"), where)
            text = _text(message.get("content"), f"{where}.content", allow_none=True)
            for call in calls:
                call_names[call["id"]] = call["function"]["name"]
            unanswered = (i, [call["id"] for call in calls])
            if calls:
                text = (text + "\n" if text else "") + render_calls(calls)
            turns.append({"role": "assistant", "content": text})
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise MessageError(f"{where} (a tool result) needs tool_call_id: the id (a string) of the "
                                   "assistant's tool call it answers", param=f"{where}.tool_call_id")
            if call_id not in call_names:
                raise MessageError(f"{where}.tool_call_id {call_id!r} answers no tool call of an earlier assistant "
                                   "message", param=f"{where}.tool_call_id")
            if call_id in unanswered[1]:
                unanswered[1].remove(call_id)
            result = json.dumps({"name": call_names[call_id], "content": _text(message.get("content"),
                                                                              f"{where}.content")},
                                ensure_ascii=False)
            block = f"<tool_response>\n{result}\n</tool_response>"
            if i > 0 and messages[i - 1].get("role") == "tool":  # consecutive results share one turn
                turns[-1]["content"] += "\n" + block
            else:
                turns.append({"role": "user", "content": block})
        else:
            turns.append({"role": "system" if role == "developer" else role,
                          "content": _text(message.get("content"), f"{where}.content")})
    _check_answered(*unanswered)
    if tools and choice.mode != "none":
        described = tools_prompt(tools, choice, answer_schema)
        if turns[0]["role"] == "system":
            turns[0]["content"] += "\n\n" + described
        else:
            turns.insert(0, {"role": "system", "content": described})
    return turns


def render_prompt(tokenizer: Tokenizer, messages: Any, tools: list[Tool], choice: ToolChoice,
                  answer_schema: dict[str, Any] | None = None) -> list[int]:
    """Token ids of the conversation, ending where the assistant's reply begins."""
    return tokenizer.apply_chat_template(normalize_messages(messages, tools, choice, answer_schema))
