"""Prepacked CPU linear layers: the decode loop's matmuls through oneDNN with weights packed once.

A bf16 `F.linear` on one token row re-lays its weight out on every call; on the 2-core development CPU
that made a decode step of the embedded model ~3x slower than the same matmul with a weight packed once
(`torch.ops.mkldnn._reorder_linear_weight`, the kernel inductor's CPU backend uses). The numbers are
the same kernel's: packing changes memory layout, not arithmetic.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

PACKABLE_DTYPES = (torch.bfloat16, torch.float32)

# oneDNN's bf16 kernel blocks a reduction longer than this differently for different numbers of rows,
# so a verify pass (k rows) would round unlike k single steps; up to it, every row is computed the
# same whatever the row count (tests/decoding/test_model.py checks both). Longer reductions are split
# into chunks of at most this length, their partial products summed in float32.
ROW_STABLE_IN_FEATURES = 768


class PackedLinear(nn.Module):
    """`nn.Linear` for inference, its weight kept as is (for state_dict) and packed for oneDNN."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        w = linear.weight.detach()
        chunks = -(-self.in_features // ROW_STABLE_IN_FEATURES)
        self.bounds = [(i * self.in_features // chunks, (i + 1) * self.in_features // chunks) for i in range(chunks)]
        self.packed = [torch.ops.mkldnn._reorder_linear_weight(w[:, a:b].contiguous(), 1) for a, b in self.bounds]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., in) -> (..., out); float32 out when the reduction was split
        if x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        if len(self.packed) == 1:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed[0], self.bias, "none", [], "")
        out = self.bias.float() if self.bias is not None else None
        for (a, b), w in zip(self.bounds, self.packed, strict=True):
            part = torch.ops.mkldnn._linear_pointwise(x[..., a:b].contiguous(), w, None, "none", [], "").float()
            out = part if out is None else out + part
        assert out is not None
        return out


def can_pack(dtype: torch.dtype) -> bool:
    return dtype in PACKABLE_DTYPES and torch.backends.mkldnn.is_available()


def pack_linears(module: nn.Module) -> int:
    """Replace every `nn.Linear` under `module` by a `PackedLinear`, in place; return how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and can_pack(child.weight.dtype):
            try:
                setattr(module, name, PackedLinear(child))
                count += 1
            except RuntimeError as exc:  # a oneDNN build without this kernel: keep the plain layer
                log.warning("could not pack %s (%s); using plain linear layers", name, exc)
                return count
        else:
            count += pack_linears(child)
    return count
