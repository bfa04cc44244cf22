"""A draft head: a small decoder that drafts for one target, sharing its embeddings and LM head.

Two designs, one module (`draftgate distill` trains either; the model card says which won):
- "eagle" (after EAGLE, Li et al. 2024): each position reads the target's final hidden state f_i and
  the embedding of the token that followed, x_{i+1}, and predicts f_{i+1} and so the token after.
  Beyond the last verified position it reads its own predicted features.
- "eagle3" (after EAGLE-3, Li et al. 2025): as "eagle", but the verified positions read several depths
  of the target at once, its final hidden state and the residual stream after `feature_layers`, fused
  by one linear layer to a D-wide feature; drafted positions read the head's own previous output.
- "tokens": an independent small causal LM that reads token embeddings only.

Either way the draft computes logits over a fixed subset of the vocabulary (the tokens the target
emits most), so its LM head is a few MB instead of the target's 28 M multiply-adds per row; the q it
samples from is zero elsewhere, which rejection sampling handles like any other q. Only the head's own
weights are stored; the embeddings and LM-head rows come from the target at load time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from decoding.copy_hints import MAX_N
from decoding.errors import ModelLoadError, TokenizerMismatchError
from decoding.model import Block, KVCache, ModelArgs, RMSNorm, rope_tables, take_exact_linears
from decoding.packing import pack_linears

DESIGNS = ("eagle", "eagle3", "tokens")
FORMAT = "draftgate-draft-head/1"


@dataclass(frozen=True)
class HeadConfig:
    design: str
    target_vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    max_seq_len: int = 8192
    feature_layers: tuple[int, ...] = ()  # eagle3: target blocks whose residual stream it reads too
    # each pair also reads a copy hint (decoding/copy_hints.py): prompt lookup's guess for the token it
    # predicts, and the length of that match
    copy_hint: bool = False
    # besides its fixed vocabulary the head scores the tokens of the request's own context (trained so):
    # what an agent copies is often a name or number the fixed vocabulary lacks
    context_vocab: bool = False

    def __post_init__(self) -> None:
        if self.design not in DESIGNS:
            raise ModelLoadError(f"unknown draft head design {self.design!r} (known: {', '.join(DESIGNS)})")
        object.__setattr__(self, "feature_layers", tuple(sorted(self.feature_layers)))  # JSON gives a list
        if (self.design == "eagle3") != bool(self.feature_layers):
            raise ModelLoadError(f"a {self.design} head {'needs' if self.design == 'eagle3' else 'takes no'} "
                                 "feature layers")
        if self.copy_hint and self.design == "tokens":
            raise ModelLoadError("copy hints are for heads that read the target's features (eagle, eagle3)")

    @property
    def feature_width(self) -> int:
        """Width of the target features a verified position reads: D, or (1 + layers) D for eagle3."""
        return self.dim * (1 + len(self.feature_layers))

    @property
    def block_args(self) -> ModelArgs:
        return ModelArgs(
            vocab_size=self.target_vocab_size, dim=self.dim, n_layers=self.n_layers, n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads, intermediate_size=self.intermediate_size, norm_eps=self.norm_eps,
            rope_base=self.rope_base, max_seq_len=self.max_seq_len,
        )

    @classmethod
    def for_target(cls, target: ModelArgs, design: str, n_layers: int = 1,
                   feature_layers: tuple[int, ...] = (), copy_hint: bool = False,
                   context_vocab: bool = False) -> HeadConfig:
        """Layers shaped like the target's, so its features need no projection."""
        return cls(
            design=design, target_vocab_size=target.vocab_size, dim=target.dim, n_layers=n_layers,
            n_heads=target.n_heads, n_kv_heads=target.n_kv_heads, intermediate_size=target.intermediate_size,
            norm_eps=target.norm_eps, rope_base=target.rope_base, max_seq_len=target.max_seq_len,
            feature_layers=feature_layers, copy_hint=copy_hint, context_vocab=context_vocab,
        )


