"""Raw HTTP to the served app (served_app.py), as a stranger sends it, and the app's log meanwhile:
`Http` sends a request exactly as given (http.client: no normalisation of '..' or '%2e') and checks
every response as it comes (no 5xx, traceback, Python repr or file's content); `refusal` reads a
refused request's message; `AppLog` holds what the log gained since it was made. test_security.py
attacks the app with them, test_tool_apis.py the other tools' APIs."""

from __future__ import annotations

import http.client
import json
import uuid

import pytest

from served_app import get

OWN_SOURCE = "from sdxl_tpu.page.playground import build_app"  # a line of app.py: must never be served


class Http:
    """Raw requests to the app; records every response and checks each one as it comes."""

    def __init__(self, app):
        self.app, self.port, self.count, self.statuses = app, app["port"], 0, {}
        self.forbidden = [app["secret"], OWN_SOURCE, "root:x:0:0"]

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                read_limit: int = 1 << 20) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            headers = dict(headers or {})
            if body is not None:
                headers.setdefault("Content-Type", "application/json")
                headers["Content-Length"] = str(len(body))
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders(body)
            response = conn.getresponse()
            data = response.read(read_limit)
            status = response.status
        finally:
            conn.close()
        self.check(method, path, status, data)
        return status, data

    def check(self, method: str, path: str, status: int, data: bytes) -> None:
        self.count += 1
        self.statuses[status] = self.statuses.get(status, 0) + 1
        text = data.decode("utf-8", "replace")
        where = f"{method} {path[:120]!r} -> {status}: {text[:300]}"
        assert status < 500, where
        assert not any(secret in text for secret in self.forbidden), "a file's content was served: " + where
        assert "Traceback" not in text and " object at 0x" not in text, where
        if self.count % 100 == 0:
            assert get(self.app["url"] + "/healthz")[0] == 200, f"server down after {self.count} requests"

    def join(self, data, fn_index: int, *, session: str | None = None, **extra) -> tuple[int, dict | str]:
        """queue/join, then (if accepted) the session's event stream up to the completion message."""
        session = session or uuid.uuid4().hex
        body = json.dumps({"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None,
                           "trigger_id": None, **extra}).encode()
        status, text = self.request("POST", "/gradio_api/queue/join", body)
        if status != 200:
            return status, refusal(text)
        return status, self.completion(session)

    def completion(self, session: str, event: str | None = None) -> dict:
        """The completion message on `session`'s event stream (of the event with id `event`, where
        given: a session may have sent several)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("GET", f"/gradio_api/queue/data?session_hash={session}")
            response = conn.getresponse()
            assert response.status == 200, response.read()
            for line in response:
                if line.startswith(b"data:"):
                    message = json.loads(line[5:])
                    if message.get("msg") in ("process_completed", "unexpected_error") and event in (
                            None, message.get("event_id")):
                        text = json.dumps(message)
                        self.check("GET", "/gradio_api/queue/data", 200, text.encode())
                        return message
        finally:
            conn.close()
        pytest.fail("the event stream ended without a completion message")


def refusal(text: str) -> str:
    """The message of a refused request: a 422 to a queue call is a failed validation, as Gradio's
    clients read one ({"detail": [{"__type__": "validate", "message": ...}]}); others a plain detail."""
    detail = json.loads(text)["detail"]
    if isinstance(detail, list):
        (entry,) = detail
        assert entry["__type__"] == "validate" and entry["is_valid"] is False, detail
        return entry["message"]
    return detail


class AppLog:
    """The app's log from the moment this is made on, and the malformed inputs sent since: each
    test (each fuzz example) checks what its own inputs added, whatever ran before it."""

    def __init__(self, app):
        self.path, self.inputs = app["log"], 0
        self.start = self.path.stat().st_size

    def lines(self) -> list[str]:
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return f.read().decode("utf-8", "replace").splitlines()

    def assert_quiet(self) -> list[str]:
        """At most two log lines per malformed input, none a traceback or an error."""
        lines = self.lines()
        assert self.inputs > 0
        assert len(lines) <= 2 * self.inputs, f"{len(lines)} log lines for {self.inputs} inputs:\n" + "\n".join(
            lines[-40:])
        assert not [line for line in lines if "Traceback" in line or "ERROR" in line], "\n".join(lines[-40:])
        return lines
