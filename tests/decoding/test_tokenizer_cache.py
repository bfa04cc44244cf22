"""The converted-tokenizer cache: a process that starts beside another (two servers, two test workers)
finds a whole tokenizer in the cache or none, never one half written."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from decoding.tokenizer import _cache_tokenizer
from tests.conftest import word_tokenizer


def _watched(seen: list[bool], cached: Path) -> Any:
    """A real (tiny) HF tokenizer whose save_pretrained also notes whether `cached` already shows files."""
    hf = word_tokenizer(8).hf
    save = hf.save_pretrained

    def save_and_look(directory: str | Path, **kw: Any) -> Any:
        written = save(directory, **kw)
        seen.append(cached.exists() and any(cached.iterdir()))
        return written

    hf.save_pretrained = save_and_look
    return hf


def test_the_tokenizer_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    cached = tmp_path / "tokenizers" / "abc"
    seen: list[bool] = []
    _cache_tokenizer(_watched(seen, cached), cached)
    assert seen == [False]  # written elsewhere: nothing was visible at the cache path while it was saved
    assert (cached / "tokenizer.json").is_file()
    assert [p.name for p in cached.parent.iterdir()] == ["abc"]  # the temporary directory was renamed


def test_a_tokenizer_another_process_cached_first_is_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cached = tmp_path / "tokenizers" / "abc"
    _cache_tokenizer(word_tokenizer(8).hf, cached)
    before = {p.name: p.stat().st_mtime_ns for p in cached.iterdir()}
    with caplog.at_level(logging.WARNING):
        _cache_tokenizer(word_tokenizer(8).hf, cached)  # loses the race: the rename finds the directory there
    assert {p.name: p.stat().st_mtime_ns for p in cached.iterdir()} == before
    assert [p.name for p in cached.parent.iterdir()] == ["abc"]  # its own copy removed
    assert not caplog.records  # losing the race is not worth a warning


def test_a_directory_left_incomplete_is_replaced(tmp_path: Path) -> None:
    cached = tmp_path / "tokenizers" / "abc"
    cached.mkdir(parents=True)
    (cached / "special_tokens_map.json").write_text("{}")  # as a run killed inside save_pretrained leaves it
    _cache_tokenizer(word_tokenizer(8).hf, cached)
    assert (cached / "tokenizer.json").is_file()


def test_an_unwritable_cache_warns_and_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "tokenizers").write_text("a file where the cache directory should be")
    cached = tmp_path / "tokenizers" / "abc"
    with caplog.at_level(logging.WARNING):
        _cache_tokenizer(word_tokenizer(8).hf, cached)
    assert any("could not cache the tokenizer" in r.getMessage() for r in caplog.records)
