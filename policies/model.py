"""The policy file's settings as typed records; the loader checks a file against these fields.

A field with a default is optional; one without is required. `__post_init__` checks values: a
ValueError there becomes a PolicyError naming the file and line of the record, or of the field itself
when the message starts with that field's name ("backend must be one of ..."); a `FieldError` names a
value deeper inside the record by its path (`routes[1].model`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from decoding.build import DRAFTER_NAMES
from decoding.constraints.backends import BACKENDS
from decoding.constraints.bounds import Bounds
from decoding.errors import ModelLoadError
from decoding.loading import DTYPE_NAMES, EMBEDDED, resolve_dtype


class FieldError(ValueError):
    """A record's check that blames one value inside it: `path` from the record down (("routes", 1, "model"))."""

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.path = path


def _check_model_path(name: str, spec: str) -> None:
    """A model given by path must be there when the policy is read, not fail later as something else."""
    if spec != EMBEDDED and not Path(spec).expanduser().exists():
        raise ValueError(f"{name} {spec!r}: no such model file or directory")


@dataclass(frozen=True)
class Speculative:
    enabled: bool = True
    max_draft_tokens: int = 8  # a bound: fit_to_machine drafts fewer where bigger passes do not pay here
    draft_tree: bool = True  # a draft head drafts a tree of alternatives per pass, else one chain
    # the draft also drafts sampled requests (temperature > 0), behind prompt lookup; else lookup alone does
    sampled_draft: bool = False
    sampled_tree: bool = False  # with draft_tree, under sampling too (drawn from q; implies sampled_draft)
    fit_to_machine: bool = True  # measure this machine's pass costs at load (decoding/pass_costs.py)

    def __post_init__(self) -> None:
        if not 1 <= self.max_draft_tokens <= 32:
            raise ValueError(f"max_draft_tokens must be in 1..32, got {self.max_draft_tokens}")


@dataclass(frozen=True)
class Constraints:
    backend: str = "outlines"
    allow_validate_after: bool = False
    compile_timeout_s: float = 60.0
    bounds: Bounds | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not 0 < self.compile_timeout_s < math.inf:  # nan compares false: refused too
            raise ValueError(f"compile_timeout_s must be a finite number > 0, got {self.compile_timeout_s}")


@dataclass(frozen=True)
class LocalRoute:
    target: str = EMBEDDED
    draft: str | None = None  # None or "embedded": the draft draftgate ships for an embedded target
    drafters: list[str] = field(default_factory=lambda: ["grammar", "ngram", "draft"])
    dtype: str = "auto"
    speculative: Speculative = field(default_factory=Speculative)
    constraints: Constraints = field(default_factory=Constraints)

    def __post_init__(self) -> None:
        for i, name in enumerate(self.drafters):
            if name not in DRAFTER_NAMES:
                raise FieldError(("drafters", i), f"unknown drafter {name!r} (known: {', '.join(DRAFTER_NAMES)})")
            if name in self.drafters[:i]:
                raise FieldError(("drafters", i), f"drafter {name!r} is listed twice")
        try:
            resolve_dtype(self.dtype)
        except ModelLoadError as exc:
            raise ValueError(f"dtype must be one of {DTYPE_NAMES}, got {self.dtype!r}") from exc
        _check_model_path("target", self.target)
        if self.draft is not None:
            _check_model_path("draft", self.draft)
        if "draft" in self.drafters and self.draft is None and self.target != EMBEDDED:
            raise ValueError("drafter 'draft' needs a draft model for this target: set 'draft'")


@dataclass(frozen=True)
class UpstreamRoute:
    litellm_model: str
    api_base: str | None = None
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        if self.api_base is not None and not self.api_base.startswith(("http://", "https://")):
            raise ValueError(f"api_base must be an http:// or https:// URL, got {self.api_base!r}")
        if "/" not in self.litellm_model and not _litellm_knows(self.litellm_model):
            raise ValueError(f"litellm_model {self.litellm_model!r} names no provider: write it as provider/model "
                             "(openai/<model> for any OpenAI-compatible server at api_base)")


def _litellm_knows(model: str) -> bool:
    """Whether litellm resolves a bare model name (gpt-4o-mini) to a provider; imported only for those."""
    import os

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price list at import
    import litellm

    litellm.suppress_debug_info = True
    try:
        litellm.get_llm_provider(model)
    except Exception:  # litellm.BadRequestError: "LLM Provider NOT provided"
        return False
    return True


@dataclass(frozen=True)
class Route:
    model: str
    local: LocalRoute | None = None
    upstream: UpstreamRoute | None = None

    def __post_init__(self) -> None:
        if not self.model.strip():
            raise ValueError("model must be a non-empty name (what requests put in 'model')")
        if (self.local is None) == (self.upstream is None):
            raise ValueError(f"route {self.model!r} needs exactly one of 'local' or 'upstream'")


@dataclass(frozen=True)
class Server:
    max_queue: int = 32  # requests a local route holds (being prepared or waiting); one more is answered 429
    request_timeout_s: float = 600.0  # queue wait plus generation, per request
    max_body_bytes: int = 4_000_000

    def __post_init__(self) -> None:
        if self.max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {self.max_queue}")
        if not 0 < self.request_timeout_s < math.inf:  # nan compares false: refused too
            raise ValueError(f"request_timeout_s must be a finite number > 0, got {self.request_timeout_s}")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")


@dataclass(frozen=True)
class Auth:
    """Who may call. Keys come from `keys` and from the environment variable `keys_env` (comma-separated).
    With no key configured, `dev: true` accepts any request (what local development wants); `dev: false`
    refuses to start."""

    keys: list[str] = field(default_factory=list)
    keys_env: str = "DRAFTGATE_API_KEYS"
    dev: bool = False


@dataclass(frozen=True)
class Policy:
    version: int
    routes: list[Route]
    server: Server = field(default_factory=Server)
    auth: Auth = field(default_factory=Auth)

    def __post_init__(self) -> None:
        if self.version != 1:
            raise ValueError(f"version {self.version} is not supported (this draftgate reads version 1)")
        if not self.routes:
            raise ValueError("routes is empty: the gateway would serve no model")
        names = [r.model for r in self.routes]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise FieldError(("routes", i, "model"),
                                 f"model {name!r} is routed twice (first at routes[{names.index(name)}])")

    def route(self, model: str) -> Route | None:
        return next((r for r in self.routes if r.model == model), None)
