"""When a `oneOf` is an `anyOf`: branches that no value can match twice.

Both backends generate `oneOf` as `anyOf`: any branch will do, so a value that two branches accept is
valid output for them and invalid for the schema (`{"oneOf": [{"type": "number"}, {"type": "integer"}]}`
and `5`). Where no value can match two branches, the two keywords are the same constraint. This module
proves that for the common shapes and says "may overlap" for the rest:

- different JSON types (an integer is a number too);
- different constant values (`const`, `enum`);
- objects told apart by a property both require, with disjoint schemas there: a tagged union, the shape
  pydantic emits for a discriminated union.

Sound by construction: where a branch is narrowed (a `$ref` with sibling keywords, a one-schema
`allOf`), the wider schema is what is compared, and two wider schemas that share no value leave the
narrower ones none to share either.
"""

from __future__ import annotations

from typing import Any

from decoding.constraints.refs import resolve_local

# how deep into tagged properties the proof looks (a tag is normally one level down)
MAX_DEPTH = 4


def branches_disjoint(branches: list[Any], root: Any) -> bool:
    """True when no JSON value can match two of `branches` (schemas in the document `root`)."""
    wide = [_widen(b, root) for b in branches]
    return all(_disjoint(a, b, root, 0) for i, a in enumerate(wide) for b in wide[i + 1 :])


def _widen(schema: Any, root: Any) -> Any:
    # a schema with a local $ref matches only what the ref's target matches; a one-schema allOf, only
    # what its schema matches: compare the wider schema (refs.py has checked that refs resolve)
    for _ in range(32):  # a chain of refs, never a cycle of them
        if not isinstance(schema, dict):
            return schema
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            schema = resolve_local(root, ref, missing=True)  # True: anything
        elif isinstance(schema.get("allOf"), list) and len(schema["allOf"]) == 1 and not _types(schema):
            schema = schema["allOf"][0]
        else:
            return schema
    return schema


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}[type(value)]


def _types(schema: dict[str, Any]) -> set[str] | None:
    """The JSON types a schema allows, or None for any."""
    values = _values(schema)
    if values is not None:
        return {_json_type(v) for v in values}
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return set(declared)
    return None


def _values(schema: dict[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return list(enum) if isinstance(enum, list) else None


def _canonical(value: Any) -> Any:
    # JSON Schema equality: 1 == 1.0, key order does not matter; booleans are not numbers
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, int | float):
        return ("number", float(value))
    if isinstance(value, list):
        return ("array", tuple(_canonical(v) for v in value))
    return ("object", tuple(sorted((k, _canonical(v)) for k, v in value.items())))


def _types_overlap(a: set[str], b: set[str]) -> bool:
    return bool(a & b) or ("integer" in a and "number" in b) or ("number" in a and "integer" in b)


def _disjoint(a: Any, b: Any, root: Any, depth: int) -> bool:
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False  # `true` (or a malformed schema) matches anything
    ta, tb = _types(a), _types(b)
    if ta is not None and tb is not None and not _types_overlap(ta, tb):
        return True
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None and not {_canonical(v) for v in va} & {_canonical(v) for v in vb}:
        return True
    if depth >= MAX_DEPTH or ta != {"object"} or tb != {"object"}:
        return False
    both = set(a.get("required") or []) & set(b.get("required") or [])
    props_a, props_b = a.get("properties") or {}, b.get("properties") or {}
    return any(
        _disjoint(_widen(props_a.get(name, True), root), _widen(props_b.get(name, True), root), root, depth + 1)
        for name in sorted(both)
    )
