"""outlines-core: the JSON schema becomes a regular expression, the regex an index over the vocabulary.

The vocabulary is built once per tokenizer (~0.4 s for 49k tokens); the index once per schema, cached
by the regex's hash in memory and, given a cache directory, on disk across restarts. Compiles of
different schemas run side by side (at most COMPILE_SLOTS at once); a request for a schema being
compiled waits for that compile, and one that timed out fails at once for FAILED_RETRY_S.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import threading
import time
from collections import OrderedDict
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from decoding.constraints.base import CompileTimeoutError, ConstraintError, Grammar, GrammarFactory, unpack_bitmask
from decoding.constraints.forced_text import VocabBytes, text_forced_by_masks
from decoding.constraints.outlines_maps import counted_map_regex
from decoding.constraints.outlines_worker import build_index
from decoding.constraints.spec import GrammarSpec, regex_escape, text_not_starting_with
from decoding.constraints.vocabulary import token_bytes
from decoding.tokenizer import Tokenizer

# compact JSON: no whitespace between tokens, so a small model cannot stall in it until max_tokens
COMPACT_WHITESPACE = ""
MASKS_PER_REQUEST = 256  # masks kept by automaton state (48 KB each for a 49k vocabulary)
COMPILE_SLOTS = 2  # indexes built at once (a child process each, ~300 MB, one core)
FAILED_RETRY_S = 600.0  # a schema whose compile timed out is refused at once for this long
log = logging.getLogger(__name__)


# steps a grammar can take back at once: a proposal's drafts (max_draft_tokens, at most 32), then the walk
# of forced text past them (forced_text.py: up to 64 bytes, a token each at worst) and its own rollback.
# outlines keeps this many states; 64 let a long forced `const` crash the request (a review)
MAX_ROLLBACK = 256


class OutlinesGrammar(Grammar):
    def __init__(self, guide: Any, vocab_size: int, words: int, eos_token_id: int, vocab: VocabBytes) -> None:
        self.guide = guide
        self.vocab = vocab
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        # outlines allows EOS in a final state but has no transition for it: count accepted EOS tokens
        # ourselves (the state stays final), so rollback can undo them too
        self._eos_accepted = 0
        self._bitmask = torch.zeros(words, dtype=torch.int32)
        self._mask: torch.Tensor | None = None  # cache for the current state
        # masks by automaton state: speculation visits the same states again and again (drafting,
        # verifying, rolling back, re-advancing), and a state's mask never changes
        self._by_state: OrderedDict[int, torch.Tensor] = OrderedDict()

    def allowed_mask(self) -> torch.Tensor:
        if self._mask is None:
            state = int(self.guide.get_state())
            mask = self._by_state.get(state)
            if mask is None:
                self._bitmask.zero_()
                self.guide.write_mask_into(self._bitmask.data_ptr(), self._bitmask.numel(), 4)
                mask = unpack_bitmask(self._bitmask, self.vocab_size)
                self._by_state[state] = mask
                if len(self._by_state) > MASKS_PER_REQUEST:
                    self._by_state.popitem(last=False)
            else:
                self._by_state.move_to_end(state)
            self._mask = mask
        return self._mask

    def accept(self, token: int) -> None:
        if not self.allows(token):
            raise ConstraintError(f"token {token} is not allowed by the grammar here")
        if token == self.eos_token_id and (self._eos_accepted or self.guide.is_finished()):
            self._eos_accepted += 1
            return
        self.guide.advance(token, return_tokens=False)
        self._mask = None

    def rollback(self, n: int) -> None:
        undo_eos = min(n, self._eos_accepted)
        self._eos_accepted -= undo_eos
        if n - undo_eos:
            self.guide.rollback_state(n - undo_eos)
            self._mask = None

    def is_finished(self) -> bool:
        return self._eos_accepted > 0 or bool(self.guide.is_finished())

    def forced_text(self) -> str:
        return "" if self._eos_accepted else text_forced_by_masks(self, self.vocab, self.eos_token_id)


class OutlinesFactory(GrammarFactory):
    def __init__(self, index: Any, vocab_size: int, eos_token_id: int, vocab: VocabBytes) -> None:
        self.index = index
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.vocab = vocab

    def new(self) -> Grammar:
        import outlines_core

        guide = outlines_core.Guide(self.index, max_rollback=MAX_ROLLBACK)
        return OutlinesGrammar(guide, self.vocab_size, (self.vocab_size + 31) // 32, self.eos_token_id,
                              self.vocab)


class OutlinesBackend:
    """Compiles JSON schemas (and regexes) for one tokenizer."""

    name = "outlines"

    def __init__(
        self, tokenizer: Tokenizer, eos_token_id: int, compile_timeout_s: float | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        import outlines_core

        self.vocab_size = tokenizer.vocab_size
        # compiled indexes persist here across restarts (None: memory only), keyed by the regex, the
        # vocabulary and the outlines-core version
        self.cache_dir = cache_dir
        self._salt = f"{tokenizer.fingerprint()}:{eos_token_id}:{metadata.version('outlines_core')}"
        self.eos_token_id = eos_token_id
        # None: compile in this process, however long it takes; else in a child, given up after this
        self.compile_timeout_s = compile_timeout_s
        self._tokens: dict[bytes, list[int]] = {}
        table = token_bytes(tokenizer)
        self.vocab_bytes = VocabBytes(table)
        for tid, b in enumerate(table):
            if b and tid != eos_token_id:
                self._tokens.setdefault(b, []).append(tid)
        self.vocabulary = outlines_core.Vocabulary(eos_token_id, self._tokens)
        self._cache: dict[str, OutlinesFactory] = {}
        self._failed: dict[str, tuple[float, CompileTimeoutError]] = {}  # key -> (when, its error)
        self._lock = threading.Lock()  # guards the dicts only; held for lookups, never for a compile
        self._compiling: dict[str, threading.Lock] = {}  # one per schema being compiled
        self._slots = threading.BoundedSemaphore(COMPILE_SLOTS)

    def regex_for_schema(self, schema: dict[str, Any]) -> str:
        from outlines_core import json_schema

        def build(text: str) -> str:
            return str(json_schema.build_regex_from_schema(text, COMPACT_WHITESPACE))

        try:
            return counted_map_regex(schema, build)  # outlines' regex, with maps' key counts enforced
        except (ValueError, TypeError) as exc:
            raise ConstraintError(f"outlines cannot compile this schema: {exc}") from exc

    def compile_regex(self, regex: str) -> OutlinesFactory:
        key = hashlib.sha256(regex.encode()).hexdigest()
        with self._lock:
            self._check_cached(key)
            if key in self._cache:
                return self._cache[key]
            compiling = self._compiling.setdefault(key, threading.Lock())
        with compiling:  # the first request for a schema compiles it; the others wait here, then find it
            with self._lock:
                self._check_cached(key)
                if key in self._cache:
                    return self._cache[key]
            try:
                index = self._load(key)
                if index is None:
                    with self._slots:
                        index = self._build(key, regex)
                    self._store(key, index)
                factory = OutlinesFactory(index, self.vocab_size, self.eos_token_id, self.vocab_bytes)
                with self._lock:
                    self._cache[key] = factory
                return factory
            finally:  # compiled, timed out (in _failed) or refused: no longer being compiled
                with self._lock:
                    self._compiling.pop(key, None)

    def _check_cached(self, key: str) -> None:
        """Raise the error of a recent compile of this schema that timed out (under the lock)."""
        failed = self._failed.get(key)
        if failed is not None and time.monotonic() - failed[0] < FAILED_RETRY_S:
            raise CompileTimeoutError(str(failed[1]))

    def _build(self, key: str, regex: str) -> Any:
        import outlines_core

        try:
            if self.compile_timeout_s is None:
                return outlines_core.Index(regex, self.vocabulary)
            return build_index(regex, self.eos_token_id, self._tokens, self.compile_timeout_s)
        except (ValueError, TypeError) as exc:
            raise ConstraintError(f"outlines cannot build an index for this grammar: {exc}") from exc
        except TimeoutError as exc:
            error = CompileTimeoutError(
                f"outlines gave up on this schema ({exc}): its automaton grows too large, as a string at the "
                "top level of a schema, string formats (date-time, email, uri) in arrays or many optional "
                "fields make it; use the xgrammar backend for it"
            )
            with self._lock:
                self._failed[key] = (time.monotonic(), error)
            raise error from exc

    def _path(self, key: str) -> Path | None:
        if self.cache_dir is None:
            return None
        digest = hashlib.sha256(f"{self._salt}:{key}".encode()).hexdigest()[:32]
        return self.cache_dir / f"{digest}.index"

    def _load(self, key: str) -> Any:
        path = self._path(key)
        if path is None or not path.exists():
            return None
        try:
            return pickle.loads(path.read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError, ValueError) as exc:
            log.warning("ignoring an unreadable cached index %s: %s", path, exc)
            return None

    def _store(self, key: str, index: Any) -> None:
        path = self._path(key)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(pickle.dumps(index))
            tmp.replace(path)  # atomic: a concurrent reader sees the whole file or none
        except OSError as exc:  # a read-only cache is no reason to fail
            log.warning("could not cache the index in %s: %s", path, exc)

    def regex_for_spec(self, spec: GrammarSpec) -> str:
        alternatives = []
        if spec.json_schema is not None:
            alternatives.append(self.regex_for_schema(spec.json_schema))
        if spec.calls_schema is not None:
            alternatives.append(regex_escape(spec.marker) + f"(?:{self.regex_for_schema(spec.calls_schema)})")
        if spec.free_text:
            alternatives.append(text_not_starting_with(spec.marker))
        # one group around the alternation: outlines anchors the regex by plain concatenation
        return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(f"(?:{a})" for a in alternatives) + ")"

    def compile(self, spec: GrammarSpec) -> OutlinesFactory:
        return self.compile_regex(self.regex_for_spec(spec))

    def compile_json_schema(self, schema: dict[str, Any]) -> OutlinesFactory:
        return self.compile(GrammarSpec(json_schema=schema))
