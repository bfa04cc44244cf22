"""Draft heads that ship with draftgate, one per embedded target (trained by `draftgate distill`; each
file's model card is the README beside it)."""

from __future__ import annotations

from pathlib import Path

from decoding.loading import EMBEDDED_NAME

SHIPPED = {EMBEDDED_NAME: "smollm2-135m-eagle.safetensors"}


def shipped_draft(target_name: str) -> Path | None:
    """The shipped draft head for a target, or None when draftgate ships none for it."""
    name = SHIPPED.get(target_name)
    if name is None:
        return None
    path = Path(__file__).with_name(name)
    return path if path.is_file() else None
