"""Read a policy YAML file into typed settings; every error names the file, the line and the key.

The file is composed into YAML nodes (which keep their line numbers) and walked against the field
tables of `policies.model`: unknown keys are refused, types are checked, defaults filled in. The walk
goes on past a mistake, so one error names every mistake in the file, a line each; a record with a
mistake inside is not built (its own checks would only repeat it). New sections add tables, not code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import MISSING, fields, is_dataclass
from importlib import resources
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from policies.model import FieldError, Policy

DEFAULT_POLICY = "default.yaml"


class PolicyError(ValueError):
    """A policy file that cannot be used: where (file:line), which key ("" for the file as a whole), and
    what is wrong; `more`: the file's other mistakes, each a line of the message after this one."""

    code = "invalid_policy"

    def __init__(self, source: str, line: int | None, key: str, message: str,
                 more: Sequence[PolicyError] = ()) -> None:
        where = f"{source}:{line}" if line is not None else source
        text = f"{where}: {key}: {message}" if key else f"{where}: {message}"
        super().__init__("\n".join([text, *(str(e) for e in more)]))
        self.source, self.line, self.key, self.message = source, line, key, message
        self.more = tuple(more)

    @classmethod
    def combined(cls, errors: Sequence[PolicyError]) -> PolicyError:
        """One error for several mistakes, in the file's order: the first names line and key."""
        first, *rest = sorted(errors, key=lambda e: e.line if e.line is not None else 0)
        return cls(first.source, first.line, first.key, first.message, rest)


class _Skipped:
    """What a record with a mistake inside becomes: nothing is built from it."""


SKIPPED = _Skipped()


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _scalar(node: yaml.Node) -> Any:
    return yaml.safe_load(yaml.serialize(node))


