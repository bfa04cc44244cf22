"""A schema's `$ref`s, checked before a backend sees them: each must point inside the schema, and a
recursive one is named (outlines-core cuts recursion off at a fixed depth and can then emit invalid
JSON, `{"v":1,}`; xgrammar's grammar recurses as the schema does)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from decoding.constraints.base import ConstraintError


def _refs(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(JSON pointer of the schema object holding it, the $ref) for every $ref in `node`."""
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield path, node["$ref"]
        for key, value in node.items():
            yield from _refs(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _refs(value, f"{path}/{i}")


_MISSING = object()


def resolve_local(schema: Any, ref: str, missing: Any = _MISSING) -> Any:
    """The sub-schema a local `#/...` pointer names, or `missing`."""
    node = schema
    for token in ref.removeprefix("#").split("/")[1:] if ref != "#" else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return missing
    return node


def check_refs(schema: Any) -> None:
    """Raise ConstraintError for a $ref that is remote or points at nothing, naming where it is."""
    for path, ref in _refs(schema):
        if not ref.startswith("#"):
            raise ConstraintError(f"$ref {ref!r} at {path or '/'}: only references inside the schema "
                                  "('#/$defs/...') can be followed; nothing is fetched")
        if resolve_local(schema, ref) is _MISSING:
            raise ConstraintError(f"$ref {ref!r} at {path or '/'} points at nothing in the schema")


def recursive_refs(schema: Any) -> list[str]:
    """The paths of the $refs that close a cycle: inside a target that reaches itself again through
    $refs, pointing into such a cycle (checked refs only; a root `$ref` into a recursive definition is
    not one)."""
    inner: dict[str, set[str]] = {}  # target -> the targets its own sub-schema refers to

    def reach(target: str) -> set[str]:
        if target not in inner:
            inner[target] = {ref for _, ref in _refs(resolve_local(schema, target))}
        return inner[target]

    def cyclic(start: str) -> bool:
        seen: set[str] = set()
        todo = list(reach(start))
        while todo:
            target = todo.pop()
            if target == start:
                return True
            if target not in seen:
                seen.add(target)
                todo += reach(target)
        return False

    refs = list(_refs(schema))
    on_cycles = [target.removeprefix("#") for target in {ref for _, ref in refs} if cyclic(target)]

    def inside(path: str) -> bool:
        return any(path == t or path.startswith(t + "/") for t in on_cycles)

    return [path for path, ref in refs if ref.removeprefix("#") in on_cycles and inside(path)]
