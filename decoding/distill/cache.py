"""The distillation data set, built once per (target, data config) and kept in the draftgate cache.

Two files per prompt round: the target's generations (tokens only; slow to make, ~30 min a round) keyed
by the fields they depend on, and the full teacher-forced set (features, top-K) keyed by everything, so
changing the text share or the data format re-runs only the fast part. Rounds are cached one by one: a
data set of two rounds reuses the files of its first."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, replace
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


def round_configs(config: DataConfig) -> list[DataConfig]:
    """One config per prompt round: round r draws its prompts with seed + r; the standard-library text
    (not generated, so no fresher for another draw) comes once, with round 0."""
    return [replace(config, seed=config.seed + r, rounds=1, text_sequences=config.text_sequences if r == 0 else 0)
            for r in range(config.rounds)]


def data_path(target: LoadedModel, config: DataConfig, directory: Path | None = None) -> Path:
    """The teacher-forced file of a one-round config (a round of a larger one: `round_configs`)."""
    assert config.rounds == 1, "each round has its own file"
    fields = {k: v for k, v in asdict(config).items() if k != "rounds"}  # one-round files predate the field
    digest = _digest(target, {**fields, "format": DATA_FORMAT})
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


def prepare_data(target: LoadedModel, config: DataConfig, path: Path | None = None,
                 ) -> tuple[list[Sequence], list[Path]]:
    """The data set and the files it came from: from `path` if it exists, else each round from the cache
    (generated, teacher-forced and saved where missing); with `path`, the whole set is saved there too."""
    if path is not None and path.is_file():
        log.info("distillation data from %s", path)
        return load_sequences(path), [path]
    sequences: list[Sequence] = []
    files = []
    for round_config in round_configs(config):
        part, file = _prepare_round(target, round_config, path if config.rounds == 1 else None)
        sequences += part
        files.append(file)
    if path is not None and config.rounds > 1:
        save_sequences(sequences, path)
        files = [path]
    return sequences, files


def _prepare_round(target: LoadedModel, config: DataConfig, path: Path | None) -> tuple[list[Sequence], Path]:
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