class _Walker:
    def __init__(self, source: str) -> None:
        self.source = source
        self.errors: list[PolicyError] = []  # every mistake found so far

    def fail(self, node: yaml.Node | None, key: str, message: str) -> PolicyError:
        return PolicyError(self.source, _line(node) if node is not None else None, key, message)

    def value(self, node: yaml.Node, hint: Any, key: str) -> Any:
        origin = get_origin(hint)
        if origin in (Union, UnionType):
            options = [a for a in get_args(hint) if a is not type(None)]
            if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
                return None
            return self.value(node, options[0], key)
        if is_dataclass(hint):
            return self.record(node, hint, key)
        if origin in (list, tuple):
            if not isinstance(node, yaml.SequenceNode):
                raise self.fail(node, key, "must be a list")
            (item,) = get_args(hint)[:1]
            items = []
            for i, child in enumerate(node.value):
                try:
                    items.append(self.value(child, item, f"{key}[{i}]"))
                except PolicyError as exc:
                    self.errors.append(exc)
            return tuple(items) if origin is tuple else items
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, key, f"must be {_a(hint.__name__)}")
        value = _scalar(node)
        if hint is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
            raise self.fail(node, key, f"must be {_a(hint.__name__)}, got {value!r}")
        return value

    def record(self, node: yaml.Node, cls: Any, key: str) -> Any:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key, "must be a mapping")
        hints = get_type_hints(cls)
        known = {f.name: f for f in fields(cls)}
        given: dict[str, Any] = {}
        value_nodes: dict[str, yaml.Node] = {}
        faulty: set[str] = set()  # fields with a mistake inside
        found = len(self.errors)
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):  # `? [a]` makes a list a key
                self.errors.append(self.fail(key_node, key, "a key must be a plain name, not a list or mapping"))
                continue
            name = _scalar(key_node)
            path = _child(key, name)
            before = len(self.errors)
            try:
                if not isinstance(name, str) or name not in known:
                    raise self.fail(key_node, path, f"unknown key (known here: {', '.join(known)})")
                if name in value_nodes:
                    raise self.fail(key_node, path, "given twice")
                value_nodes[name] = value_node
                given[name] = self.value(value_node, hints[name], path)
            except PolicyError as exc:
                self.errors.append(exc)
            if isinstance(name, str) and (len(self.errors) > before or given.get(name) is SKIPPED):
                faulty.add(name)
        if len(self.errors) > found:
            self.probe(cls, {n: v for n, v in given.items() if n not in faulty}, node, key, value_nodes)
            return SKIPPED
        try:
            return self.build(cls, given, node, key, value_nodes)
        except PolicyError as exc:
            self.errors.append(exc)
            return SKIPPED

    def build(self, cls: Any, given: dict[str, Any], node: yaml.Node, key: str,
              value_nodes: dict[str, yaml.Node]) -> Any:
        known = {f.name: f for f in fields(cls)}
        missing = [n for n, f in known.items()
                   if n not in given and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise self.fail(node, key, f"missing required key {missing[0]!r}")
        try:
            return cls(**given)
        except (FieldError, ValueError) as exc:
            raise self.checked(exc, node, key, value_nodes)[0] from exc

    def checked(self, exc: Exception, node: yaml.Node, key: str,
                value_nodes: dict[str, yaml.Node]) -> tuple[PolicyError, str | None]:
        """A record's own check (__post_init__) that failed, as a PolicyError at the line it faults, and
        the field it names (None: the record as a whole)."""
        if isinstance(exc, FieldError):  # names the value at fault by its path inside the record
            found, path = _node_at(node, exc.path, key)
            return self.fail(found, path, str(exc)), str(exc.path[0]) if exc.path else None
        # a message that starts with a given field's name is that field's fault, named with its own line
        message = str(exc)
        name = next((n for n in value_nodes if message.startswith(f"{n} ")), None)
        if name is None:
            return self.fail(node, key, message), None
        return self.fail(value_nodes[name], _child(key, name), message), name

    def probe(self, cls: Any, good: dict[str, Any], node: yaml.Node, key: str,
              value_nodes: dict[str, yaml.Node]) -> None:
        """A record with a mistake inside is not built, but the checks of its other fields still run, so
        a file's every mistake comes in one error: each check that faults a field without a mistake of its
        own is reported, and that field left out for the next try. A check of the record as a whole is
        not (it would judge the defaults standing in for the fields at fault)."""
        for _ in range(len(good)):
            try:
                cls(**good)
                return
            except (FieldError, ValueError) as exc:
                error, name = self.checked(exc, node, key, value_nodes)
            except TypeError:  # a required field at fault: nothing to build a probe from
                return
            if name not in good:
                return
            self.errors.append(error)
            del good[name]


def _node_at(node: yaml.Node, path: tuple[str | int, ...], key: str) -> tuple[yaml.Node, str]:
    """The node at `path` below the record `node` (at `key`), and its dotted key; as deep as it goes."""
    for step in path:
        if isinstance(step, int) and isinstance(node, yaml.SequenceNode) and step < len(node.value):
            node, key = node.value[step], f"{key}[{step}]"
            continue
        child = next((v for k, v in getattr(node, "value", ()) if isinstance(node, yaml.MappingNode)
                      and _scalar(k) == step), None)
        if child is None:
            break
        node, key = child, _child(key, step)
    return node, key


def _child(key: str, name: object) -> str:
    """The dotted path of field `name` inside the record at `key` ("" for the top level)."""
    return f"{key}.{name}" if key else str(name)


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def parse_policy(text: str, source: str) -> Policy:
    """A policy from YAML text; `source` names it in errors."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise PolicyError(source, line, "", f"not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    if root is None:
        raise PolicyError(source, None, "", "the file is empty")
    walker = _Walker(source)
    policy = walker.record(root, Policy, "")
    if walker.errors:
        raise PolicyError.combined(walker.errors)
    assert isinstance(policy, Policy)
    return policy


def policy_source(path: str | Path | None = None) -> str:
    """How errors name the policy at `path` (None: the shipped default)."""
    return f"policies/{DEFAULT_POLICY}" if path is None else str(path)


def load_policy(path: str | Path | None = None) -> Policy:
    """The policy at `path`, or the shipped default (`policies/default.yaml`)."""
    if path is None:
        text = resources.files("policies").joinpath(DEFAULT_POLICY).read_text(encoding="utf-8")
        return parse_policy(text, policy_source())
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(policy_source(path), None, "", f"cannot read the policy file: {exc.strerror or exc}") from exc
    return parse_policy(text, policy_source(path))
