"""xgrammar: a pushdown automaton over the vocabulary; compile ~ms per schema, masks in microseconds."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import torch

from decoding.constraints.base import ConstraintError, Grammar, GrammarFactory, unpack_bitmask
from decoding.constraints.spec import GrammarSpec, text_not_starting_with
from decoding.constraints.vocabulary import token_bytes
from decoding.tokenizer import Tokenizer

# xgrammar's messages start with a time and its C++ source: "[00:58:32] /project/cpp/regex_converter.cc:94: "
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+\.(?:cc|h):[0-9]+: ")


def _reason(exc: Exception) -> str:
    return _LOG_PREFIX.sub("", str(exc).strip())


class XGrammarGrammar(Grammar):
    def __init__(self, matcher: Any, vocab_size: int, eos_token_id: int) -> None:
        import xgrammar

        self.matcher = matcher
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)  # [1, W] int32
        self._mask: torch.Tensor | None = None
        # after the stop token xgrammar has terminated and gives no mask; further EOS tokens (drafted
        # past the end) are counted here so that rollback can undo them
        self._extra_eos = 0
        self._eos_only = torch.zeros(vocab_size, dtype=torch.bool)
        self._eos_only[eos_token_id] = True

    def allowed_mask(self) -> torch.Tensor:
        if self.matcher.is_terminated():
            return self._eos_only
        if self._mask is None:
            self.matcher.fill_next_token_bitmask(self._bitmask)
            self._mask = unpack_bitmask(self._bitmask[0], self.vocab_size)
        return self._mask

    def accept(self, token: int) -> None:
        if self.matcher.is_terminated():
            if token != self.eos_token_id:
                raise ConstraintError(f"token {token} after the end of the grammar")
            self._extra_eos += 1
            return
        if not self.matcher.accept_token(token):
            raise ConstraintError(f"token {token} is not allowed by the grammar here")
        self._mask = None

    def rollback(self, n: int) -> None:
        extra = min(n, self._extra_eos)
        self._extra_eos -= extra
        if n - extra:
            self.matcher.rollback(n - extra)
            self._mask = None

    def forced_text(self) -> str:
        if self.matcher.is_terminated():
            return ""
        return str(self.matcher.find_jump_forward_string())  # xgrammar's jump-forward, at the byte level

    def is_finished(self) -> bool:
        if self.matcher.is_terminated():
            return True
        mask = self.allowed_mask()
        return bool(mask[self.eos_token_id]) and int(mask.sum()) == 1


class XGrammarFactory(GrammarFactory):
    def __init__(self, compiled: Any, vocab_size: int, eos_token_id: int) -> None:
        self.compiled = compiled
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def new(self) -> Grammar:
        import xgrammar

        matcher = xgrammar.GrammarMatcher(self.compiled, max_rollback_tokens=64)
        return XGrammarGrammar(matcher, self.vocab_size, self.eos_token_id)


class XGrammarBackend:
    name = "xgrammar"

    def __init__(self, tokenizer: Tokenizer, eos_token_id: int) -> None:
        import xgrammar

        self.vocab_size = tokenizer.vocab_size
        self.eos_token_id = eos_token_id
        encoded = [b or b"" for b in token_bytes(tokenizer)]  # special tokens: empty, never matched
        info = xgrammar.TokenizerInfo(encoded, xgrammar.VocabType.RAW, vocab_size=self.vocab_size,
                                      stop_token_ids=[eos_token_id])
        self.compiler = xgrammar.GrammarCompiler(info)
        self._cache: dict[str, XGrammarFactory] = {}
        self._lock = threading.Lock()

    def _json(self, schema: dict[str, Any]) -> Any:
        import xgrammar

        # key order kept: properties are generated in the schema's order; compact: no whitespace
        return xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))

    def grammar_for_spec(self, spec: GrammarSpec) -> Any:
        import xgrammar

        alternatives = []
        if spec.json_schema is not None:
            alternatives.append(self._json(spec.json_schema))
        if spec.calls_schema is not None:
            marker = xgrammar.Grammar.from_ebnf(f"root ::= {json.dumps(spec.marker)}")
            alternatives.append(xgrammar.Grammar.concat(marker, self._json(spec.calls_schema)))
        if spec.free_text:
            alternatives.append(xgrammar.Grammar.from_regex(text_not_starting_with(spec.marker)))
        return alternatives[0] if len(alternatives) == 1 else xgrammar.Grammar.union(*alternatives)

    def compile(self, spec: GrammarSpec) -> XGrammarFactory:
        key = spec.key()
        with self._lock:
            if key not in self._cache:
                try:
                    compiled = self.compiler.compile_grammar(self.grammar_for_spec(spec))
                except (RuntimeError, ValueError) as exc:
                    raise ConstraintError(f"xgrammar cannot compile this schema: {_reason(exc)}") from exc
                self._cache[key] = XGrammarFactory(compiled, self.vocab_size, self.eos_token_id)
            return self._cache[key]

    def compile_json_schema(self, schema: dict[str, Any]) -> XGrammarFactory:
        return self.compile(GrammarSpec(json_schema=schema))
