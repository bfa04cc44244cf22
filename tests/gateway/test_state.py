"""Loading a policy's local routes."""

from __future__ import annotations

import pytest

from gateway.state import route_engine
from policies.loader import parse_policy

POLICY = """\
version: 1
auth: {dev: true}
routes:
  - model: plain
    local: {target: embedded, draft: embedded, drafters: [grammar, ngram, draft], speculative: {enabled: %s}}
"""


@pytest.mark.parametrize("enabled", [False, True])
def test_a_route_with_speculation_off_loads_no_drafter(enabled: bool) -> None:
    # a request cannot turn speculation on where its route has it off, so nothing is loaded or timed for it
    # (the draft head was loaded and the pass costs timed at load, for nothing)
    route = parse_policy(POLICY % str(enabled).lower(), "test.yaml").routes[0].local
    assert route is not None
    assert (route_engine(route).drafter is not None) == enabled