def default_feature_layers(target_layers: int) -> tuple[int, ...]:
    """A low and a middle block of the target (EAGLE-3 reads low, middle and high; high is the final state)."""
    return tuple(sorted({min(2, target_layers - 1), target_layers // 2}))


class DraftHead(nn.Module):
    """fc(token embedding [, feature [, copy hint]]) -> decoder blocks -> norm -> predicted feature -> subset
    logits."""

    vocab: torch.Tensor
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, config: HeadConfig, vocab: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        fc_in = config.dim if config.design == "tokens" else (3 if config.copy_hint else 2) * config.dim
        self.fc = nn.Linear(fc_in, config.dim, bias=False)
        # eagle3: the target's features at several depths (T, (1 + L) D) -> one feature (T, D)
        self.fuse = nn.Linear(config.feature_width, config.dim, bias=False) if config.feature_layers else None
        # a copy hint is the guessed token's embedding plus one of these, by the length of its match (0: none)
        self.hint_length = nn.Parameter(torch.zeros(MAX_N + 1, config.dim)) if config.copy_hint else None
        self.layers = nn.ModuleList(Block(config.block_args) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.register_buffer("vocab", vocab.to(torch.int64).clone())  # (Vd,) target ids the draft can emit
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        # shared with the target at attach(): not parameters of the head, never saved
        self.embeddings: torch.Tensor = torch.empty(0)  # (V, D)
        self.lm_head: nn.Module | None = None  # D -> Vd
        self.lm_rows: torch.Tensor = torch.empty(0)  # (V, D) the target's whole LM head, for context tokens
        self.max_seq_len = 0
        # changes with every step and every new cache: a drafter can tell the cache is as it left it
        self.cache_version = 0

    @property
    def uses_features(self) -> bool:
        return self.config.design != "tokens"

    def read_features(self, features: torch.Tensor) -> torch.Tensor:
        """(T, D) features for the fc: the target's several depths fused (eagle3), or as given (the
        target's final state, or the head's own prediction at drafted positions)."""
        if self.fuse is not None and features.shape[-1] == self.config.feature_width:
            return self.fuse(features).to(features.dtype)  # a packed bf16 fuse with a split reduction gives float32
        return features

    @property
    def blocks(self) -> list[Block]:
        return [layer for layer in self.layers if isinstance(layer, Block)]

    def head_state(self) -> dict[str, torch.Tensor]:
        """The head's own weights (what a draft file holds)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("lm_head.")}

    def attach(self, target_embeddings: torch.Tensor, target_lm_head: torch.Tensor) -> None:
        """Share the target's embeddings (V, D) and take the rows of its LM head (V, D) for `vocab`."""
        if target_embeddings.shape[0] != self.config.target_vocab_size:
            raise ModelLoadError(
                f"draft head built for a vocabulary of {self.config.target_vocab_size}, "
                f"target has {target_embeddings.shape[0]}"
            )
        if target_embeddings.shape[1] != self.config.dim:
            raise ModelLoadError(f"draft head width {self.config.dim} != target width {target_embeddings.shape[1]}")
        self.embeddings = target_embeddings
        self.lm_rows = target_lm_head
        head = nn.Linear(self.config.dim, len(self.vocab), bias=False)
        head.weight = nn.Parameter(target_lm_head[self.vocab].detach().clone(), requires_grad=False)
        self.lm_head = head

    def prepare_inference(self, dtype: torch.dtype) -> DraftHead:
        """Cast for decoding and pack the linear layers as the target's: through the exact kernel where it
        runs (the default engine 198 -> 207 tok/s decoding side by side, decoding/drafts/README.md), each
        layer one kernel call that attends through the exact attention kernel too (a head step 0.35 ->
        0.24 ms); else oneDNN's, attending through torch."""
        self.to(dtype).eval().requires_grad_(False)
        if dtype == torch.bfloat16:
            take_exact_linears(self, self.blocks)
        pack_linears(self)
        return self

    @property
    def one_call(self) -> bool:
        """Whether each layer runs as one exact kernel call (its cache then in the kernel's layout)."""
        return bool(self.blocks) and all(block.exact_weights is not None for block in self.blocks)

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def setup_cache(self, max_seq_len: int) -> None:
        max_seq_len = min(max_seq_len, self.config.max_seq_len)
        if max_seq_len <= self.max_seq_len:
            return
        grown = self.max_seq_len > 0  # a bigger cache keeps what the smaller held: a drafter may read it
        self.max_seq_len = max_seq_len
        if not grown:
            self.cache_version += 1
        c = self.config
        kernel = self.one_call
        for block in self.blocks:
            before = block.attention.kv_cache
            cache = KVCache(c.n_kv_heads, max_seq_len, c.dim // c.n_heads, torch.float32, transposed_keys=kernel)
            if grown and before is not None:
                cache.keep(before)
            block.attention.kv_cache = cache
            block.attention.exact_kernel = kernel
        cos, sin = rope_tables(c.block_args, torch.float32)
        self.rope_cos, self.rope_sin = cos[:max_seq_len], sin[:max_seq_len]

    def inputs(self, tokens: torch.Tensor, features: torch.Tensor | None,
               hints: torch.Tensor | None = None) -> torch.Tensor:
        # tokens: (T,) the token after each position; features: (T, D) or (T, feature_width);
        # hints: (T, 2) each position's copy hint (guessed token, match length) for copy_hint heads -> (T, D)
        emb = self.embeddings[tokens].to(self.dtype)
        if self.uses_features:
            assert features is not None, "an eagle head needs the target's features"
            parts = [emb, self.read_features(features.to(self.dtype))]
            if self.hint_length is not None:
                assert hints is not None, "this head reads copy hints"
                guess, length = hints[:, 0], hints[:, 1]  # (T,), (T,)
                found = (length > 0).unsqueeze(-1).to(self.dtype)  # (T, 1)
                parts.append(self.embeddings[guess].to(self.dtype) * found + self.hint_length[length].to(self.dtype))
            emb = torch.cat(parts, dim=-1)  # (T, 2D) or (T, 3D)
        return self.fc(emb)

    @torch.inference_mode()
    def step(
        self, tokens: torch.Tensor, features: torch.Tensor | None, start: int,
        positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
        hints: torch.Tensor | None = None, extra: torch.Tensor | None = None, last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions [start, start + T) through the cache -> (predicted features (T, D) float32, subset
        logits (T, Vd) float32) for the token after the next. A draft tree gives its rows' `positions`
        (T,) and which cache slots each reads, `mask` (T, start + T); they are written at slots
        [start, start + T) all the same. `hints` (T, 2): each row's copy hint (heads with `copy_hint`).
        `extra` (n,): target ids outside the head's vocabulary to
        score as well, after it: logits (T, Vd + n) (see `scores`). `last_only`: the last row's
        feature and logits only, (1, D) and (1, Vd + n): a request's prompt needs no more (scoring
        2,300 rows took ~40 ms)."""
        assert self.lm_head is not None, "attach() the target first"
        self.cache_version += 1
        t = tokens.shape[0]
        end = start + t
        if end > self.max_seq_len:
            raise ValueError(f"sequence of {end} positions exceeds the draft cache of {self.max_seq_len}")
        cos, sin = self.rope_cos[start:end], self.rope_sin[start:end]
        if positions is not None:
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # (T, hd)
        if mask is None and t > 1 and start > 0:  # from position 0 the attention's own causal path serves
            mask = torch.arange(end).unsqueeze(0) <= torch.arange(start, end).unsqueeze(1)  # (T, end)
        x = self.inputs(tokens, features, hints).unsqueeze(0).float()  # (1, T, D) residual stream
        for block in self.blocks:
            x = block(x, cos, sin, start, mask)
        predicted = self.norm(x, out_dtype=torch.float32)[0]  # (T, D)
        if last_only:
            predicted = predicted[-1:]  # (1, D)
        return predicted, self.scores(predicted, extra).float()

    def scores(self, predicted: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (T, Vd) of predicted features (T, D) over the head's vocabulary, followed by those of
        the `extra` target ids (n,), from the same LM head: (T, Vd + n)."""
        assert self.lm_head is not None, "attach() the target first"
        h = predicted.to(self.dtype)
        logits = self.lm_head(h)  # (T, Vd)
        if extra is None or extra.numel() == 0:
            return logits
        rows = self.lm_rows[extra].to(self.dtype)  # (n, D)
        return torch.cat([logits, (h @ rows.T).to(logits.dtype)], dim=-1)  # (T, Vd + n)


def save_head(head: DraftHead, path: Path, target_fingerprint: str, card: dict[str, Any]) -> None:
    """Write the head's own weights in bf16 with its config, vocabulary and target in the metadata."""
    from safetensors.torch import save_file

    state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
             for k, v in head.head_state().items()}
    metadata = {
        "format": FORMAT,
        "config": json.dumps(asdict(head.config)),
        "target_tokenizer": target_fingerprint,
        "card": json.dumps(card),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata=metadata)


def is_head_file(path: str | Path) -> bool:
    return str(path).endswith(".safetensors") and Path(path).is_file() and read_metadata(Path(path)) is not None


def read_metadata(path: Path) -> dict[str, str] | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception:  # not a safetensors file at all
        return None
    return meta if meta.get("format") == FORMAT else None


def load_head(path: Path, target_embeddings: torch.Tensor, target_lm_head: torch.Tensor,
              target_fingerprint: str) -> DraftHead:
    """Load a draft head for a target; a head trained for another tokenizer is refused by name."""
    from safetensors.torch import load_file

    meta = read_metadata(path)
    if meta is None:
        raise ModelLoadError(f"{path}: not a draftgate draft head (no '{FORMAT}' metadata)")
    if meta.get("target_tokenizer") != target_fingerprint:
        raise TokenizerMismatchError(
            f"{path}: this draft head was trained for a target with another tokenizer; "
            "speculative decoding needs a draft with the target's vocabulary"
        )
    config = HeadConfig(**json.loads(meta["config"]))
    state = load_file(str(path))
    head = DraftHead(config, state["vocab"])
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"{path}: weights do not fit the head: missing {missing[:3]}, unexpected {unexpected[:3]}")
    head.attach(target_embeddings, target_lm_head)
    return head


def card_of(path: Path) -> dict[str, Any]:
    meta = read_metadata(path) or {}
    card: dict[str, Any] = json.loads(meta.get("card", "{}"))
    return card
