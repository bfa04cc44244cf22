"""Peers run on the same weights: HF transformers `generate` (plain, prompt lookup, assisted) and
llama.cpp through llama-cpp-python on the same GGUF file, when that optional extra is installed."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from decoding.hf_weights import to_hf_llama
from decoding.loading import LoadedModel


class HFRunner:
    """HF `generate`, greedy, on a `LlamaForCausalLM` holding our exact weights in our dtype."""

    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None) -> None:
        self.model = to_hf_llama(target.model)
        self.assistant = to_hf_llama(draft.model) if draft is not None else None
        eos = sorted(target.tokenizer.eos_token_ids)
        self.eos = eos
        self.pad = eos[0] if eos else 0

    def generate(self, prompt: list[int], max_new_tokens: int, mode: str) -> list[int]:
        kwargs: dict[str, Any] = {}
        if mode == "prompt_lookup":
            kwargs["prompt_lookup_num_tokens"] = 10
        elif mode == "assisted":
            kwargs["assistant_model"] = self.assistant
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                eos_token_id=self.eos, pad_token_id=self.pad, **kwargs,
            )
        return [int(t) for t in out[0, len(prompt):]]


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


class LlamaCppRunner:
    """llama.cpp on the GGUF file itself (its own Q4_1 kernels), 2 threads, greedy."""

    def __init__(self, gguf_path: str, n_ctx: int = 4096) -> None:
        import llama_cpp

        self.llm = llama_cpp.Llama(model_path=gguf_path, n_ctx=n_ctx, n_threads=torch.get_num_threads(),
                                   n_batch=512, verbose=False, logits_all=False)

    def generate(self, prompt: list[int], max_new_tokens: int, eos: frozenset[int]) -> list[int]:
        self.llm.reset()
        out: list[int] = []
        for token in self.llm.generate(prompt, top_k=1, temp=0.0, reset=True):
            out.append(int(token))
            if token in eos or len(out) >= max_new_tokens:
                break
        return out
