"""Progress bars that suit both a terminal and a log file."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


def progress(*args: Any, **kwargs: Any) -> tqdm:
    """`tqdm(...)`, redrawn at most every 30 s when stderr is not a terminal: redirected to a file, a bar
    redrawn ten times a second filled the log of an 11-minute `draftgate bench` with its updates."""
    if not sys.stderr.isatty():
        kwargs.setdefault("mininterval", 30.0)
    return tqdm(*args, **kwargs)
