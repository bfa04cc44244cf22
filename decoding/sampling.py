"""Sampling parameters and the *processed* next-token distribution.

Target-only sampling and speculative verification both call `processed_probs`, so temperature, top-k,
top-p and any allowed-token mask shape p (and the draft's q) identically: the precondition for
rejection sampling to reproduce target-only sampling exactly. Order as in HF transformers: mask,
temperature, top-k, top-p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoding.errors import InvalidRequestError

# what torch.Generator.manual_seed takes: a signed or an unsigned 64-bit integer
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1

# top-p ranks this many likeliest tokens first, sorting the whole vocabulary only when they fall short
TOP_P_CANDIDATES = 1024


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0  # 1 means off; 0 (OpenAI's range includes it) keeps the likeliest token alone
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 <= self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in [0, 1], got {self.top_p}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise InvalidRequestError(f"seed must be in [{SEED_MIN}, {SEED_MAX}], got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self) -> torch.Generator:
        g = torch.Generator()
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g


def processed_probs(
    # [T, V] raw logits
    logits: torch.Tensor,
    params: SamplingParams,
    # [T, V] bool, True where a token is allowed; None for no constraint
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """The distribution that sampling draws from, [T, V], each row summing to 1."""
    x = logits
    if allowed is not None:
        x = x.masked_fill(~allowed, float("-inf"))
    if params.greedy:
        # the processed distribution of greedy decoding is one-hot at the argmax
        return torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).to(x.dtype)
    # shift the maximum to 0 and keep it there while scaling: a temperature too small for float32 (1e-38,
    # 1e-300) then sends the others to -inf instead of making 0 / 0 or inf - inf = nan in the softmax
    top = x.max(dim=-1, keepdim=True).values  # [T, 1]
    shifted = x - top  # [T, V] <= 0 (nan only in a row with nothing allowed, as before)
    x = torch.where(x == top, shifted, shifted / params.temperature)
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]  # [T, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    return probs


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    # probs: [T, V] -> [T, V] the most likely tokens whose mass reaches top_p, renormalised: a token is kept
    # when the tokens *strictly* more likely than it hold less than top_p. Tokens tied with it count alike,
    # kept or dropped together, so the set never depends on how a sort orders ties: a row gets the same
    # nucleus alone (a step) as beside other rows (a verify pass, which may sort where a step ranks)
    vocab = probs.shape[-1]
    # the nucleus is almost always a few tokens: rank the likeliest TOP_P_CANDIDATES (a partial sort,
    # ~50x cheaper than sorting a 49k vocabulary) and sort everything only if their last tie group is
    # not dropped (then a token past them, tied with it, could be kept)
    sorted_p, order = probs.topk(min(TOP_P_CANDIDATES, vocab), dim=-1)  # [T, K] descending
    strictly_more = _mass_strictly_more(sorted_p)  # [T, K]
    if sorted_p.shape[-1] < vocab and not bool((strictly_more[..., -1] >= top_p).all()):
        sorted_p, order = probs.sort(dim=-1, descending=True)  # [T, V]
        strictly_more = _mass_strictly_more(sorted_p)
    # the likeliest tokens (nothing more likely) always stay: a top_p of 0 keeps them alone
    drop = (strictly_more >= top_p) & (strictly_more > 0)
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_p)  # tokens past the candidates: dropped
    return kept / kept.sum(-1, keepdim=True)


def _mass_strictly_more(sorted_p: torch.Tensor) -> torch.Tensor:
    # sorted_p: [T, K] descending -> [T, K] the mass of the tokens before each one's tie group: its value
    # of the exclusive cumulative sum at the group's first position (the sums before a group add the same
    # values in the same order, however the ties within groups were ordered)
    before = sorted_p.cumsum(-1) - sorted_p  # [T, K] exclusive (a group's first position is exact)
    starts = torch.ones_like(sorted_p, dtype=torch.bool)  # [T, K]
    starts[..., 1:] = sorted_p[..., 1:] != sorted_p[..., :-1]
    index = torch.arange(sorted_p.shape[-1]).expand_as(sorted_p)  # [T, K]
    first = torch.where(starts, index, 0).cummax(-1).values  # [T, K] the group's first position
    return before.gather(-1, first)


def sample(
    # [V] non-negative weights, any positive total (processed probabilities, a residual)
    probs: torch.Tensor,
    generator: torch.Generator,
) -> int:
    """One draw, by inverting the cumulative distribution in float64 at a uniform draw: what
    `torch.multinomial` does for one sample, at a tenth of its cost over a 49k vocabulary (~1.2 ms on
    the 2-core CPU, most of a sampled token's overhead)."""
    cdf = probs.to(torch.float64).cumsum(0)  # [V] non-decreasing
    total = float(cdf[-1])
    if not total > 0 or total == float("inf"):
        raise ValueError(f"cannot sample from weights summing to {total}")
    u = torch.rand((), generator=generator, dtype=torch.float64) * total
    # the first token whose cumulative weight passes u: a zero-weight token never is
    i = int(torch.searchsorted(cdf, u, right=True))
    if i == cdf.numel():  # u rounded up to the total: the last token with weight
        i = int((probs > 0).nonzero()[-1])
    return i


def next_token(
    # [V] raw logits of one position
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    allowed: torch.Tensor | None = None,
) -> int:
    """Target-only decoding of one token: argmax when greedy, else a sample of the processed distribution."""
    if params.greedy:
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        return int(logits.argmax().item())
    mask = None if allowed is None else allowed.unsqueeze(0)
    return sample(processed_probs(logits.unsqueeze(0), params, mask)[0], generator)
