"""xgrammar: a pushdown automaton over the vocabulary; compile ~ms per schema, masks in microseconds."""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

import torch

from decoding.constraints.base import ConstraintError, Grammar, GrammarFactory, unpack_bitmask
from decoding.constraints.vocabulary import token_bytes
from decoding.tokenizer import Tokenizer


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

    def compile_json_schema(self, schema: dict[str, Any]) -> XGrammarFactory:
        text = json.dumps(schema)  # key order kept: properties are generated in the schema's order
        key = hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).hexdigest()
        with self._lock:
            if key not in self._cache:
                try:
                    # compact: no whitespace between JSON tokens
                    compiled = self.compiler.compile_json_schema(text, any_whitespace=False, separators=(",", ":"))
                except (RuntimeError, ValueError) as exc:
                    raise ConstraintError(f"xgrammar cannot compile this schema: {exc}") from exc
                self._cache[key] = XGrammarFactory(compiled, self.vocab_size, self.eos_token_id)
            return self._cache[key]
