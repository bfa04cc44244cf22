"""Prepacked CPU linear layers: the decode loop's matmuls through oneDNN with weights packed once.

A bf16 `F.linear` on one token row re-lays its weight out on every call; on the 2-core development CPU
that made a decode step of the embedded model ~3x slower than the same matmul with a weight packed once
(`torch.ops.mkldnn._reorder_linear_weight`, the kernel inductor's CPU backend uses). The numbers are
the same kernel's: packing changes memory layout, not arithmetic.

float32 passes of a few rows (a verify pass) take another kernel: see `FEW_ROWS`.
"""

from __future__ import annotations

import logging
from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

from decoding import kernels

log = logging.getLogger(__name__)

PACKABLE_DTYPES = (torch.bfloat16, torch.float32)

# oneDNN's bf16 kernel blocks a reduction longer than this differently for different numbers of rows,
# so a verify pass (k rows) would round unlike k single steps; up to it, every row is computed the
# same whatever the row count (tests/decoding/test_model.py checks both). Longer reductions are split
# into chunks of at most this length, their partial products summed in float32.
ROW_STABLE_IN_FEATURES = 768

# float32 passes of 2..FEW_ROWS rows multiply the weight from the left (W @ x^T, BLAS with the long side
# first), their rows padded to 4 or 8. oneDNN's float32 kernel streams the weight at memory speed for one
# row but not for a few: on an AVX2 machine without bf16 (2 cores), a pass of the embedded model at a
# 400-token context costs 1.44 / 1.65 / 1.82x a one-row step for 2 / 4 / 8 rows through oneDNN, and
# 1.10 / 1.17 / 1.68x this way; a 3-row matmul costs more than a 4-row one, hence the padding
# (decoding/drafts/README.md, "An AVX2 machine"). One row keeps oneDNN (the decode step), and so do
# longer passes (prompts). Neither kernel gives a row the same bits at every row count in float32
# (~1e-5 apart in the logits), as before: see Transformer.attention_dtype.
FEW_ROWS = 8


class InferenceLinear(nn.Module):
    """What an inference layer keeps of the `nn.Linear` it replaces: its shape, and its weight and bias as
    they are (state_dict; the LM head's rows a draft head reads)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias


class PackedLinear(InferenceLinear):
    """`nn.Linear` for inference, its weight kept as is (for state_dict) and packed for oneDNN."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        w = linear.weight.detach()
        chunks = -(-self.in_features // ROW_STABLE_IN_FEATURES)
        self.bounds = [(i * self.in_features // chunks, (i + 1) * self.in_features // chunks) for i in range(chunks)]
        self.packed = [torch.ops.mkldnn._reorder_linear_weight(w[:, a:b].contiguous(), 1) for a, b in self.bounds]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., in) -> (..., out); float32 out when the reduction was split
        if x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // self.in_features
        if x.dtype == torch.float32 and 1 < rows <= FEW_ROWS:
            return self._few_rows(x, rows)
        if len(self.packed) == 1:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed[0], self.bias, "none", [], "")
        out = self.bias.float() if self.bias is not None else None
        for (a, b), w in zip(self.bounds, self.packed, strict=True):
            part = torch.ops.mkldnn._linear_pointwise(x[..., a:b].contiguous(), w, None, "none", [], "").float()
            out = part if out is None else out + part
        assert out is not None
        return out

    def _few_rows(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        # x: (..., in) float32 holding `rows` rows -> (..., out), as W @ x^T on rows padded to 4 or 8
        flat = x.reshape(rows, self.in_features)  # (rows, in)
        padded = 4 if rows <= 4 else FEW_ROWS
        if padded > rows:
            flat = torch.cat([flat, flat.new_zeros(padded - rows, self.in_features)])  # (padded, in)
        out = torch.mm(self.weight, flat.t())[:, :rows].t()  # (rows, out)
        if self.bias is not None:
            out = out + self.bias
        return out.contiguous().view(*x.shape[:-1], self.out_features)


class ExactLinear(InferenceLinear):
    """`nn.Linear` for a bf16 model's inference through decoding/kernels' exact linear layers: every row the
    same bits in any pass (no split reductions needed), float32 out, bf16 or float32 in (rounded to bf16
    once, as a cast would). On the 2-core development CPU a decode step's linears run ~1.8x faster than
    through oneDNN (decoding/kernels/exact_linear.c)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        self.packed = kernels.pack_linear_weight(linear.weight)  # (groups * 32 * in,) bf16
        self.exact_bias = None if linear.bias is None else linear.bias.detach().float().contiguous()  # (out,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., in) bf16 or float32 -> (..., out) float32
        return kernels.exact_linear(x, self.packed, self.out_features, self.exact_bias)


def can_run_exact(linear: nn.Linear) -> bool:
    """Whether `linear` can run through the exact kernel here: bf16 weights, an even input width, the
    kernel built on a CPU with AVX512-BF16."""
    return linear.weight.dtype == torch.bfloat16 and linear.in_features % 2 == 0 and kernels.linear_available()


@cache
def can_pack(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs weights of `dtype` on this CPU (bf16 needs AVX-512 or AVX-NE-CONVERT)."""
    if dtype not in PACKABLE_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(4, 4, dtype=dtype), 1)
    except RuntimeError:
        return False
    return True


def pack_linears(module: nn.Module, exact: bool = False) -> int:
    """Replace every `nn.Linear` under `module` by a `PackedLinear`, or with `exact` by an `ExactLinear`
    where one runs here, in place; return how many."""
    count = 0
    for name, child in list(module.named_children()):
        if exact and isinstance(child, nn.Linear) and can_run_exact(child):
            setattr(module, name, ExactLinear(child))
            count += 1
        elif isinstance(child, nn.Linear) and can_pack(child.weight.dtype):
            try:
                setattr(module, name, PackedLinear(child))
                count += 1
            except RuntimeError as exc:  # a oneDNN build without this kernel: keep the plain layer
                log.warning("could not pack %s (%s); using plain linear layers", name, exc)
                return count
        else:
            count += pack_linears(child, exact)
    return count
