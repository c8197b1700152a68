"""Plain ASGI in and out, for the middlewares in front of the apps (guard.py, tool_apis.py): a
bounded body, read once and replayed to the app, and answers sent without a framework."""

from __future__ import annotations

import json
from collections.abc import Iterable

from .envelope import Refused


async def read_body(scope: dict, receive, limit: int, too_large: str | None = None) -> bytes:
    too_large = too_large or f"The request body is larger than {limit // 1024} KiB."
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            if not value.isdigit():
                raise Refused(400, "Content-Length is not a number.")
            if int(value) > limit:
                raise Refused(413, too_large)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refused(400, "The client went away before sending the whole body.")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Refused(413, too_large)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive):
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later: the client's disconnect, as the app would have seen it

    return replay


def with_body_length(scope: dict, length: int) -> dict:
    headers = [(k, v) for k, v in scope.get("headers", []) if k not in (b"content-length", b"transfer-encoding")]
    return {**scope, "headers": headers + [(b"content-length", str(length).encode())]}


# What the guard serves itself of a file (an upload's pixels): never sniffed into another type, never
# run as a document (a sandbox with nothing allowed), not kept by shared caches.
FILE_HEADERS = ((b"x-content-type-options", b"nosniff"), (b"content-security-policy", b"default-src 'none'; sandbox"),
                (b"cache-control", b"private, max-age=3600"))


async def send_json(send, status: int, body: dict, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await send_bytes(send, status, json.dumps(body, ensure_ascii=True).encode(), "application/json", headers)


async def send_bytes(send, status: int, payload: bytes, media_type: str,
                     headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", media_type.encode()), (b"content-length", str(len(payload)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": payload})


def client_address(scope: dict) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "?"


def innermost_frame(e: BaseException) -> str:
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb else "?"
