"""The front end's client of the back ends (sdxl_tpu.server.remote.Backend) against a scripted fake back
end on 127.0.0.1: what it retries (503 + Retry-After, a stream that breaks off, a refused
connection), what it passes on (a 4xx's message), when it gives up, and that it stops when the
caller has gone."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sdxl_tpu.server.remote import Backend, Unavailable
from sdxl_tpu.request.errors import Cancelled, RequestError
from sdxl_tpu.request.request import Request
from served_app import free_port

JPEG = b"\xff\xd8\xff\xe0fake jpeg"
RESULT = {"images": [base64.b64encode(JPEG).decode()] * 4, "parameters": ["p"] * 4, "seeds": [5, 6, 7, 8],
          "sampler": "Euler", "schedule": "Karras", "rng": "CPU", "format": "jpeg",
          "timings": {"text_encoding": 0.1, "denoising": 0.2, "decoding": 0.3, "total": 0.6, "encoding": 0.01}}


def sse(*events: tuple[str, dict]) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


class FakeBackend:
    """Answers POST /v1/generate from `script`, one entry per request: (status, headers, body)
    or "break" (headers and a progress event, then the connection closes mid-stream)."""

    def __init__(self, script: list):
        self.script, self.bodies = list(script), []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                fake.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                entry = fake.script.pop(0)
                if entry == "break":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    self.wfile.write(sse(("progress", {"step": 1, "steps": 2})))
                    self.wfile.flush()
                    self.close_connection = True
                    return
                status, headers, body = entry
                self.send_response(status)
                for key, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def request_():
    return Request.of("a cat", "blurry", seed=5, steps=2, size="64x64", sampler="Euler", schedule="Karras", rng="CPU")


def ok() -> tuple:
    return 200, {"Content-Type": "text/event-stream"}, sse(("progress", {"step": 1, "steps": 2}),
                                                           ("progress", {"step": 2, "steps": 2}), ("result", RESULT))


def test_busy_then_broken_then_served(request_):
    fake = FakeBackend([(503, {"Retry-After": "0"}, b'{"error": "busy"}'), "break", ok()])
    try:
        steps = []
        start = time.monotonic()
        made = Backend(fake.url).generate(request_, progress=lambda i, n: steps.append((i, n)))
        assert time.monotonic() - start < 5
    finally:
        fake.close()
    assert made.files == [JPEG] * 4 and made.seeds == [5, 6, 7, 8] and made.sampler == "Euler"
    assert (made.schedule, made.rng) == ("Karras", "CPU")  # as the back end ran them
    assert made.timings["total"] == 0.6 and (2, 2) in steps
    assert len(fake.bodies) == 3 and all(b == fake.bodies[0] for b in fake.bodies)  # the same request each time
    assert fake.bodies[0] == {"prompt": "a cat", "negative_prompt": "blurry", "seed": 5, "guidance_scale": 5.0,
                              "steps": 2, "size": "64x64", "sampler": "Euler", "schedule": "Karras", "rng": "CPU",
                              "dynamic_prompts": "Random",  # (the prompts are made where the back end runs)
                              "format": "jpeg"}  # (the format asked for: the back end answers in it)


def test_a_refusal_reaches_the_user_as_its_message(request_):
    fake = FakeBackend([(422, {"Content-Type": "application/json"}, b'{"error": "Steps must be a whole number."}')])
    try:
        with pytest.raises(RequestError, match="^Steps must be a whole number.$") as refused:
            Backend(fake.url).generate(request_)
    finally:
        fake.close()
    assert not isinstance(refused.value, Unavailable) and len(fake.bodies) == 1  # not retried


def test_gives_up_after_bounded_tries_and_time(request_):
    fake = FakeBackend([(503, {"Retry-After": "0"}, b"{}")] * 3)
    try:
        with pytest.raises(Unavailable, match="please try again"):
            Backend(fake.url, attempts=3).generate(request_)
    finally:
        fake.close()
    assert len(fake.bodies) == 3
    nobody = Backend(f"http://127.0.0.1:{free_port()}", retry_seconds=1.0)  # refused connections
    start = time.monotonic()
    with pytest.raises(Unavailable):
        nobody.generate(request_)
    assert time.monotonic() - start < 5


def test_a_malformed_answer_is_not_passed_on(request_):
    bad = dict(RESULT, images=[base64.b64encode(b"<html>not an image</html>").decode()] * 4)
    unsaid = {k: v for k, v in RESULT.items() if k != "schedule"}  # (what ran must be said)
    fake = FakeBackend([(200, {"Content-Type": "text/event-stream"}, sse(("result", bad))),
                        (200, {"Content-Type": "text/event-stream"}, sse(("result", unsaid))), ok()])
    try:
        made = Backend(fake.url).generate(request_)
    finally:
        fake.close()
    assert made.files == [JPEG] * 4 and len(fake.bodies) == 3  # the third back end's answer


def test_stops_when_the_caller_has_gone(request_):
    fake = FakeBackend([(503, {"Retry-After": "3"}, b"{}")])
    gone = threading.Event()
    threading.Timer(0.3, gone.set).start()
    try:
        start = time.monotonic()
        with pytest.raises(Cancelled):
            Backend(fake.url).generate(request_, abandoned=gone.is_set)
        assert time.monotonic() - start < 2  # not the 3 s Retry-After
    finally:
        fake.close()


def test_previews_are_relayed_and_a_malformed_one_is_not(request_):
    """The back end's preview events reach the caller as JPEG files; a preview that is not one is
    a malformed answer (another back end is asked), never handed on."""
    preview = {"step": 1, "steps": 2, "images": [base64.b64encode(JPEG).decode()] * 4}
    bad = dict(preview, images=[base64.b64encode(b"<script>").decode()])
    good = sse(("progress", {"step": 1, "steps": 2}), ("preview", preview), ("result", RESULT))
    fake = FakeBackend([(200, {"Content-Type": "text/event-stream"}, sse(("preview", bad))),
                        (200, {"Content-Type": "text/event-stream"}, good)])
    try:
        seen = []
        made = Backend(fake.url).generate(request_, preview=lambda i, n, files: seen.append((i, n, files)))
    finally:
        fake.close()
    assert seen == [(1, 2, [JPEG] * 4)] and made.files == [JPEG] * 4 and len(fake.bodies) == 2


def test_a_starting_image_travels_to_the_back_end_as_it_will_run():
    """A request from an image reaches the back end with the image already fitted (lossless PNG as
    base64) and its strength: the back end's request is the front end's, pixels included."""
    import numpy as np

    from sdxl_tpu.routes.http_io import parse_request
    from sdxl_tpu.server.offer import provisional
    from sdxl_tpu.server.settings import Settings
    from sdxl_tpu.request.load import LoadOptions

    pixels = np.random.default_rng(1).integers(0, 256, (48, 128, 3), np.uint8)
    request = Request.of("a cat", seed=5, steps=4, size="64x64", sampler="Euler", image=pixels,
                         resize_mode="Resize and fill", strength=0.4)
    fake = FakeBackend([ok()])
    try:
        Backend(fake.url).generate(request)
    finally:
        fake.close()
    body = fake.bodies[0]
    assert body["strength"] == 0.4 and "resize_mode" not in body

    class Server:  # (what parse_request asks of a back end's server)
        offer = provisional(Settings(load=LoadOptions(model="tiny", sizes=[(64, 64)])))
        wildcards = None  # (its own folder: none)

        class warmup:
            check_size = staticmethod(lambda size: None)

    again, _, _ = parse_request(json.dumps(body).encode(), Server)
    assert again == request
    np.testing.assert_array_equal(again.image, request.image)
