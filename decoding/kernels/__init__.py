"""Exact kernels for a bf16 model's passes, built once per machine: float32 attention
(exact_attention.c), and on CPUs with AVX512-BF16 the linear layers, the RMSNorm before them and the
SwiGLU product between them (exact_linear.c, exact_norm.c, exact_silu.c), a whole decoder layer in one
call (exact_layer.c). Each computes every row by one fixed sequence of float operations whatever the
pass; the attention is described here, the others in their sources.

Speculation is exact only if a verify pass gives every row the bits of the single step it stands for.
torch's float32 attention kernel blocks its work by the pass's shape, so rows differ in their last bits
(a greedy near-tie can flip); that is why a bf16 model attended in float64, where such differences never
survive the cast back. This kernel instead computes each row by one fixed sequence of float32
operations, whatever the pass: exact by construction, and its attention 2-5x faster than float64's here
(a 9-row pass at a 1,800-token context of the embedded model: 29 -> 5.5 ms of attention, 39 -> 22 ms for
the whole pass; decoding/drafts/README.md). Prompts read through it too (`causal`): a prompt read in one
pass or in several then gives the same bits, the condition for reusing a cached prefix exactly.

Its vector lanes run over keys (scores) and head dimensions (values), not query rows: a decode step has
only 3 rows per kv head here, and lanes over rows left 13 of 16 idle. Same bits as that first layout, and
a step's attention at a 2,400-token context 6.8 -> 1.7 ms (decoding/drafts/README.md).

It is C, compiled with the machine's compiler (`$CC`, else `cc`) when a bf16 model first sets up its
cache (at load) into `$DRAFTGATE_CACHE/kernels` (`~/.cache/draftgate/kernels` by default), keyed by the
source, the flags and the CPU's features: under a second here, once. Without a compiler (a warning) or
with `DRAFTGATE_EXACT_KERNEL=0` (an info line) the model attends in float64 as before: the same
guarantee, slower. float32 models (CPUs without bf16) never use it.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from decoding.tokenizer import cache_root

log = logging.getLogger(__name__)

# one library: exact attention, and exact bf16 linear layers (exact_linear.c, where the CPU has AVX512-BF16)
# with the RMSNorm before them and the SwiGLU product between them, a whole layer in one call (exact_layer.c)
SOURCES = tuple(Path(__file__).with_name(name) for name in
                ("exact_attention.c", "exact_linear.c", "exact_norm.c", "exact_silu.c", "exact_layer.c"))
HEADER = Path(__file__).with_name("exact_vec.h")  # their shared vector code
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
MAX_HEAD_DIM = 256  # MAX_HD in the source


def _cpu_features() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build(compiler: list[str], flags: tuple[str, ...]) -> Path:
    texts = {path.name: path.read_text() for path in (*SOURCES, HEADER)}  # read once: keyed and compiled
    key = hashlib.sha256(
        "\n".join([*texts.values(), " ".join(compiler), *flags, platform.machine(), _cpu_features()]).encode()
    ).hexdigest()[:16]
    target = cache_root() / "kernels" / f"exact-{key}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        for name, text in texts.items():  # the text the key names, even if the files change meanwhile
            (Path(tmp) / name).write_text(text)
        built = Path(tmp) / target.name
        subprocess.run([*compiler, *flags, "-o", str(built), *(str(Path(tmp) / s.name) for s in SOURCES)],
                       check=True, capture_output=True, text=True, timeout=120)
        built.replace(target)  # atomic: a concurrent build writes the same bytes
    return target


def _load(compiler: list[str]) -> ctypes.CDLL:
    """The kernel built with OpenMP (its rows on torch's threads), else single-threaded (a compiler
    without OpenMP): a row's bits do not depend on it."""
    try:
        return ctypes.CDLL(str(_build(compiler, FLAGS)))
    except (OSError, subprocess.SubprocessError):
        return ctypes.CDLL(str(_build(compiler, tuple(f for f in FLAGS if f != "-fopenmp"))))


@cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("DRAFTGATE_EXACT_KERNEL", "1") == "0":
        log.info("exact float32 attention off (DRAFTGATE_EXACT_KERNEL=0): bf16 models attend in float64 and "
                 "multiply through oneDNN, exact and slower")
        return None
    compiler = shlex.split(os.environ.get("CC") or "cc")  # as make reads it: "ccache gcc", "gcc -std=gnu11"
    try:
        lib = _load(compiler)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = exc.stderr.strip()[-400:] if isinstance(exc, subprocess.CalledProcessError) and exc.stderr else exc
        log.warning("exact float32 attention unavailable (%s); attending in float64 and multiplying through "
                    "oneDNN, exact and slower", detail)
        return None
    p, i, n = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    lib.attend.argtypes = [p, n, n, i, i, i, i, ctypes.c_float, p, n, n, p, n, p, i, i, p, i]
    lib.attend.restype = ctypes.c_int
    f = ctypes.c_float
    lib.attend_qkv.argtypes = [p, i, i, i, i, i, f, p, p, p, n, n, p, n, i, p, i, p, p, i]
    lib.attend_qkv.restype = ctypes.c_int
    lib.exact_linear_available.restype = ctypes.c_int
    lib.exact_linear_packed_size.argtypes = [n, n]
    lib.exact_linear_packed_size.restype = n
    lib.exact_linear_pack.argtypes = [p, n, n, p]
    lib.exact_linear_pack.restype = None
    lib.exact_linear.argtypes = [p, i, n, p, n, n, p, p, i]
    lib.exact_linear.restype = ctypes.c_int
    lib.exact_rms_norm.argtypes = [p, n, n, p, f, p, i]
    lib.exact_rms_norm.restype = None
    lib.exact_silu_mul.argtypes = [p, n, n, p, i]
    lib.exact_silu_mul.restype = None
    lib.exact_layer.argtypes = [p, i, n, f, p, p, p, n, p, p, p, n, p, i, i, i, f, p, p, p, n, n, p, n, i, p, i, p, i]
    lib.exact_layer.restype = ctypes.c_int
    lib.exact_layer_scratch.argtypes = [i, n, n, n, n]
    lib.exact_layer_scratch.restype = n
    lib.exact_layers.argtypes = [p, i, n, f, i, p, n, n, i, i, i, f, p, p, i, p, i, p, i]
    lib.exact_layers.restype = ctypes.c_int
    log.info("exact float32 attention: %s (exact linear layers: %s)", lib._name,
             "yes" if lib.exact_linear_available() else "no, the CPU lacks AVX512-BF16")
    return lib


def available() -> bool:
    """Whether the kernel is built (or builds now) and loads on this machine."""
    return _library() is not None


def _mask_bytes(mask: torch.Tensor | None, t: int, end: int) -> int | None:
    """The address of a (T, end) bool mask as the kernel reads it (bytes 0 / 1), or None: no mask. The
    caller keeps `mask` alive, contiguous, for the call."""
    if mask is None:
        return None
    assert mask.shape == (t, end) and mask.dtype == torch.bool, f"mask {tuple(mask.shape)}: ({t}, {end}) bool"
    assert mask.is_contiguous(), "the kernel reads the mask row by row"
    return int(mask.data_ptr())


def _check(status: int) -> None:
    if status == 1:
        raise MemoryError("exact kernel: out of memory for its scratch")
    if status != 0:
        raise RuntimeError(f"exact kernel: status {status}")


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, end: int,
                    mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    """Attention of q (1, nh, T, hd) over cached keys and values k, v (1, nkv, S, hd) float32 (positions
    [0, end) are read), with grouped-query heads (nh a multiple of nkv); row i sees key j where
    mask[i, j] (mask (T, end) bool), or with `causal` where j <= end - T + i (the rows are the positions
    [end - T, end)), else every key -> (1, nh, T, hd) float32. Each row's result is the same bits in any
    pass that shows it the same keys in the same order.

    The kernel scores with vector lanes over keys, so it reads keys stored transposed: `k` a view of
    (1, nkv, hd, S) storage (key stride 1), as a model's cache keeps them (`KVCache`, `transposed_keys`).
    Other keys are copied into that layout first."""
    lib = _library()
    assert lib is not None, "exact_attention needs the kernel: check available()"
    _, nh, t, hd = q.shape
    nkv = k.shape[1]
    assert k.dtype == v.dtype == torch.float32 and v.stride(-1) == 1 and v.stride(2) == hd, "float32 cache"
    assert hd <= MAX_HEAD_DIM and nh % nkv == 0 and end <= k.shape[2] and end <= v.shape[2]
    if k.stride(2) != 1:  # keys stored by position: copy them transposed, (1, nkv, hd, end)
        k = k[:, :, :end].transpose(2, 3).contiguous().transpose(2, 3)
    q = q.float()
    if q.stride(-1) != 1:
        q = q.contiguous()
    mask = None if mask is None else mask.contiguous()
    out = torch.empty(1, nh, t, hd, dtype=torch.float32)  # (1, nh, T, hd)
    status = lib.attend(q.data_ptr(), q.stride(1), q.stride(2), nkv, nh // nkv, t, hd, hd**-0.5, k.data_ptr(),
                        k.stride(1), k.stride(3), v.data_ptr(), v.stride(1), _mask_bytes(mask, t, end), int(causal),
                        end, out.data_ptr(), torch.get_num_threads())
    _check(status)
    return out


