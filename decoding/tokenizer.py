"""Tokenizer, chat template, and an incremental detokenizer that never splits a UTF-8 character."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from decoding.errors import ModelLoadError

log = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"
# stands in for the k-th special-token string found inside a message while the template renders:
# private-use characters around k, which no template changes
_HIDDEN = re.compile("\ue000(\\d+)\ue001")


def cache_root() -> Path:
    """Where draftgate keeps what it derives once: converted tokenizers, compiled grammars."""
    root = os.environ.get("DRAFTGATE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "draftgate")
    return Path(root)


class Tokenizer:
    """A thin wrapper over a HF fast tokenizer with the few operations the engine needs."""

    def __init__(self, hf: Any, source: str) -> None:
        self.hf = hf
        self.source = source
        self.vocab_size = len(hf)
        self.bos_token_id: int | None = hf.bos_token_id
        names = [hf.eos_token] if hf.eos_token else []
        found = (self._id(n) for n in [*names, "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>"])
        self.eos_token_ids: frozenset[int] = frozenset(t for t in found if t is not None)
        # the token that closes an assistant turn: what a grammar allows once the output is complete
        self.turn_end_id: int | None = next(
            (t for t in (self._id(n) for n in ("<|im_end|>", "<|eot_id|>", "<|end|>")) if t is not None),
            hf.eos_token_id,
        )

    def _id(self, token: str) -> int | None:
        tid = self.hf.convert_tokens_to_ids(token)
        return tid if isinstance(tid, int) and tid >= 0 and tid != self.hf.unk_token_id else None

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=True))

    def apply_chat_template(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of `messages` rendered by the model's chat template, ready for the assistant turn."""
        if not self.hf.chat_template:
            raise ModelLoadError(f"{self.source}: the tokenizer has no chat template")
        found: list[str] = []  # special-token text inside the messages, in the order hidden
        specials = self._specials

        def stand_in(match: re.Match[str]) -> str:
            found.append(match.group())
            return f"\ue000{len(found) - 1}\ue001"

        def hide(value: Any) -> Any:
            if isinstance(value, str):
                return specials.sub(stand_in, value)
            if isinstance(value, dict):
                return {k: hide(v) for k, v in value.items()}
            if isinstance(value, list):
                return [hide(v) for v in value]
            return value

        text = str(self.hf.apply_chat_template(hide(messages), tools=hide(tools), add_generation_prompt=True,
                                               tokenize=False))
        if not found:
            return self.encode(text)
        # a message holding "<|im_end|>" must not end its own turn: the template's own markers are the
        # special tokens left in the text; between them, the hidden ones come back as plain text
        ids: list[int] = []
        start = 0
        for marker in [*specials.finditer(text), None]:
            piece = _HIDDEN.sub(lambda m: found[int(m.group(1))], text[start : marker.start() if marker else None])
            if piece:
                ids += self.hf.encode(piece, add_special_tokens=False, split_special_tokens=True)
            if marker is not None:
                ids.append(self.hf.convert_tokens_to_ids(marker.group()))
                start = marker.end()
        return ids

    @functools.cached_property
    def _specials(self) -> re.Pattern[str]:
        """The special tokens' texts (<|im_start|>, <|im_end|>, ...), longest first."""
        names = sorted({t.content for t in self.hf.added_tokens_decoder.values() if t.special}, key=len, reverse=True)
        return re.compile("|".join(map(re.escape, names))) if names else re.compile("(?!)")

    def fingerprint(self) -> str:
        """A digest of the vocabulary, equal for tokenizers that map text to the same ids."""
        vocab = sorted(self.hf.get_vocab().items(), key=lambda kv: kv[1])
        h = hashlib.sha256()
        for token, tid in vocab:
            h.update(f"{tid}\t{token}\n".encode())
        return h.hexdigest()[:16]


def load_tokenizer(path: Path, gguf_file: str | None = None) -> Tokenizer:
    """Load from a HF directory, or convert from a GGUF file once and cache the result."""
    from transformers import AutoTokenizer

    if gguf_file is None:
        try:
            return Tokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True), str(path))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{path}: no usable tokenizer ({exc})") from exc
    gguf_path = path / gguf_file
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_root() / "tokenizers" / key
    if (cached / "tokenizer.json").exists():
        return Tokenizer(AutoTokenizer.from_pretrained(cached, local_files_only=True), str(gguf_path))
    log.info("converting the tokenizer of %s (once; cached in %s)", gguf_path, cached)
    try:
        hf = AutoTokenizer.from_pretrained(path, gguf_file=gguf_file, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"{gguf_path}: no usable tokenizer ({exc})") from exc
    _cache_tokenizer(hf, cached)
    return Tokenizer(hf, str(gguf_path))


def _cache_tokenizer(hf: Any, cached: Path) -> None:
    """Save into a directory of this process's own, then rename it into place: a process that starts
    beside this one (two servers, two test workers) finds the whole tokenizer or none of it."""
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        hf.save_pretrained(tmp)
        if cached.exists() and not (cached / "tokenizer.json").exists():  # left by an interrupted older run
            shutil.rmtree(cached)
        tmp.rename(cached)
    except OSError as exc:  # a read-only home is no reason to fail; losing the rename to another process none
        if not (cached / "tokenizer.json").exists():  # to warn about
            log.warning("could not cache the tokenizer in %s: %s", cached, exc)
        shutil.rmtree(tmp, ignore_errors=True)


class IncrementalDetokenizer:
    """Text deltas of a growing token sequence; holds back bytes of an unfinished UTF-8 character.

    Decoding token by token breaks multi-byte characters and merges (a byte-level BPE token can hold
    half a character). Like vLLM and TGI, decode a short window before the new tokens and emit only the
    text beyond it, once it no longer ends in the replacement character.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_tail: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_tail[-4:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def push(self, new_ids: Sequence[int]) -> str:
        """Add tokens; return the text that became final."""
        self.ids.extend(new_ids)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT_CHAR):
            delta = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is left at the end of generation (an incomplete character stays replaced)."""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :]
