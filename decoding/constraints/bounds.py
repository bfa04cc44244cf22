"""Limits a route may put on what a schema leaves unbounded, so a small model cannot run on forever.

Greedy decoding of a 135M model repeats itself: inside a free string, in the digits of an integer, in
the local part of an email, in the fraction of a second. Each is valid JSON all the way to
`max_tokens`, and then cut; so is a map (an object open to more keys) that repeats a key. With bounds, a
free string gets `maxLength`, an array `maxItems`, a map `maxProperties`, a number a digit limit, and
the unbounded formats a bounded pattern that only matches valid values of the format. The output is
then valid for the caller's schema too (a subset of its language), and it is validated against the
caller's schema, not the bounded one. Bounded formats also keep outlines' automata small: schemas with
email or uri strings that take outlines minutes unbounded compile in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from decoding.constraints.outlines_maps import is_map
from decoding.constraints.preflight import DATA_KEYWORDS

# bounded patterns for the formats whose values have no natural length, of each format's shape (a date-time
# pattern takes Feb 31: the output check after refuses it)
_LABEL = "[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?"
# RFC 3339 time with at most 6 fraction digits (the backends' own allow any number)
_TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
FORMAT_PATTERNS = {
    "email": f"^[A-Za-z0-9_%+-]{{1,24}}(?:\\.[A-Za-z0-9_%+-]{{1,24}}){{0,2}}@{_LABEL}(?:\\.{_LABEL}){{0,2}}"
             "\\.[a-z]{2,12}$",
    "hostname": f"^{_LABEL}(?:\\.{_LABEL}){{0,3}}$",
    "time": f"^{_TIME}$",
    "date-time": f"^[0-9]{{4}}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])T{_TIME}$",
    "uri": f"^https?://{_LABEL}(?:\\.{_LABEL}){{0,3}}(?:/[A-Za-z0-9._~-]{{1,24}}){{0,6}}$",
}


@dataclass(frozen=True)
class Bounds:
    string_length: int = 64  # maxLength of a string that has none, or only a smaller minLength (and no enum,
    # const, or pattern or format the backend keeps)
    digits: int = 12  # digits of an integer (or of a number's integer and fraction parts) without bounds
    items: int = 4  # maxItems of an array that has none (outlines: 8 strings of 64 can take minutes)
    properties: int = 4  # extra keys of an object open to them (additionalProperties a schema or true);
    # for outlines, of maps only: beside declared properties it generates those alone (outlines_maps.py).
    # outlines' automaton grows with the count: a map of any values takes 6.8 s with 4 keys, 19 s with 8

    def __post_init__(self) -> None:
        for name in ("string_length", "digits", "items", "properties"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def _has_type(schema: dict[str, Any], kind: str) -> bool:
    declared = schema.get("type")
    return declared == kind or (isinstance(declared, list) and kind in declared)


# what a free value becomes under bounds (then bounded as any other node)
FREE_VALUE: dict[str, Any] = {"type": ["string", "number", "boolean", "null"]}
# outlines bounds a number only through its fraction keywords, whose language lacks 5 and 5.25 and takes
# "12." (not JSON): a free value there is an integer, which its digit keyword bounds exactly
FREE_VALUE_OUTLINES: dict[str, Any] = {"type": ["string", "integer", "boolean", "null"]}
_DECLARED = frozenset({"properties", "patternProperties", "required"})


def _is_free(schema: Any) -> bool:
    return schema is True or schema == {}


def _bound_free_values(node: dict[str, Any], bounds: Bounds, backend: str) -> None:
    def free() -> dict[str, Any]:
        value = FREE_VALUE_OUTLINES if backend == "outlines" else FREE_VALUE
        return bound_schema(value, bounds, backend)  # (it has no free values of its own)

    properties = node.get("properties")
    if isinstance(properties, dict):
        for name, sub in properties.items():
            if _is_free(sub):
                properties[name] = free()
    if _has_type(node, "array") and "prefixItems" not in node and _is_free(node.get("items", {})):
        node["items"] = free()
    if _has_type(node, "object"):
        absent = "additionalProperties" not in node and not _DECLARED & node.keys()  # JSON Schema: any key
        if absent or _is_free(node.get("additionalProperties", False)):
            node["additionalProperties"] = free()


def _bound_string(node: dict[str, Any], bounds: Bounds, backend: str) -> None:
    """A string with no maxLength: a bounded pattern for an unbounded format, else a maxLength (never below
    its minLength) where the backend enforces lengths. Beside a pattern or format, outlines keeps a length
    and drops the shape, xgrammar the reverse (preflight.py): a minLength there is all outlines enforces."""
    shaped = {"pattern", "format"} & node.keys()
    lengths_rule = "minLength" in node and backend == "outlines"  # outlines drops the shape for the length
    if node.get("format") in FORMAT_PATTERNS and "pattern" not in node and not lengths_rule:
        node["pattern"] = FORMAT_PATTERNS[node.pop("format")]
    elif not shaped or lengths_rule:
        node["maxLength"] = max(bounds.string_length, int(node.get("minLength", 0)))


def _bound_node(node: dict[str, Any], bounds: Bounds, backend: str) -> None:
    if "enum" in node or "const" in node:
        return
    _bound_free_values(node, bounds, backend)
    if _has_type(node, "string") and "maxLength" not in node:
        _bound_string(node, bounds, backend)
    if _has_type(node, "array") and "maxItems" not in node:
        node["maxItems"] = max(bounds.items, int(node.get("minItems", 0)))
    extra = node.get("additionalProperties")
    open_map = _has_type(node, "object") and (extra is True or isinstance(extra, dict))
    if open_map and (backend == "xgrammar" or is_map(node)) and "maxProperties" not in node:
        node["maxProperties"] = max(len(node.get("properties", {})) + bounds.properties,
                                    int(node.get("minProperties", 0)))
    limit = 10**bounds.digits - 1
    if _has_type(node, "number") and backend == "outlines":
        # its fraction keywords: bounded, at the cost of that language (FREE_VALUE_OUTLINES); unbounded,
        # greedy decoding writes digits until max_tokens
        node.setdefault("maxDigitsInteger", bounds.digits)
        node.setdefault("maxDigitsFraction", bounds.digits)
    if _has_type(node, "integer"):
        if backend == "outlines":  # outlines-core's own digit keyword (it enforces no numeric bounds)
            node.setdefault("maxDigits", bounds.digits)
        else:  # a side the caller left open: +-limit, or `limit` past a caller's bound beyond it
            low = node.get("minimum", node.get("exclusiveMinimum"))
            high = node.get("maximum", node.get("exclusiveMaximum"))
            if low is None:
                node["minimum"] = -limit if high is None or high > -limit else math.floor(high) - limit
            if high is None:
                node["maximum"] = limit if low is None or low < limit else math.ceil(low) + limit


def bound_schema(schema: Any, bounds: Bounds, backend: str) -> Any:
    """A bounded copy of `schema` for `backend`; the caller's schema is left as it is."""
    if isinstance(schema, list):
        return [bound_schema(s, bounds, backend) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v if k in DATA_KEYWORDS else bound_schema(v, bounds, backend) for k, v in schema.items()}
    _bound_node(out, bounds, backend)
    return out
