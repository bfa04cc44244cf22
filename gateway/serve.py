"""`draftgate serve`: load the policy's models, then serve the OpenAI API with one uvicorn worker
(the model lives in the process, so more workers would each load it and share nothing)."""

from __future__ import annotations

import errno
import logging
import socket
import sys

from gateway.app import create_app
from gateway.auth import KeyCheck, NoKeysError
from gateway.state import GatewayState
from policies.loader import load_policy, policy_source

log = logging.getLogger(__name__)


class PortInUseError(OSError):
    """The address to serve on cannot be bound (taken, or no such host): said before the models load."""


def url_host(host: str) -> str:
    """The host as a URL writes it: a wildcard as loopback, an IPv6 address in brackets."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"[{shown}]" if ":" in shown else shown


def check_port_free(host: str, port: int) -> None:
    """Bind and release the address as uvicorn will (SO_REUSEADDR), or raise PortInUseError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:  # socket.gaierror (an unknown host) is an OSError too
            hint = " (another draftgate running? pick another with --port)" if exc.errno == errno.EADDRINUSE else ""
            raise PortInUseError(f"cannot serve on {host}:{port}: {exc.strerror or exc}{hint}") from exc


def serve(policy_path: str | None, host: str, port: int) -> int:
    import uvicorn

    policy = load_policy(policy_path)
    try:  # loading the models takes a while: fail first, naming the file
        keys = KeyCheck.from_policy(policy.auth)
    except NoKeysError as exc:
        raise NoKeysError(f"{policy_source(policy_path)}: auth: {exc}") from None
    check_port_free(host, port)
    print(f"draftgate: loading {', '.join(r.model for r in policy.routes)} ...", file=sys.stderr, flush=True)
    state = GatewayState.build(policy, keys)
    if state.keys.dev:
        print("draftgate: dev mode: no API key configured, any key is accepted", file=sys.stderr)
        if host not in ("127.0.0.1", "localhost", "::1"):
            print(f"draftgate: WARNING: serving {host} in dev mode: anyone who can reach this port can use it; "
                  "set auth.keys in the policy or $DRAFTGATE_API_KEYS", file=sys.stderr)
    shown = url_host(host)
    config = uvicorn.Config(create_app(policy, state), host=host, port=port, workers=1, log_level="warning",
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)

    original_startup = server.startup

    async def startup(sockets: object = None) -> None:
        await original_startup(sockets)  # type: ignore[arg-type]
        if server.started:
            models = ", ".join(r.model for r in policy.routes)
            bound = [s.getsockname()[1] for srv in server.servers for s in (srv.sockets or ())]
            actual = bound[0] if bound else port  # --port 0: the port the system chose
            print(f"draftgate: serving {models} at http://{shown}:{actual}/v1  (OpenAI base URL; "
                  f"try: curl http://{shown}:{actual}/v1/models)", file=sys.stderr, flush=True)

    server.startup = startup  # type: ignore[method-assign]
    server.run()
    return 0
