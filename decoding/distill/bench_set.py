"""Offline acceptance on the bench workload: the bench prompts with the target's own greedy outputs,
teacher-forced, so a draft head's chains can be scored without timing anything (`draftgate distill
--evaluate`). A diagnostic only: training never reads these sequences (the bench stays held out).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import torch

from decoding.bench.workload import load_workload
from decoding.distill.data import Sequence, load_sequences, save_sequences, teacher_force
from decoding.distill.evaluate import evaluate
from decoding.distill.run import attach_target
from decoding.draft_head import load_head
from decoding.drafters import NgramDrafter
from decoding.generate import Engine, GenerationConfig
from decoding.loading import LoadedModel
from decoding.progress import progress
from decoding.sampling import SamplingParams
from decoding.tokenizer import cache_root

log = logging.getLogger(__name__)


def bench_sequences(target: LoadedModel, max_new_tokens: int = 128) -> list[Sequence]:
    """Every bench prompt and the target's greedy output (as `draftgate bench` makes it), teacher-forced;
    cached. Generated with n-gram speculation, which gives target-only's tokens faster."""
    key = f"{target.name}/{target.tokenizer.fingerprint()}/{target.model.dtype}/{max_new_tokens}"
    path = cache_root() / "distill" / f"bench-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
    if path.is_file():
        return load_sequences(path)
    engine = Engine(target, NgramDrafter())
    config = GenerationConfig(max_new_tokens=max_new_tokens, sampling=SamplingParams(temperature=0.0))
    sequences = []
    for prompt in progress(load_workload(), desc="bench outputs", unit="prompt"):
        ids = target.tokenizer.apply_chat_template(prompt.messages)
        out = engine.complete(ids, config).token_ids
        sequences.append(Sequence(prompt.category, torch.tensor(ids + out), len(ids)))
    teacher_force(target, sequences)
    save_sequences(sequences, path)
    log.info("bench sequences -> %s", path)
    return sequences


def evaluate_on_bench(target: LoadedModel, head_path: Path, sequences: list[Sequence]) -> dict[str, Any]:
    """Greedy chain acceptance of a draft head file on the bench sequences, overall and per category."""
    model = target.model
    head = load_head(head_path, model.tok_embeddings.weight.detach(), model.output.weight.detach(),
                     target.tokenizer.fingerprint())
    return evaluate(attach_target(head.float(), target, torch.float32), sequences)
