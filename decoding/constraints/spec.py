"""What a constrained output must be, independent of the backend that compiles it.

An output is one of up to three alternatives, chosen by the model's first tokens:
- a JSON value of `json_schema` (`response_format`);
- the tool-call marker followed by a JSON array of calls matching `calls_schema` (`tools`);
- free text that does not begin with the marker (`tool_choice: auto` without a response format); it is
  never empty, nor a strict prefix of the marker (see `text_not_starting_with`).
Each backend turns a spec into one grammar, so the choice between the alternatives is the model's own,
sampled under one mask: the constrained distribution is exact, with no second pass.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from decoding.constraints.base import ConstraintError

TOOL_CALL_MARKER = "<tool_call>"


def could_be_call(text: str) -> bool:
    """Whether streamed text may still turn out to be a tool call: it starts with the marker, or is a
    start of it. Such text is held back until the call is parsed."""
    return text.startswith(TOOL_CALL_MARKER) or TOOL_CALL_MARKER.startswith(text)


@dataclass(frozen=True)
class GrammarSpec:
    json_schema: dict[str, Any] | None = None
    calls_schema: dict[str, Any] | None = None
    free_text: bool = False
    marker: str = TOOL_CALL_MARKER

    def __post_init__(self) -> None:
        if self.json_schema is None and self.calls_schema is None:
            raise ConstraintError("a grammar needs a JSON schema or a tool-call schema")
        if self.json_schema is not None and self.free_text:
            raise ConstraintError("free text and a JSON response format exclude each other")
        if (self.calls_schema is not None or self.free_text) and not self.marker:
            raise ConstraintError("tool calls need a non-empty marker")

    def key(self) -> str:
        """A digest of the spec: equal specs share one compiled grammar. Keys keep their order: a grammar
        writes properties in the order the schema declares them, so two orders are two grammars."""
        data = [self.json_schema, self.calls_schema, self.free_text, self.marker]
        return hashlib.sha256(json.dumps(data).encode()).hexdigest()


_META = frozenset("\\.+*?()|[]{}^$#&-~")


def regex_escape(text: str) -> str:
    """Escape the regex metacharacters only: both Rust's regex (outlines) and xgrammar read the result."""
    return "".join(f"\\{c}" if c in _META else c for c in text)


def text_not_starting_with(prefix: str) -> str:
    """A regex for every non-empty string that departs from `prefix` within its length.

    Without look-ahead: any first character but prefix[0] then anything, or prefix[0] followed by a
    string that departs from prefix[1:]. The strict prefixes themselves ("<", "<tool", ...) are left out
    on purpose: outlines-core only lets a token end in a state just past a complete match if the text is
    a complete match again, so a text alternative that could end at "<tool_call" would block the ">"
    of the tool-call alternative; and an empty alternative blocks every first token that could go on
    to a longer match. So free text beside tool calls is never empty and never a bare "<tool".
    """
    regex = ""
    for i, char in enumerate(reversed(prefix)):
        c = regex_escape(char)
        regex = f"[^{c}][\\s\\S]*|{c}(?:{regex})" if i else f"[^{c}][\\s\\S]*"
    return f"(?:{regex})"
