"""The real model under every corpus schema: a grammar-complete output always validates."""

from __future__ import annotations

import json

import pytest

from decoding.constraints.outlines_backend import OutlinesBackend
from decoding.constraints.preflight import validate_output
from decoding.constraints.xgrammar_backend import XGrammarBackend
from decoding.drafters import CompositeDrafter, GrammarForcedDrafter, NgramDrafter
from decoding.generate import Engine, GenerationConfig
from decoding.loading import LoadedModel
from tests.decoding.test_preflight import corpus

pytestmark = pytest.mark.slow


def _clean() -> list[dict]:
    return [e for e in corpus() if not e["id"].startswith("unsupported-")]


@pytest.mark.parametrize("backend_name", ["xgrammar", "outlines"])
def test_corpus_outputs_validate(embedded_model: LoadedModel, backend_name: str) -> None:
    tokenizer = embedded_model.tokenizer
    eos = tokenizer.hf.convert_tokens_to_ids("<|im_end|>")
    backend = (XGrammarBackend if backend_name == "xgrammar" else OutlinesBackend)(tokenizer, eos)
    entries = _clean()
    if backend_name == "outlines":
        # outlines-core builds a DFA per schema: seconds to minutes for date-time / email formats
        entries = [e for e in entries if "format" not in json.dumps(e["schema"])][:8]
    engine = Engine(embedded_model, CompositeDrafter([GrammarForcedDrafter(), NgramDrafter()]))
    finished, cut = 0, []
    for entry in entries:
        factory = backend.compile_json_schema(entry["schema"])
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": entry["prompt"]}])
        result = engine.complete(prompt, GenerationConfig(max_new_tokens=256, grammar=factory))
        if result.finish_reason == "length":
            cut.append(entry["id"])  # the model ran on inside an unbounded string
            continue
        assert result.finish_reason == "stop"
        validate_output(result.text, entry["schema"])  # raises with the reason if not valid
        finished += 1
    print(f"\n{backend_name}: {finished}/{len(entries)} complete and valid; cut by max_tokens: {cut}")
    assert finished >= 0.9 * len(entries)
