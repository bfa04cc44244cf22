"""The real model under every corpus schema, with both backends: every output is complete and validates."""

from __future__ import annotations

import json
import threading
import time

import pytest

from decoding.constraints import outlines_backend
from decoding.constraints.backends import make_backend
from decoding.constraints.base import CompileTimeoutError
from decoding.constraints.bounds import Bounds, bound_schema
from decoding.constraints.corpus import load_corpus
from decoding.constraints.preflight import unsupported_keywords, validate_output
from decoding.drafters import CompositeDrafter, GrammarForcedDrafter, NgramDrafter
from decoding.generate import Engine, GenerationConfig
from decoding.loading import LoadedModel

pytestmark = pytest.mark.slow
# unbounded strings and numbers are bounded (as a route's `constraints.bounds` does): greedy decoding of
# a 135M model otherwise repeats itself inside one until max_tokens
BOUNDS = Bounds(string_length=40, digits=12)


@pytest.mark.parametrize("backend_name", ["xgrammar", "outlines"])
def test_corpus_outputs_validate(embedded_model: LoadedModel, backend_name: str) -> None:
    tokenizer = embedded_model.tokenizer
    backend = make_backend(backend_name, tokenizer)
    entries = load_corpus()
    assert len(entries) >= 50
    engine = Engine(embedded_model, CompositeDrafter([GrammarForcedDrafter(tokenizer), NgramDrafter()]))
    compile_s = []
    checked, maps = 0, 0
    for entry in entries:
        started = time.perf_counter()
        factory = backend.compile_json_schema(bound_schema(entry["schema"], BOUNDS, backend_name))
        compile_s.append(time.perf_counter() - started)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": entry["prompt"]}])
        result = engine.complete(prompt, GenerationConfig(max_new_tokens=320, grammar=factory))
        assert result.finish_reason == "stop", f"{entry['id']}: cut by max_tokens: ...{result.text[-100:]!r}"
        validate_output(result.text, entry["schema"])  # the caller's schema, unbounded; raises with the reason
        checked += 1
        maps += '"additionalProperties": {' in json.dumps(entry["schema"])
    assert maps >= 3  # maps, whose keys the bounds count (outlines_maps.py for outlines)
    assert checked == len(entries)
    print(f"\n{backend_name}: {checked} of {len(entries)} schemas, all complete and valid; "
          f"compile max {max(compile_s):.2f} s")


def test_outlines_gives_up_on_an_exploding_schema_by_name_holding_up_no_other(embedded_model: LoadedModel,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # unbounded, this schema's email strings take outlines over 90 s (`too_slow_for` in the corpus)
    slow = next(e for e in load_corpus() if "outlines" in e.get("too_slow_for", []))
    timeout_s = 8.0
    backend = make_backend("outlines", embedded_model.tokenizer, compile_timeout_s=timeout_s)
    errors: list[Exception] = []

    def compile_slow() -> None:
        try:
            backend.compile_json_schema(slow["schema"])
        except Exception as exc:
            errors.append(exc)

    thread = threading.Thread(target=compile_slow)
    thread.start()
    time.sleep(0.5)
    # another schema compiles while the slow one is still at it, not after its timeout
    backend.compile_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    assert thread.is_alive()
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], CompileTimeoutError) and "xgrammar" in str(errors[0])
    assert errors[0].code == "schema_too_complex"
    # asked again, it fails at once rather than after another timeout: it compiles nothing
    def no_compiling(*args: object, **kwargs: object) -> None:
        raise AssertionError("compiled again after giving up")

    monkeypatch.setattr(outlines_backend, "build_index", no_compiling)
    with pytest.raises(CompileTimeoutError, match="xgrammar"):
        backend.compile_json_schema(slow["schema"])


@pytest.mark.parametrize("backend_name", ["xgrammar", "outlines"])
def test_max_properties_of_a_map_is_enforced_by_both_backends(embedded_model: LoadedModel, backend_name: str) -> None:
    """What preflight says of maps, checked on the grammar itself."""
    tokenizer = embedded_model.tokenizer
    schema = {"type": "object", "additionalProperties": {"enum": [1, 2]}, "minProperties": 1, "maxProperties": 2}
    assert unsupported_keywords(schema, backend_name) == []
    grammar = make_backend(backend_name, tokenizer).compile_json_schema(schema).new()
    comma, close = tokenizer.encode(","), tokenizer.encode("}")
    assert len(comma) == 1 and len(close) == 1
    grammar.accept(tokenizer.encode("{")[0])
    assert not bool(grammar.allowed_mask()[close[0]])  # minProperties: not empty
    for token in tokenizer.encode('"a":1,"b":2'):
        grammar.accept(token)
    allowed = grammar.allowed_mask()  # [V]
    assert bool(allowed[close[0]]) and not bool(allowed[comma[0]])  # a third key is refused
    beside = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True,
              "maxProperties": 2}
    expected = ["maxProperties"] if backend_name == "outlines" else []  # outlines: only for maps
    assert [u.keyword for u in unsupported_keywords(beside, backend_name)] == expected
