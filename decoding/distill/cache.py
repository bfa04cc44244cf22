"""The distillation data set, built once per (target, data config) and kept in the draftgate cache."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

from decoding.distill.data import DataConfig, Sequence, build_sequences, load_sequences, save_sequences, teacher_force
from decoding.loading import LoadedModel
from decoding.tokenizer import cache_root

log = logging.getLogger(__name__)


def data_path(target: LoadedModel, config: DataConfig, directory: Path | None = None) -> Path:
    key = json.dumps({"target": target.name, "tokenizer": target.tokenizer.fingerprint(), **asdict(config)},
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return (directory or cache_root() / "distill") / f"data-{digest}.pt"


def prepare_data(target: LoadedModel, config: DataConfig, path: Path | None = None) -> tuple[list[Sequence], Path]:
    """Load the data set from `path` (default: the cache), or generate, teacher-force and save it."""
    path = path or data_path(target, config)
    if path.is_file():
        log.info("distillation data from %s", path)
        return load_sequences(path), path
    started = time.perf_counter()
    sequences = build_sequences(target, config)
    teacher_force(target, sequences)
    save_sequences(sequences, path)
    log.info("built %d sequences in %.0f s -> %s", len(sequences), time.perf_counter() - started, path)
    return sequences, path
