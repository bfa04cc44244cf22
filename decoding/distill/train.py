"""Train a draft head on distillation data: soft cross-entropy to the target's top-K distribution (over
the head's vocabulary) plus, for eagle heads, regression of the target's next feature, at every unrolled
step (see unroll.py). AdamW, warmup then cosine decay, a fixed seed, checkpoints it resumes from."""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from decoding.distill.data import Sequence
from decoding.distill.unroll import SHAPE_BUCKET, padded, unrolled
from decoding.draft_head import DraftHead, HeadConfig
from decoding.loading import cpu_supports_bf16
from decoding.progress import progress as progress_bar

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    design: str = "eagle"
    n_layers: int = 1
    feature_layers: tuple[int, ...] = ()  # eagle3: target blocks read besides the final state
    copy_hint: bool = False  # each pair reads prompt lookup's guess too (decoding/copy_hints.py)
    context_vocab: bool = False  # the head also scores the context's tokens outside its vocabulary
    steps: int = 3  # unrolled steps per sequence (1 for a tokens head)
    vocab_size: int = 8192  # the head's output vocabulary (most emitted target tokens)
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup: int = 40
    weight_decay: float = 0.01
    tokens_per_update: int = 4096  # sequences are accumulated up to this many tokens per optimiser step
    feature_weight: float = 0.2
    prompt_weight: float = 0.3  # loss weight of pairs inside the prompt, against 1 for the reply
    step_decay: float = 0.8  # loss weight of step u: decay ** u
    epochs: float = 8.0
    minutes: float = 60.0  # wall-time limit of the training, resumes included (the schedule assumes `epochs`)
    seed: int = 0
    bf16_autocast: bool = True  # matmuls in bf16 where the CPU has it (~1.7x faster here), weights in float32
    eval_share: float = 0.06
    checkpoint_every_s: float = 300.0


def weights_fields(config: dict[str, Any]) -> dict[str, Any]:
    """A training config's fields that the weights depend on: all but the time limit, which a resume may
    raise (the checkpoint's name and the resume check both go by these)."""
    return {k: v for k, v in config.items() if k != "minutes"}


@dataclass
class TrainState:
    update: int = 0
    total_updates: int = 0
    elapsed_s: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)
    resumed_at: int | None = None  # the update this process resumed at, if it did


def split(sequences: list[Sequence], share: float, seed: int) -> tuple[list[Sequence], list[Sequence]]:
    """(train, held out): a seeded share of sequences held out for evaluation."""
    order = list(range(len(sequences)))
    random.Random(seed).shuffle(order)
    cut = max(1, int(len(order) * share))
    held = sorted(order[:cut])
    held_set = set(held)
    return [s for i, s in enumerate(sequences) if i not in held_set], [sequences[i] for i in held]


def vocab_index(head: DraftHead) -> torch.Tensor:
    """(V,) int64: each target id's row in the head's output, -1 where the head cannot emit it."""
    index = torch.full((head.config.target_vocab_size,), -1, dtype=torch.int64)
    index[head.vocab] = torch.arange(len(head.vocab))
    return index


