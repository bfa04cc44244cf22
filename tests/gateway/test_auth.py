"""API keys: from the policy and the environment; dev mode only when none is configured."""

from __future__ import annotations

import pytest

from gateway.auth import AuthError, KeyCheck, NoKeysError
from policies.model import Auth


def test_keys_from_the_policy_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEYS", " sk-env-1, sk-env-2 ,")
    check = KeyCheck.from_policy(Auth(keys=["sk-file"], keys_env="MY_KEYS", dev=True))
    assert not check.dev and check.keys == {"sk-file", "sk-env-1", "sk-env-2"}  # keys present: dev is off
    for key in ("sk-file", "sk-env-1", "sk-env-2"):
        check.check(f"Bearer {key}")
    for header in (None, "", "sk-file", "Bearer sk-nope", "Basic sk-file"):
        with pytest.raises(AuthError):
            check.check(header)


def test_dev_mode_accepts_anything_and_no_keys_without_dev_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRAFTGATE_API_KEYS", raising=False)
    dev = KeyCheck.from_policy(Auth(dev=True))
    assert dev.dev
    dev.check(None)
    dev.check("Bearer whatever")
    with pytest.raises(NoKeysError, match="DRAFTGATE_API_KEYS"):
        KeyCheck.from_policy(Auth())


def test_a_non_ascii_key_is_refused_or_matched_not_an_error() -> None:
    """Headers arrive decoded as latin-1; compare_digest refuses non-ASCII str, so keys compare as bytes."""
    check = KeyCheck.from_policy(Auth(keys=["sk-test", "sk-t\u00e9st"]))
    for header in ("Bearer sk-t\u00c3\u00a9st-nope", "Bearer \u00ff", "Bearer sk-t\u00e9s"):
        with pytest.raises(AuthError):
            check.check(header)
    check.check("Bearer sk-t\u00c3\u00a9st")  # the UTF-8 bytes of 'sk-t\u00e9st', as latin-1 text