def attend_step(qkv: torch.Tensor, n_heads: int, n_kv_heads: int, cos: torch.Tensor, sin: torch.Tensor,
                keys: torch.Tensor, values: torch.Tensor, start: int, mask: torch.Tensor | None = None,
                causal: bool = False) -> torch.Tensor:
    """A model's whole attention step in one call, from the q, k, v projection qkv (1, T, (nh + 2 nkv) hd),
    bf16 or float32: queries and keys rotated by cos, sin (T, hd) float32 (each product and sum rounded
    as torch's elementwise ops round them), keys and values written to the cache at positions
    [start, start + T) (keys (1, nkv, hd, S) stored transposed, values (1, nkv, S, hd), both float32),
    attention as `exact_attention` over [0, start + T) -> (1, T, nh hd) bf16 for the output projection.
    The same bits as those steps done with torch's ops around `exact_attention`, without the ~20 small
    ops a layer they take (tests/decoding/test_exact_attention.py)."""
    lib = _library()
    assert lib is not None, "attend_step needs the kernel: check available()"
    _, t, width = qkv.shape
    hd = width // (n_heads + 2 * n_kv_heads)
    end = start + t
    assert qkv.dtype in (torch.bfloat16, torch.float32) and qkv.is_contiguous() and hd <= MAX_HEAD_DIM
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape == (t, hd)
    assert cos.is_contiguous() and sin.is_contiguous()
    assert keys.dtype == values.dtype == torch.float32 and keys.is_contiguous() and values.is_contiguous()
    assert keys.shape[1:3] == (n_kv_heads, hd) and values.shape[1] == n_kv_heads and values.shape[3] == hd
    assert end <= keys.shape[3] and end <= values.shape[2], "the cache is too short for this pass"
    mask = None if mask is None else mask.contiguous()
    out = torch.empty(1, t, n_heads * hd, dtype=torch.bfloat16)  # (1, T, nh hd)
    scratch = torch.empty(2 * n_heads * t * hd, dtype=torch.float32)
    status = lib.attend_qkv(qkv.data_ptr(), int(qkv.dtype == torch.bfloat16), t, n_heads, n_kv_heads, hd, hd**-0.5,
                            cos.data_ptr(), sin.data_ptr(), keys.data_ptr(), keys.stride(1), keys.stride(2),
                            values.data_ptr(), values.stride(1), start, _mask_bytes(mask, t, end), int(causal),
                            out.data_ptr(), scratch.data_ptr(), torch.get_num_threads())
    _check(status)
    return out


def linear_available() -> bool:
    """Whether exact bf16 linear layers run here: the kernel builds and the CPU has AVX512-BF16."""
    lib = _library()
    return lib is not None and bool(lib.exact_linear_available())


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """A linear layer's weight (N, K) bf16, K even, in the layout `exact_linear` reads (1-D bf16, outputs
    in groups of 32, each group's weights one contiguous stream)."""
    lib = _library()
    assert lib is not None, "pack_linear_weight needs the kernel: check linear_available()"
    n, k = weight.shape
    assert weight.dtype == torch.bfloat16 and k % 2 == 0, "exact linear layers take bf16 weights, an even K"
    weight = weight.detach().contiguous()
    packed = torch.empty(lib.exact_linear_packed_size(n, k), dtype=torch.bfloat16)
    lib.exact_linear_pack(weight.data_ptr(), n, k, packed.data_ptr())
    return packed


