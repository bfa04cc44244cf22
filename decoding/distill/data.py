"""Distillation data: the target's own generations on the project's prompts, and its view of them.

1. Generate: HF `generate` on the same weights, batched (a batch of 16 decodes ~10x faster than one
   sequence on this CPU); greedy for most prompts, temperature 0.7 for some, so a draft sees both.
2. Add text the target reads: standard-library documentation and code as assistant turns (texts.py).
3. Teacher-force every sequence through the engine's own model: its final hidden state at every
   position (the features an eagle head reads at decode time, in the engine's numerics; with feature
   layers, the residual stream at those depths too, for eagle3 heads) and the top-K of
   its next-token distribution at every position (training weights prompt positions less).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from decoding.chat import render_prompt
from decoding.distill.agent_prompts import agent_prompts
from decoding.distill.prompts import DistillPrompt, stage_one, stage_two
from decoding.distill.texts import text_turns
from decoding.hf_weights import to_hf_llama
from decoding.loading import LoadedModel
from decoding.progress import progress
from decoding.tools import parse_tool_choice, parse_tools

TOP_K = 16


@dataclass(frozen=True)
class DataConfig:
    seed: int = 0
    stage_one: int = 320
    stage_two: int = 320
    max_new_tokens: int = 160
    sampled_share: float = 0.25  # share of prompts generated at temperature 0.7
    max_prompt_tokens: int = 900
    batch_size: int = 16
    text_sequences: int = 480  # standard-library text as assistant turns (teacher-forced, not generated)
    agent_prompts: int = 400  # agent-shaped prompts (agent_prompts.py), generated with stage one
    feature_layers: tuple[int, ...] = ()  # target blocks stored after the final state (for eagle3 heads)
    # prompt rounds: round r draws every prompt afresh with seed + r and is generated, teacher-forced and
    # cached on its own (cache.py), so a run with more rounds reuses the rounds made before
    rounds: int = 1

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")

    def generation_key(self) -> dict[str, int | float]:
        """The fields the (slow) generated part depends on: a cache of it outlives changes to the rest."""
        return {k: getattr(self, k) for k in ("seed", "stage_one", "stage_two", "max_new_tokens", "sampled_share",
                                              "max_prompt_tokens", "batch_size", "agent_prompts")}


@dataclass
class Sequence:
    category: str
    tokens: torch.Tensor  # (T,) int64: prompt then generation
    prompt_len: int
    features: torch.Tensor | None = None  # (T, F) bf16: the target's final hidden state per position, then
    # the residual stream after each of the data's feature_layers (F = (1 + L) D)
    top_ids: torch.Tensor | None = None  # (T, K) int32: top-K next tokens after each position 0 .. T-1
    top_probs: torch.Tensor | None = None  # (T, K) float16


def render(target: LoadedModel, prompt: DistillPrompt) -> list[int]:
    tools = parse_tools([{"type": "function", "function": t} for t in prompt.tools]) if prompt.tools else []
    choice = parse_tool_choice("auto" if tools else None, tools)
    return render_prompt(target.tokenizer, prompt.messages, tools, choice)


def generate(target: LoadedModel, prompts: list[DistillPrompt], config: DataConfig, rng: random.Random,
             desc: str) -> list[tuple[DistillPrompt, list[int], list[int]]]:
    """(prompt, prompt ids, generated ids) for each prompt, batched by prompt length."""
    hf = to_hf_llama(target.model)
    eos = sorted(target.tokenizer.eos_token_ids)
    rendered = [(p, render(target, p)) for p in prompts]
    rendered = [(p, ids) for p, ids in rendered if len(ids) <= config.max_prompt_tokens]
    sampled = {i for i in range(len(rendered)) if rng.random() < config.sampled_share}
    out: list[tuple[DistillPrompt, list[int], list[int]]] = []
    for temperature_group in (False, True):
        group = [rendered[i] for i in range(len(rendered)) if (i in sampled) == temperature_group]
        group.sort(key=lambda r: len(r[1]))
        batches = [group[i : i + config.batch_size] for i in range(0, len(group), config.batch_size)]
        for batch in progress(batches, desc=f"{desc} ({'T=0.7' if temperature_group else 'greedy'})", unit="batch"):
            width = max(len(ids) for _, ids in batch)
            inp = torch.tensor([[eos[0]] * (width - len(ids)) + ids for _, ids in batch])  # (B, W) left-padded
            att = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids in batch])
            kwargs = {"do_sample": True, "temperature": 0.7, "top_k": 0} if temperature_group else {"do_sample": False}
            torch.manual_seed(rng.randrange(2**31))
            with torch.inference_mode():
                gen = hf.generate(inp, attention_mask=att, max_new_tokens=config.max_new_tokens,
                                  eos_token_id=eos, pad_token_id=eos[0], **kwargs)
            for row, (prompt, ids) in enumerate(batch):
                new = gen[row, width:].tolist()
                for j, t in enumerate(new):
                    if t in eos:
                        new = new[: j + 1]
                        break
                out.append((prompt, ids, new))
    return out


def generated_sequences(target: LoadedModel, config: DataConfig) -> list[Sequence]:
    """Both stages of prompts, generated by the target, as token sequences (no features yet)."""
    rng = random.Random(config.seed)
    prompts = stage_one(rng, config.stage_one) + agent_prompts(rng, config.agent_prompts)
    first = generate(target, prompts, config, rng, "stage 1")
    texts = [(p, target.tokenizer.decode(new)) for p, _, new in first]
    second = generate(target, stage_two(rng, texts, config.stage_two), config, rng, "stage 2")
    return [Sequence(p.category, torch.tensor(ids + new), len(ids)) for p, ids, new in first + second if new]


def text_sequences(target: LoadedModel, config: DataConfig) -> list[Sequence]:
    """Standard-library text as the assistant's turn after a user's ask, ended like a reply."""
    tokenizer = target.tokenizer
    end = [tokenizer.turn_end_id] if tokenizer.turn_end_id is not None else []
    out = []
    for turn in text_turns(random.Random(config.seed + 1), config.text_sequences):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": turn.ask}])
        text = tokenizer.encode(turn.text)[: config.max_prompt_tokens]
        out.append(Sequence(turn.category, torch.tensor(prompt + text + end), len(prompt)))
    return out


@torch.inference_mode()
def teacher_force(target: LoadedModel, sequences: list[Sequence], feature_layers: tuple[int, ...] = ()) -> None:
    """Fill each sequence's features and top-K targets from the engine's model."""
    model = target.model
    model.setup_cache(max(len(s.tokens) for s in sequences))
    for seq in progress(sequences, desc="teacher forcing", unit="seq"):
        logits, hidden = model.forward_hidden(seq.tokens, 0, feature_layers=feature_layers)  # (T, V), (T, F)
        seq.features = hidden.to(torch.bfloat16)
        probs = torch.softmax(logits.float(), dim=-1)  # (T, V)
        top = probs.topk(min(TOP_K, probs.shape[-1]), dim=-1)
        seq.top_ids, seq.top_probs = top.indices.to(torch.int32), top.values.to(torch.float16)


def save_sequences(sequences: list[Sequence], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save([vars(s) for s in sequences], tmp)
    tmp.replace(path)


def load_sequences(path: Path) -> list[Sequence]:
    return [Sequence(**d) for d in torch.load(path, weights_only=True)]


def draft_vocabulary(sequences: list[Sequence], size: int, vocab_size: int) -> tuple[torch.Tensor, float]:
    """The `size` tokens the target emits most (by top-1 at generated positions, then by prompt
    frequency), and the share of generated tokens they cover."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    prompt_counts = torch.zeros(vocab_size, dtype=torch.float64)
    for s in sequences:
        assert s.top_ids is not None
        counts += torch.bincount(s.top_ids[s.prompt_len - 1 :, 0].long(), minlength=vocab_size).double()
        prompt_counts += torch.bincount(s.tokens, minlength=vocab_size).double()
    score = counts * 1e6 + prompt_counts  # generated top-1 first, prompt tokens break ties
    vocab = score.topk(size).indices.sort().values
    chosen = torch.zeros(vocab_size, dtype=torch.bool)
    chosen[vocab] = True
    total = float(counts.sum())
    covered = float(counts[chosen].sum())
    return vocab, covered / max(total, 1.0)