def context_extra(head: DraftHead, index: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor | None:
    """(n,) the sequence's token ids outside the head's vocabulary, which a `context_vocab` head scores
    as well (the drafter adds them as the context grows; a sequence gives them all at once); else None."""
    if not head.config.context_vocab:
        return None
    ids = tokens.unique()
    return ids[index[ids] < 0]


def scored_ids(head: DraftHead, extra: torch.Tensor | None) -> torch.Tensor:
    """(Vd + n,) the target id of each logit `head.scores(..., extra)` returns."""
    return head.vocab if extra is None else torch.cat([head.vocab, extra])


def head_features(head: DraftHead, seq: Sequence) -> torch.Tensor:
    """(T, F) float32: the columns of the sequence's stored features that `head` reads (data built for an
    eagle3 head holds the final state first, so an eagle head trains on the same file)."""
    assert seq.features is not None
    width = head.config.feature_width
    if seq.features.shape[-1] < width:
        raise ValueError(f"the data holds target features of width {seq.features.shape[-1]}, the head reads "
                         f"{width}: build the data with the head's feature layers")
    return seq.features[:, :width].float()


def bucketed_scores(head: DraftHead, rows: torch.Tensor, extra: torch.Tensor | None,
                    bucket: int = SHAPE_BUCKET) -> torch.Tensor:
    """`head.scores(rows, extra)` (N, Vd + n), computed on rows and extra ids padded to multiples of
    `bucket`, so the LM-head matmuls take recurring shapes (unroll.SHAPE_BUCKET); the padding is dropped."""
    n_extra = 0 if extra is None else extra.numel()
    logits = head.scores(padded(rows, bucket), padded(extra, bucket) if extra is not None and n_extra else extra)
    return logits[: rows.shape[0], : len(head.vocab) + n_extra]  # (N, Vd + n)


def sequence_loss(head: DraftHead, seq: Sequence, config: TrainConfig, index: torch.Tensor,
                  bucket: int = SHAPE_BUCKET) -> tuple[torch.Tensor, dict[str, float]]:
    """The weighted loss over steps of one sequence, and per-step top-1 agreement with the target.
    `bucket`: the matmuls run on rows padded to a multiple of it (1: unpadded; the loss is the same)."""
    assert seq.features is not None and seq.top_ids is not None and seq.top_probs is not None
    p = seq.prompt_len
    features = head_features(head, seq)  # (T, F)
    outputs = unrolled(head, seq.tokens, features if head.uses_features else None, config.steps, bucket)
    total = torch.zeros(())
    weight_sum = 0.0
    metrics: dict[str, float] = {}
    n = seq.tokens.shape[0] - 1
    # pair j predicts the target's distribution after position j+1; prompt positions count less
    weights = torch.full((n,), config.prompt_weight)  # (n,) per pair
    weights[max(p - 2, 0) :] = 1.0
    extra = context_extra(head, index, seq.tokens)  # (n_extra,) or None
    ids = scored_ids(head, extra)  # (Vd + n_extra,) id of each logit
    if extra is not None:
        index = index.clone()
        index[extra] = torch.arange(len(head.vocab), len(ids))
    for u, predicted in enumerate(outputs):
        if u >= n:
            continue
        rows = predicted[u:]  # (N, D) pairs u .. n-1 predict the target at positions u+1 .. n
        top_ids = seq.top_ids[u + 1 :].long()  # (N, K)
        top_probs = seq.top_probs[u + 1 :].float()  # (N, K)
        row_w = weights[u:] / weights[u:].sum()  # (N,)
        logq = F.log_softmax(bucketed_scores(head, rows, extra, bucket).float(), dim=-1)  # (N, Vd + n_extra)
        sub = index[top_ids]  # (N, K) rows in the head's vocabulary, -1 outside
        target = top_probs * (sub >= 0)
        target = target / target.sum(-1, keepdim=True).clamp_min(1e-6)
        ce = -((target * logq.gather(1, sub.clamp_min(0))).sum(-1) * row_w).sum()
        loss = ce
        if head.uses_features:
            final = features[u + 1 :, : head.config.dim]  # (N, D) the target's final hidden state
            feature_err = F.smooth_l1_loss(rows, final, reduction="none").mean(-1)  # (N,)
            loss = loss + config.feature_weight * (feature_err * row_w).sum()
        w = config.step_decay**u
        total = total + w * loss
        weight_sum += w
        with torch.no_grad():
            agree = (ids[logq.argmax(-1)] == top_ids[:, 0]).float()
            metrics[f"ce{u}"] = float(ce)
            metrics[f"acc{u}"] = float((agree * row_w).sum())
    return total / max(weight_sum, 1e-9), metrics


def new_head(target_args: Any, config: TrainConfig, vocab: torch.Tensor, seed: int) -> DraftHead:
    torch.manual_seed(seed)
    head_config = HeadConfig.for_target(target_args, config.design, config.n_layers, config.feature_layers,
                                        config.copy_hint, config.context_vocab)
    return DraftHead(head_config, vocab)


def _lr(config: TrainConfig, update: int, total: int) -> float:
    if update < config.warmup:
        return config.lr * (update + 1) / config.warmup
    progress = min(1.0, (update - config.warmup) / max(1, total - config.warmup))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _batches(sequences: list[Sequence], tokens_per_update: int, rng: random.Random) -> list[list[Sequence]]:
    order = list(sequences)
    rng.shuffle(order)
    batches: list[list[Sequence]] = [[]]
    size = 0
    for s in order:
        if size >= tokens_per_update:
            batches.append([])
            size = 0
        batches[-1].append(s)
        size += len(s.tokens)
    return [b for b in batches if b]


def save_checkpoint(path: Path, head: DraftHead, optimizer: torch.optim.Optimizer, state: TrainState,
                    config: TrainConfig) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"head": head.head_state(), "optimizer": optimizer.state_dict(), "state": asdict(state),
                "config": asdict(config), "rng": torch.get_rng_state()}, tmp)
    tmp.replace(path)