def exact_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) bf16, or float32 (rounded to bf16 as `x.to(torch.bfloat16)` rounds it) -> x W^T + bias
    (..., N) float32, W packed by `pack_linear_weight`; bias (N,) float32. Every output the same bits in
    any pass (row count, rows beside it, threads): exact_linear.c."""
    lib = _library()
    assert lib is not None, "exact_linear needs the kernel: check linear_available()"
    k = x.shape[-1]
    assert x.dtype in (torch.bfloat16, torch.float32), f"exact linear input {x.dtype}"
    assert packed.numel() == lib.exact_linear_packed_size(out_features, k), "packed for another shape"
    assert bias is None or (bias.dtype == torch.float32 and bias.is_contiguous())
    if not x.is_contiguous():
        x = x.contiguous()
    t = x.numel() // k
    out = torch.empty(*x.shape[:-1], out_features, dtype=torch.float32)  # (..., N)
    status = lib.exact_linear(x.data_ptr(), int(x.dtype == torch.float32), t, packed.data_ptr(), out_features, k,
                              None if bias is None else bias.data_ptr(), out.data_ptr(), torch.get_num_threads())
    _check(status)
    return out


def exact_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x (..., D) float32 with weight (D,) float32 -> (..., D) bf16, each row the same bits in
    any pass (exact_norm.c): the input of exact linear layers."""
    lib = _library()
    assert lib is not None, "exact_rms_norm needs the kernel: check available()"
    assert x.dtype == weight.dtype == torch.float32 and weight.is_contiguous() and weight.shape == x.shape[-1:]
    if not x.is_contiguous():
        x = x.contiguous()
    d = x.shape[-1]
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    lib.exact_rms_norm(x.data_ptr(), x.numel() // d, d, weight.data_ptr(), eps, out.data_ptr(), torch.get_num_threads())
    return out


def exact_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """The SwiGLU product silu(gate) * up of w13's output gate_up (..., 2I) float32 (gate, then up) ->
    (..., I) bf16, w2's input; each row the same bits in any pass (exact_silu.c)."""
    lib = _library()
    assert lib is not None, "exact_silu_mul needs the kernel: check available()"
    assert gate_up.dtype == torch.float32 and gate_up.shape[-1] % 2 == 0
    gate_up = gate_up.contiguous()
    inter = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], inter, dtype=torch.bfloat16)
    lib.exact_silu_mul(gate_up.data_ptr(), gate_up.numel() // (2 * inter), inter, out.data_ptr(),
                       torch.get_num_threads())
    return out


