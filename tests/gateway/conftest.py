"""Two real gateways on loopback, shared by the client tests (they run the real embedded model):

- `upstream`: the shipped default policy (dev mode), with a queue of one, to be overloaded on purpose;
- `gateway`: API keys on; `smollm2-135m` served locally, `remote-smollm` routed through litellm to
  `upstream` with its key from an environment variable.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.servers import serve

KEY = "sk-draftgate-test"

UPSTREAM = """\
version: 1
auth: {dev: true}
server: {max_queue: 1, request_timeout_s: 120}
routes:
  - model: smollm2-135m
    local: {target: embedded, draft: embedded, drafters: [grammar, ngram, draft]}
"""

GATEWAY = """\
version: 1
auth: {keys: [%s]}
server: {max_queue: 32, request_timeout_s: 300}
routes:
  - model: smollm2-135m
    local:
      target: embedded
      draft: embedded
      drafters: [grammar, ngram, draft]
      speculative: {enabled: true, max_draft_tokens: 8}
      constraints: {backend: outlines, bounds: {string_length: 48, digits: 8, items: 3}}
  - model: remote-smollm
    upstream: {litellm_model: openai/smollm2-135m, api_base: "%s", api_key_env: DRAFTGATE_TEST_UPSTREAM_KEY}
"""


@pytest.fixture(scope="session")
def upstream_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    policy = tmp_path_factory.mktemp("upstream") / "policy.yaml"
    policy.write_text(UPSTREAM)
    with serve(policy) as url:
        yield url


@pytest.fixture(scope="session")
def gateway_url(tmp_path_factory: pytest.TempPathFactory, upstream_url: str) -> Iterator[str]:
    policy = tmp_path_factory.mktemp("gateway") / "policy.yaml"
    policy.write_text(GATEWAY % (KEY, upstream_url))
    with serve(policy, env={"DRAFTGATE_TEST_UPSTREAM_KEY": "any-key-upstream-is-dev"}) as url:
        yield url
