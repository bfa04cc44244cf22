"""minProperties / maxProperties of maps, for outlines-core, whose regex repeats a map's keys `{0,}`.

A *map* is an object with no declared properties, open to any key (`additionalProperties` a schema or
true): `{"type": "object", "additionalProperties": {"type": "string"}, "maxProperties": 8}`. outlines-core
compiles it but ignores the counts. Here each such map is swapped for a placeholder `const` before
outlines builds the regex, and the placeholder's regex is then replaced by one that repeats the
key-value pair exactly as often as the counts allow. (outlines ignores `additionalProperties` beside
declared properties, generating the declared ones only, so objects with properties need nothing.)
A map whose JSON repeats a key is one key fewer once parsed; every output is validated, so a
`minProperties` broken that way is reported, never returned as valid.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from decoding.constraints.base import ConstraintError

COUNT_KEYS = ("minProperties", "maxProperties")
_PLACEHOLDER = "__draftgate_map_{}__"


def is_map(node: Any) -> bool:
    """An object with no declared properties that admits any key."""
    if not isinstance(node, dict):
        return False
    declared = node.get("type")
    is_object = declared == "object" or (isinstance(declared, list) and "object" in declared)
    extra = node.get("additionalProperties")
    return (is_object and (extra is True or isinstance(extra, dict))
            and not {"properties", "patternProperties", "required"} & node.keys())


def counted_map_regex(schema: Any, build: Callable[[str], str]) -> str:
    """outlines' regex for `schema` (via `build`, JSON text -> regex), maps' counts enforced."""
    maps: list[dict[str, Any]] = []
    defs = {k: schema[k] for k in ("$defs", "definitions") if isinstance(schema, dict) and k in schema}

    def swap(node: Any) -> Any:
        if isinstance(node, list):
            return [swap(v) for v in node]
        if not isinstance(node, dict):
            return node
        if is_map(node) and COUNT_KEYS & node.keys():
            maps.append(node)
            return {"const": _PLACEHOLDER.format(len(maps) - 1)}
        return {k: swap(v) for k, v in node.items()}

    regex = build(json.dumps(swap(schema)))
    for i, node in enumerate(maps):
        placeholder = build(json.dumps({"const": _PLACEHOLDER.format(i)}))
        if placeholder not in regex:  # a map under a keyword outlines does not reach: nothing to count
            continue
        regex = regex.replace(placeholder, _map_regex(node, defs, build))
    return regex


def _map_regex(node: dict[str, Any], defs: dict[str, Any], build: Callable[[str], str]) -> str:
    extra = node["additionalProperties"]
    value_schema = {} if extra is True else dict(extra)
    if defs and "$ref" in json.dumps(value_schema):
        value_schema.update(defs)  # the value's references resolve against the root's definitions
    key = build(json.dumps({"type": "string"}))
    value = counted_map_regex(value_schema, build)  # a map inside a map's values is counted too
    pair = f"{key}:(?:{value})"
    low = int(node.get("minProperties", 0))
    high = node.get("maxProperties")
    if high is not None and int(high) < low:
        raise ConstraintError(f"no object has at least {low} and at most {high} properties")
    if high is not None and int(high) == 0:
        return re.escape("{}")
    more = f"{{{max(low - 1, 0)},{'' if high is None else int(high) - 1}}}"
    pairs = f"{pair}(?:,{pair}){more}"
    return rf"\{{{pairs}\}}" if low > 0 else rf"\{{(?:{pairs})?\}}"
