"""Text the target reads rather than writes: documentation and code from the Python standard library
(present on every machine that runs draftgate; nothing is downloaded), as assistant turns.

The target's generations on the project's prompts are narrow: a head trained on them alone memorises
their templates. Teacher forcing the target over varied text (its top-K at every position, as EAGLE
trains on fixed responses) teaches the head how the target's features map to its next tokens in
general, for the cost of one forward pass per sequence.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pydoc_data.topics
import random
import textwrap
from dataclasses import dataclass

# stdlib modules with plain, readable functions (a fixed list, so the data set is the same everywhere)
CODE_MODULES = (
    "argparse", "base64", "bisect", "calendar", "csv", "dataclasses", "difflib", "email.utils", "enum",
    "fnmatch", "fractions", "functools", "glob", "gzip", "heapq", "html", "http.cookies", "ipaddress",
    "json.decoder", "json.encoder", "mimetypes", "pathlib", "pprint", "quopri", "random", "shlex", "shutil",
    "statistics", "string", "tarfile", "textwrap", "tokenize", "urllib.parse", "uuid", "zipfile",
)
DOC_ASKS = (
    "Explain {topic} in Python.", "How does {topic} work in Python?", "What should I know about {topic}?",
    "Can you describe {topic} for me?", "Give me the reference documentation for {topic}.",
)
CODE_ASKS = (
    "Show me how `{name}` is implemented.", "Write a Python function `{name}` like the standard library's.",
    "What does the code of `{name}` in `{module}` look like?", "Implement `{name}` in Python.",
)


@dataclass(frozen=True)
class TextTurn:
    category: str  # "doc" or "code"
    ask: str  # the user's turn
    text: str  # the assistant's turn, teacher-forced


def doc_chunks(max_chars: int) -> list[tuple[str, str]]:
    """(topic, chunk) from the interpreter's own reference documentation, split at paragraph breaks."""
    out: list[tuple[str, str]] = []
    for topic, body in sorted(pydoc_data.topics.topics.items()):
        chunk = ""
        for para in body.split("\n\n"):
            if chunk and len(chunk) + len(para) > max_chars:
                out.append((topic, chunk.strip()))
                chunk = ""
            chunk += para[:max_chars] + "\n\n"
        if len(chunk.strip()) > 200:
            out.append((topic, chunk.strip()))
    return out


def code_chunks(max_lines: int) -> list[tuple[str, str, str]]:
    """(module, function name, source) of top-level functions and methods of CODE_MODULES."""
    out: list[tuple[str, str, str]] = []
    for name in CODE_MODULES:
        try:
            source = inspect.getsource(importlib.import_module(name))
        except (ImportError, OSError, TypeError):
            continue
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if 6 <= length <= max_lines:
                    body = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
                    out.append((name, node.name, body))
    return out


def text_turns(rng: random.Random, count: int, max_chars: int = 1800, max_lines: int = 45) -> list[TextTurn]:
    """`count` turns, half documentation and half code, drawn without replacement."""
    docs = doc_chunks(max_chars)
    code = code_chunks(max_lines)
    rng.shuffle(docs)
    rng.shuffle(code)
    turns: list[TextTurn] = []
    for i in range(count):
        if i % 2 == 0 and docs:
            topic, chunk = docs.pop()
            turns.append(TextTurn("doc", rng.choice(DOC_ASKS).format(topic=f"'{topic}'"), chunk))
        elif code:
            module, name, body = code.pop()
            ask = rng.choice(CODE_ASKS).format(name=name, module=module)
            turns.append(TextTurn("code", ask, f"Here is `{name}`:\n\n```python\n{body}\n```"))
    return turns