class Scratch:
    """One growing buffer that a model's layers share for `exact_layer`'s intermediates (they run one
    after another): a long prompt's ~70 MB allocated anew each layer paid its page faults every time."""

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)

    def at_least(self, nbytes: int) -> int:
        """The address of at least `nbytes`, 64-byte aligned."""
        if self.buffer.numel() < nbytes + 64:
            self.buffer = torch.empty(nbytes + 64, dtype=torch.uint8)
        address = self.buffer.data_ptr()
        return address + (-address % 64)


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights as `exact_layer` reads them: the norms' weights (D,) float32, the
    projections packed by `pack_linear_weight` (q/k/v's bias (nqkv,) float32 or None)."""

    norm1: torch.Tensor
    norm2: torch.Tensor
    eps: float
    wqkv: torch.Tensor
    qkv_width: int
    qkv_bias: torch.Tensor | None
    wo: torch.Tensor
    w13: torch.Tensor
    intermediate: int
    w2: torch.Tensor
    n_heads: int
    n_kv_heads: int
    head_dim: int
    scratch: Scratch  # shared by the model's layers


def exact_layer(x: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                values: torch.Tensor, start: int, mask: torch.Tensor | None = None,
                causal: bool = False) -> torch.Tensor:
    """A whole decoder layer in one call (exact_layer.c): x (1, T, D) float32, the residual stream, ->
    the next layer's (1, T, D); the cache as `attend_step` takes it, written at [start, start + T). The
    same operations as the model's layer through `exact_rms_norm`, `exact_linear`, `attend_step` and
    `exact_silu_mul`, one C call instead of ~12 from Python."""
    lib = _library()
    assert lib is not None, "exact_layer needs the kernel: check available()"
    _, t, d = x.shape
    hd = w.head_dim
    end = start + t
    assert x.dtype == torch.float32 and cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape == (t, hd)
    assert cos.is_contiguous() and sin.is_contiguous() and keys.is_contiguous() and values.is_contiguous()
    assert keys.dtype == values.dtype == torch.float32 and end <= keys.shape[3] and end <= values.shape[2]
    out = x.contiguous().clone()  # (1, T, D) updated in place by the kernel
    mask = None if mask is None else mask.contiguous()
    f = ctypes.c_float
    scratch = w.scratch.at_least(lib.exact_layer_scratch(t, d, w.qkv_width, w.n_heads * hd, w.intermediate))
    status = lib.exact_layer(
        out.data_ptr(), t, d, f(w.eps), w.norm1.data_ptr(), w.norm2.data_ptr(), w.wqkv.data_ptr(), w.qkv_width,
        None if w.qkv_bias is None else w.qkv_bias.data_ptr(), w.wo.data_ptr(), w.w13.data_ptr(), w.intermediate,
        w.w2.data_ptr(), w.n_heads, w.n_kv_heads, hd, f(hd**-0.5), cos.data_ptr(), sin.data_ptr(), keys.data_ptr(),
        keys.stride(1), keys.stride(2), values.data_ptr(), values.stride(1), start, _mask_bytes(mask, t, end),
        int(causal), scratch, torch.get_num_threads())
    _check(status)
    return out


class _LayerEntry(ctypes.Structure):
    """exact_layer.c's `layer_table`: one layer's weights and cache."""

    _fields_ = [("n1", ctypes.c_void_p), ("n2", ctypes.c_void_p), ("wqkv", ctypes.c_void_p), ("bqkv", ctypes.c_void_p),
                ("wo", ctypes.c_void_p), ("w13", ctypes.c_void_p), ("w2", ctypes.c_void_p), ("kt", ctypes.c_void_p),
                ("khs", ctypes.c_long), ("kds", ctypes.c_long), ("v", ctypes.c_void_p), ("vhs", ctypes.c_long)]


class LayerTable:
    """A model's layers as one `exact_layers` call reads them: every layer's weights and its cache's keys
    (1, nkv, hd, S) and values (1, nkv, S, hd), float32. It holds the tensors it points into; a new cache
    needs a new table (Transformer.layer_table)."""

    def __init__(self, weights: list[LayerWeights], caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        first = weights[0]
        for w in weights:
            assert (w.eps, w.qkv_width, w.intermediate, w.n_heads, w.n_kv_heads, w.head_dim, w.scratch) == (
                first.eps, first.qkv_width, first.intermediate, first.n_heads, first.n_kv_heads, first.head_dim,
                first.scratch), "one table's layers share their shapes, eps and scratch"
        for keys, values in caches:
            assert keys.dtype == values.dtype == torch.float32 and keys.is_contiguous() and values.is_contiguous()
        self.weights, self.caches = weights, caches
        entries = (_LayerEntry * len(weights))()
        for entry, w, (keys, values) in zip(entries, weights, caches, strict=True):
            entry.n1, entry.n2 = w.norm1.data_ptr(), w.norm2.data_ptr()
            entry.wqkv, entry.wo = w.wqkv.data_ptr(), w.wo.data_ptr()
            entry.w13, entry.w2 = w.w13.data_ptr(), w.w2.data_ptr()
            entry.bqkv = None if w.qkv_bias is None else w.qkv_bias.data_ptr()
            entry.kt, entry.khs, entry.kds = keys.data_ptr(), keys.stride(1), keys.stride(2)
            entry.v, entry.vhs = values.data_ptr(), values.stride(1)
        self.entries = entries
        self.max_positions = min(min(k.shape[3], v.shape[2]) for k, v in caches)


def exact_layers(x: torch.Tensor, table: LayerTable, cos: torch.Tensor, sin: torch.Tensor, start: int,
                 mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    """Every layer of `table` in one call (exact_layer.c, `exact_layers`): x (1, T, D) float32 -> the
    residual stream after the last, the bits of `exact_layer` called layer by layer."""
    lib = _library()
    assert lib is not None, "exact_layers needs the kernel: check available()"
    _, t, d = x.shape
    w = table.weights[0]
    hd = w.head_dim
    end = start + t
    assert x.dtype == torch.float32 and cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape == (t, hd)
    assert cos.is_contiguous() and sin.is_contiguous() and end <= table.max_positions
    out = x.contiguous().clone()  # (1, T, D) updated in place, layer after layer
    mask = None if mask is None else mask.contiguous()
    f = ctypes.c_float
    scratch = w.scratch.at_least(lib.exact_layer_scratch(t, d, w.qkv_width, w.n_heads * hd, w.intermediate))
    status = lib.exact_layers(
        out.data_ptr(), t, d, f(w.eps), len(table.weights), ctypes.addressof(table.entries), w.qkv_width,
        w.intermediate, w.n_heads, w.n_kv_heads, hd, f(hd**-0.5), cos.data_ptr(), sin.data_ptr(), start,
        _mask_bytes(mask, t, end), int(causal), scratch, torch.get_num_threads())
    _check(status)
    return out
