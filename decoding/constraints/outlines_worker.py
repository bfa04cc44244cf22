"""Build an outlines-core index in a child process, so a schema whose DFA explodes can be given up on.

outlines-core determinises the schema's regex and walks every token through it: string formats such
as `date-time`, `email` or `uri` inside arrays can take minutes. The parent waits `timeout_s`, then
kills the child and reports the schema as too complex for outlines. The child runs this file as a
script (not the package, which would import torch) and starts in a fraction of a second.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Any


def build_index(regex: str, eos_token_id: int, tokens: dict[bytes, list[int]], timeout_s: float) -> Any:
    """The index, or TimeoutError after `timeout_s`, or ValueError from outlines-core."""
    payload = pickle.dumps((regex, eos_token_id, tokens))
    try:
        done = subprocess.run([sys.executable, __file__], input=payload, capture_output=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired as exc:  # subprocess.run has killed the child
        raise TimeoutError(f"no index after {timeout_s:g} s") from exc
    if done.returncode != 0:
        raise ValueError(done.stderr.decode(errors="replace").strip().splitlines()[-1])
    return pickle.loads(done.stdout)


def _main() -> None:
    import outlines_core

    regex, eos_token_id, tokens = pickle.loads(sys.stdin.buffer.read())
    index = outlines_core.Index(regex, outlines_core.Vocabulary(eos_token_id, tokens))
    sys.stdout.buffer.write(pickle.dumps(index))


if __name__ == "__main__":
    _main()
