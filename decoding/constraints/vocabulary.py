"""The bytes each token stands for, which grammar backends match against."""

from __future__ import annotations

from functools import lru_cache

from decoding.tokenizer import Tokenizer


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's reversible map of bytes to printable characters, inverted (as byte-level BPE uses it)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def token_bytes(tokenizer: Tokenizer) -> list[bytes | None]:
    """[V] the bytes of every token; None for special tokens (no grammar admits them)."""
    hf = tokenizer.hf
    special = set(hf.all_special_ids) | {int(i) for i in getattr(hf, "added_tokens_decoder", {})}
    decoder = type(hf.backend_tokenizer.decoder).__name__ if hf.backend_tokenizer.decoder else ""
    table = _byte_decoder()
    out: list[bytes | None] = []
    for tid, token in enumerate(hf.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))):
        if tid in special or token is None:
            out.append(None)
        elif decoder == "ByteLevel" and all(c in table for c in token):
            out.append(bytes(table[c] for c in token))
        elif token.startswith("<0x") and token.endswith(">") and len(token) == 6:  # sentencepiece byte
            out.append(bytes([int(token[3:5], 16)]))
        else:
            out.append(token.replace("▁", " ").encode("utf-8"))
    return out
