"""Everything a running gateway holds, built from its policy: one object, kept on `app.state.gateway`."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from decoding.build import build_engine
from decoding.chat_engine import ChatEngine, ConstraintOptions
from decoding.generate import Engine
from decoding.tokenizer import cache_root
from gateway.auth import KeyCheck
from gateway.local import LocalModel
from gateway.upstream import missing_key
from policies.model import LocalRoute, Policy

log = logging.getLogger(__name__)


def route_engine(route: LocalRoute) -> Engine:
    """A local route's target, and its drafters where its speculation is on."""
    # speculation off: no drafters to load or fit (a request cannot turn it on: gateway/chat.py)
    drafters = tuple(route.drafters) if route.speculative.enabled else ()
    return build_engine(route.target, drafters, route.draft, route.dtype, route.speculative.max_draft_tokens,
                        draft_tree=route.speculative.draft_tree, sampled_tree=route.speculative.sampled_tree,
                        sampled_draft=route.speculative.sampled_draft, fit=route.speculative.fit_to_machine)


def local_model(name: str, route: LocalRoute, policy: Policy) -> LocalModel:
    """Load a local route's target (and draft), ready to serve."""
    c = route.constraints
    options = ConstraintOptions(backend=c.backend, allow_validate_after=c.allow_validate_after, bounds=c.bounds,
                                compile_timeout_s=c.compile_timeout_s, cache_dir=cache_root() / "outlines")
    return LocalModel(name, ChatEngine(route_engine(route), options), policy.server.max_queue,
                      policy.server.request_timeout_s)


@dataclass
class GatewayState:
    policy: Policy
    keys: KeyCheck
    local: dict[str, LocalModel] = field(default_factory=dict)
    started: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def build(cls, policy: Policy, keys: KeyCheck | None = None) -> GatewayState:
        """The gateway for `policy`, its local models loaded; `keys` as the policy's, if already checked."""
        state = cls(policy, keys if keys is not None else KeyCheck.from_policy(policy.auth))
        for route in policy.routes:
            if route.upstream is not None and (unset := missing_key(route.upstream)) is not None:
                log.warning("route %s: $%s is not set; its requests will be refused (503 upstream_key_missing) "
                            "until it is", route.model, unset)
            if route.local is not None:
                started = time.perf_counter()
                state.local[route.model] = local_model(route.model, route.local, policy)
                log.info("loaded %s in %.1f s", route.model, time.perf_counter() - started)
        return state

    def close(self) -> None:
        for model in self.local.values():
            model.close()
