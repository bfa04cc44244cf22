"""API keys: from the policy's `auth.keys` and the environment variable it names; dev mode otherwise."""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass

from policies.model import Auth


class AuthError(Exception):
    code = "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.param = None


class NoKeysError(ValueError):
    """No API key configured and dev mode off: the gateway refuses to start open."""


@dataclass(frozen=True)
class KeyCheck:
    keys: frozenset[str]
    dev: bool

    @classmethod
    def from_policy(cls, auth: Auth) -> KeyCheck:
        keys = {k for k in auth.keys if k}
        keys |= {k.strip() for k in os.environ.get(auth.keys_env, "").split(",") if k.strip()}
        if not keys and not auth.dev:
            raise NoKeysError(f"no API keys: set auth.keys in the policy or ${auth.keys_env}, or auth.dev: true")
        return cls(frozenset(keys), dev=not keys)

    def check(self, authorization: str | None) -> None:
        """Raise AuthError unless the `Authorization` header carries a configured key (any, in dev mode)."""
        if self.dev:
            return
        if not authorization or not authorization.lower().startswith("bearer "):
            raise AuthError("missing API key: send 'Authorization: Bearer <key>'")
        # compared as bytes: a header is decoded as latin-1, and compare_digest refuses non-ASCII str
        given = authorization[7:].strip().encode("latin-1", "replace")
        if not any(hmac.compare_digest(given, k.encode()) for k in self.keys):
            raise AuthError("invalid API key")
