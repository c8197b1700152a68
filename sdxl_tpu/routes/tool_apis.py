"""The APIs other tools speak, as routes any of this project's servers mounts (the app, a front
end, a back end): AUTOMATIC1111's /sdapi/v1 (sdapi.py) and OpenAI's Images API (openai_api.py);
and the optional key (--api-key) that those and the MCP server then require.

A request carries the key as their clients send one: a Bearer token (OpenAI's `api_key`, an MCP
client's headers) or HTTP basic whose password is the key (A1111's --api-auth, webuiapi's
set_auth). It is compared in constant time. The page and its /generate stay open (a Space's page
is public), and so do an image answered by URL (its name is the secret) and a back end's own
/v1/generate (for a private network behind a load balancer).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging

from starlette.routing import Route

from .asgi_io import client_address, send_json
from ..server.core import Server
from .openai_api import openai_routes
from .sdapi import PREFIX as SDAPI
from .extras import extras_routes
from .sdapi import sdapi_routes

log = logging.getLogger("sdxl_tpu.http")

# The routes' paths start so (the guard lets them through to their own checks).
PREFIXES = (f"{SDAPI}/", "/controlnet/", "/v1/images/", "/v1/models")
MCP = "/gradio_api/mcp"
KEYED = (f"{SDAPI}/", "/controlnet/", "/v1/images/generations", "/v1/images/edits", "/v1/models", MCP)
OPEN = frozenset([f"{MCP}/schema"])  # (what the tool is, as /gradio_api/info says: the page's API panel reads it)
CHALLENGES = [(b"www-authenticate", b'Bearer realm="sdxl-tpu"'), (b"www-authenticate", b'Basic realm="sdxl-tpu"')]


def tool_api_routes(server: Server) -> list[Route]:
    """AUTOMATIC1111's and OpenAI's routes of `server`."""
    return [*sdapi_routes(server), *extras_routes(server), *openai_routes(server)]


def carries_key(authorization: str, key: str) -> bool:
    """Whether an Authorization header's value carries `key` (Bearer, or basic's password)."""
    scheme, _, credentials = authorization.strip().partition(" ")
    given = credentials.strip()
    if scheme.lower() == "basic":
        try:
            given = base64.b64decode(given, validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    elif scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), key.encode("utf-8"))


class KeyRequired:
    """ASGI middleware: with a key, the keyed routes answer 401 to a request without it, in the
    shape their clients read (OpenAI's error object on /v1, else {"error": message})."""

    def __init__(self, app, key: str | None):
        self.app, self.key = app, key

    async def __call__(self, scope: dict, receive, send) -> None:
        if self.key and scope["type"] == "http" and scope["path"].startswith(KEYED) and scope["path"] not in OPEN:
            authorization = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
            if not carries_key(authorization, self.key):
                said = "no API key" if not authorization else "a wrong API key"
                message = (f"This server's APIs need its API key: the request carried {said}. Send it as "
                           "'Authorization: Bearer KEY' (OpenAI's clients: api_key) or as HTTP basic's password "
                           "(A1111's clients: set_auth).")
                log.info("refused %s %s from %s: %s", scope["method"], scope["path"][:80], client_address(scope),
                         said)
                body = ({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                   "code": "invalid_api_key"}} if scope["path"].startswith("/v1/") else
                        {"error": message})
                await send_json(send, 401, body, CHALLENGES)
                return
        await self.app(scope, receive, send)


__all__ = ["KEYED", "MCP", "PREFIXES", "KeyRequired", "carries_key", "tool_api_routes"]
