"""`draftgate distill`: data (cached) -> vocabulary -> train -> evaluate -> a draft head file with its card."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from decoding.distill.cache import prepare_data
from decoding.distill.data import DataConfig, draft_vocabulary
from decoding.distill.evaluate import evaluate, step_cost
from decoding.distill.train import TrainConfig, new_head, split, train, weights_fields
from decoding.draft_head import DraftHead, save_head
from decoding.loading import LoadedModel
from decoding.tokenizer import cache_root

log = logging.getLogger(__name__)


def checkpoint_path(target: LoadedModel, data: DataConfig, config: TrainConfig) -> Path:
    key = json.dumps({"target": target.name, "data": asdict(data), "train": weights_fields(asdict(config))},
                     sort_keys=True)
    return cache_root() / "distill" / f"{config.design}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.ckpt"


def attach_target(head: DraftHead, target: LoadedModel, dtype: torch.dtype) -> DraftHead:
    """Share the target's embeddings and LM head (cast to `dtype`, the head's training or decode dtype)."""
    model = target.model
    head.attach(model.tok_embeddings.weight.detach().to(dtype), model.output.weight.detach().to(dtype))
    return head


def distill(target: LoadedModel, out: Path, data: DataConfig, config: TrainConfig, resume: bool = False,
            data_file: Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Train a draft head for `target` and write it to `out`; returns the model card written with it."""
    started = time.perf_counter()
    sequences, data_files = prepare_data(target, data, data_file)
    train_set, held_out = split(sequences, config.eval_share, config.seed)
    vocab, coverage = draft_vocabulary(train_set, config.vocab_size, target.model.args.vocab_size)
    head = attach_target(new_head(target.model.args, config, vocab, config.seed), target, torch.float32)
    state = train(head, train_set, config, checkpoint_path(target, data, config), resume, progress)
    quality = evaluate(head, held_out)
    decode_head = attach_target(head, target, target.model.dtype).prepare_inference(target.model.dtype)
    cost = step_cost(decode_head, target.model)
    generated = sum(len(s.tokens) - s.prompt_len for s in train_set)
    card: dict[str, Any] = {
        "target": target.name,
        "design": config.design,
        "layers": config.n_layers,
        "parameters": sum(v.numel() for k, v in head.head_state().items() if k != "vocab"),
        "vocabulary": {"size": len(vocab), "coverage_of_generated_tokens": round(coverage, 4)},
        "data": {**asdict(data), "sequences": len(sequences), "train_sequences": len(train_set),
                 "held_out_sequences": len(held_out), "train_generated_tokens": generated,
                 "categories": sorted({s.category for s in sequences}), "files": [f.name for f in data_files]},
        "training": {**asdict(config), "updates": state.update, "planned_updates": state.total_updates,
                     "train_wall_s": round(state.elapsed_s, 1), "resumed_at_update": state.resumed_at,
                     "final": state.history[-1] if state.history else {}},
        "held_out": quality,
        "cost": cost,
        "total_wall_s": round(time.perf_counter() - started, 1),
    }
    save_head(decode_head, out, target.tokenizer.fingerprint(), card)
    return card