def train(head: DraftHead, sequences: list[Sequence], config: TrainConfig, checkpoint: Path | None = None,
          resume: bool = False, progress: bool = True, stop_after: int | None = None) -> TrainState:
    """Train `head` (attached to the target, float32) in place; returns the final state. `stop_after`
    ends this call after that many updates (the schedule is unchanged, so a resume continues it)."""
    assert head.lm_head is not None, "attach() the target first"
    head.train()
    params = [p for name, p in head.named_parameters() if not name.startswith("lm_head.")]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95))
    state = TrainState()
    if resume and checkpoint is not None and checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=False)
        if weights_fields(saved["config"]) != weights_fields(asdict(config)):
            raise ValueError(f"{checkpoint}: was written with another training config; start afresh or match it")
        head.load_state_dict(saved["head"], strict=False)
        optimizer.load_state_dict(saved["optimizer"])
        state = TrainState(**{**saved["state"], "resumed_at": saved["state"]["update"]})
        torch.set_rng_state(saved["rng"])
        log.info("resumed from %s at update %d", checkpoint, state.update)
    elif resume:
        log.warning("no checkpoint of this configuration to resume from (%s): training from the start", checkpoint)
    per_epoch = len(_batches(sequences, config.tokens_per_update, random.Random(0)))
    state.total_updates = max(1, int(per_epoch * config.epochs))
    index = vocab_index(head)
    autocast = config.bf16_autocast and cpu_supports_bf16() and head.dtype == torch.float32
    started = time.perf_counter() - state.elapsed_s
    last_save = time.perf_counter()
    budget = config.minutes * 60
    schedule: list[list[Sequence]] = []
    epoch = 0
    while len(schedule) < state.total_updates:  # the whole (seeded) schedule, so a resume continues it
        schedule += _batches(sequences, config.tokens_per_update, random.Random(config.seed * 1000 + epoch))
        epoch += 1
    bar = progress_bar(total=state.total_updates, initial=state.update, desc=f"distill {config.design}", unit="step",
               disable=not progress)
    stop = state.total_updates if stop_after is None else min(state.total_updates, state.update + stop_after)
    while state.update < stop and time.perf_counter() - started < budget:
        for group in optimizer.param_groups:
            group["lr"] = _lr(config, state.update, state.total_updates)
        optimizer.zero_grad(set_to_none=True)
        batch = schedule[state.update]
        batch_tokens = sum(len(s.tokens) for s in batch)
        merged: dict[str, float] = {}
        for seq in batch:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss, metrics = sequence_loss(head, seq, config, index)
            (loss * len(seq.tokens) / batch_tokens).backward()
            for k, v in metrics.items():
                merged[k] = merged.get(k, 0.0) + v / len(batch)
            merged["loss"] = merged.get("loss", 0.0) + float(loss.detach()) / len(batch)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        state.update += 1
        state.elapsed_s = time.perf_counter() - started
        merged["update"] = state.update
        state.history.append(merged)
        bar.update(1)
        bar.set_postfix(loss=f"{merged['loss']:.3f}", acc0=f"{merged.get('acc0', 0):.2f}")
        if checkpoint is not None and time.perf_counter() - last_save > config.checkpoint_every_s:
            save_checkpoint(checkpoint, head, optimizer, state, config)
            last_save = time.perf_counter()
    bar.close()
    if checkpoint is not None:
        save_checkpoint(checkpoint, head, optimizer, state, config)
    head.eval()
    return state
