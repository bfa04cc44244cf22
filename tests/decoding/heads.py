"""Draft heads on tiny targets: distillation data from the target's own greedy generations, and a head
trained on it for a few dozen updates (enough to get drafts accepted)."""

from __future__ import annotations

import random

import torch

from decoding.distill.data import Sequence, teacher_force
from decoding.distill.train import TrainConfig, new_head, train
from decoding.draft_head import DraftHead
from decoding.generate import Engine, GenerationConfig
from decoding.loading import LoadedModel
from decoding.stats import SpecStats


def taps_for(target: LoadedModel, design: str) -> tuple[int, ...]:
    """The target blocks a head of `design` reads besides the final state (block 0 for eagle3: the
    tiny targets have two)."""
    return (0,) if design == "eagle3" else ()


def config_for(target: LoadedModel, design: str, **fields: object) -> TrainConfig:
    """A training config for `design`: "eagle", "eagle3", "tokens", or "eagle+copy" (an eagle head that
    reads copy hints and scores the context's tokens outside its vocabulary)."""
    name, _, variant = design.partition("+")
    copy = variant == "copy"
    return TrainConfig(design=name, feature_layers=taps_for(target, name), copy_hint=copy,
                       context_vocab=copy, **fields)  # type: ignore[arg-type]


def tiny_sequences(target: LoadedModel, count: int, seed: int = 0, new_tokens: int = 24,
                   feature_layers: tuple[int, ...] = (0,)) -> list[Sequence]:
    """Random (partly repetitive) prompts and the target's greedy continuations, teacher-forced (features:
    the final state, then block 0's residual stream, so one data set serves every design)."""
    rng = random.Random(seed)
    vocab = target.model.args.vocab_size
    engine = Engine(target)
    sequences = []
    for _ in range(count):
        motif = [rng.randrange(2, vocab) for _ in range(rng.randint(2, 5))]
        prompt = [0] + [rng.randrange(2, vocab) for _ in range(rng.randint(1, 6))] + motif * rng.randint(1, 3)
        config = GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True, speculative=False)
        out = [t for step in engine.decode_tokens(prompt, config, SpecStats()) for t in step]
        sequences.append(Sequence("chat", torch.tensor(prompt + out), len(prompt)))
    teacher_force(target, sequences, feature_layers)
    return sequences


def head_for(target: LoadedModel, design: str, vocab: torch.Tensor | None = None, seed: int = 0) -> DraftHead:
    """An untrained head attached to the target, in the target's dtype (float32 at least)."""
    config = config_for(target, design)
    ids = vocab if vocab is not None else torch.arange(target.model.args.vocab_size)
    head = new_head(target.model.args, config, ids, seed)
    dtype = torch.float64 if target.model.dtype == torch.float64 else torch.float32
    head.to(dtype)
    model = target.model
    head.attach(model.tok_embeddings.weight.detach().to(dtype), model.output.weight.detach().to(dtype))
    return head


def trained_head(target: LoadedModel, design: str, updates: int = 40, steps: int = 2,
                 vocab: torch.Tensor | None = None) -> DraftHead:
    sequences = tiny_sequences(target, 24)
    head = head_for(target, design, vocab)
    config = config_for(target, design, steps=steps if design != "tokens" else 1, tokens_per_update=256,
                        epochs=updates * 256 / sum(len(s.tokens) for s in sequences), warmup=5, lr=3e-3)
    train(head, sequences, config, progress=False)
    return head.eval().requires_grad_(False)
