"""The distillation data set, built once per (target, data config) and kept in the draftgate cache.

Two files: the target's generations (tokens only; slow to make, ~20 min) keyed by the fields they depend
on, and the full teacher-forced set (features, top-K) keyed by everything, so changing the text share or
the data format re-runs only the fast part."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from decoding.distill.data import (
    DataConfig,
    Sequence,
    generated_sequences,
    load_sequences,
    save_sequences,
    teacher_force,
    text_sequences,
)
from decoding.loading import LoadedModel
from decoding.tokenizer import cache_root

log = logging.getLogger(__name__)

DATA_FORMAT = 2  # 2: top-K at every position, standard-library text


def _digest(target: LoadedModel, fields: dict[str, Any]) -> str:
    key = json.dumps({"target": target.name, "tokenizer": target.tokenizer.fingerprint(), **fields}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def data_path(target: LoadedModel, config: DataConfig, directory: Path | None = None) -> Path:
    digest = _digest(target, {**asdict(config), "format": DATA_FORMAT})
    return (directory or cache_root() / "distill") / f"data-{digest}.pt"


def generations_path(target: LoadedModel, config: DataConfig, directory: Path | None = None) -> Path:
    return (directory or cache_root() / "distill") / f"generations-{_digest(target, config.generation_key())}.pt"


def cached_generations(target: LoadedModel, config: DataConfig) -> list[Sequence]:
    path = generations_path(target, config)
    if path.is_file():
        log.info("generations from %s", path)
        return [Sequence(**d) for d in torch.load(path, weights_only=True)]
    sequences = generated_sequences(target, config)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save([{"category": s.category, "tokens": s.tokens, "prompt_len": s.prompt_len} for s in sequences], path)
    return sequences


def prepare_data(target: LoadedModel, config: DataConfig, path: Path | None = None) -> tuple[list[Sequence], Path]:
    """Load the data set from `path` (default: the cache), or generate, teacher-force and save it."""
    path = path or data_path(target, config)
    if path.is_file():
        log.info("distillation data from %s", path)
        return load_sequences(path), path
    started = time.perf_counter()
    sequences = cached_generations(target, config) + text_sequences(target, config)
    teacher_force(target, sequences, config.feature_layers)
    save_sequences(sequences, path)
    log.info("built %d sequences in %.0f s -> %s", len(sequences), time.perf_counter() - started, path)
    return sequences, path
