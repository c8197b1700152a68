"""A front end's side of the back ends (`python -m sdxl_tpu serve`, usually behind a load
balancer): `Backend` sends each generation there and gets the encoded images back.

Requests are stateless, so a request that could not be served is simply sent again: on a
connection error, a stream that broke off (a back end that died mid-request), or a 502/503/504
(busy, draining, or no back end up: `Retry-After` is honoured), for at most `attempts` tries and
`retry_seconds` in all; then the user is told to try again (`Unavailable`). A 4xx is the user's to
fix and reaches them as the back end's message. Progress arrives as server-sent events, and the
back end's keep-alive comments (every second) let an abandoned request be dropped: closing the
stream cancels it on the back end.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from ..request.errors import Cancelled, RequestError
from ..a1111.images import png_bytes
from ..request.request import Request
from ..request.values import format_size
from .engine import Generated
from .settings import check_backend_url

log = logging.getLogger("sdxl_tpu.server.remote")

UNAVAILABLE = "No image server could take the request (they are busy or unreachable); please try again in a moment."
ATTEMPTS = 8
RETRY_SECONDS = 120.0  # no new attempt starts later than this after the first
MAX_PAUSE = 5.0  # the longest wait between attempts, whatever Retry-After says
# How often a front end asks whether the back ends answer (its readiness follows them).
CHECK_SECONDS = float(os.environ.get("SDXL_REMOTE_CHECK_SECONDS", "5"))
READ_TIMEOUT = 60.0  # a back end sends something every second while it works
MAX_RESPONSE_BYTES = 256 << 20  # four 1024x1024 PNGs in base64 are about 12 MB
MAGIC = {"jpeg": (b"\xff\xd8\xff",), "png": (b"\x89PNG\r\n\x1a\n",), "webp": (b"RIFF",)}


class Unavailable(RequestError):
    """No back end served the request within the retry budget (the user may try again)."""


class BackendFailed(RuntimeError):
    """A back end answered that it failed (HTTP 500): a server-side error, not retried."""


class _Retry(Exception):
    """This attempt did not reach a back end that could serve it; `pause` seconds, if given, is
    what the server asked to wait (Retry-After)."""

    def __init__(self, reason: str, pause: float | None = None):
        super().__init__(reason)
        self.pause = pause


def request_json(request: Request) -> dict[str, Any]:
    """A checked request as `POST /v1/generate` takes it (Pipeline.generate's argument names)."""
    body = {"prompt": request.prompt, "negative_prompt": request.negative_prompt, "seed": request.seed,
            "guidance_scale": request.guidance_scale, "steps": request.steps, "size": format_size(request.size),
            "schedule": request.schedule, "rng": request.rng, "dynamic_prompts": request.dynamic_prompts}
    if request.sampler is not None:
        body["sampler"] = request.sampler
    if request.count is not None:
        body["count"] = request.count
    if request.refiner_switch_at is not None:
        body["refiner_switch_at"] = request.refiner_switch_at
    if request.image is not None:  # (already at the size: the back end's fit leaves it as it is)
        body.update(image=base64.b64encode(png_bytes(request.image)).decode("ascii"), strength=request.strength)
    if request.mask is not None:  # (blurred and fitted already: sent as it is, its blur named for the parameters)
        body.update(mask=base64.b64encode(png_bytes(request.mask)).decode("ascii"), mask_blur=request.mask_blur,
                    masked_content=request.masked_content, mask_blurred=True)
    if request.crop is not None:  # Only masked: the whole image and its blurred mask, cropped and pasted there
        body.update(image=base64.b64encode(png_bytes(request.crop.image)).decode("ascii"),
                    mask=base64.b64encode(png_bytes(request.crop.mask)).decode("ascii"),
                    inpaint_area=request.inpaint_area, mask_padding=request.mask_padding)
    if request.controls:  # (each image processed and at the size: sent as it is, its module named for the parameters)
        body["controlnet"] = [{"model": u.model, "image": base64.b64encode(png_bytes(u.image)).decode("ascii"),
                               "module": u.module, "weight": u.weight, "guidance_start": u.start,
                               "guidance_end": u.end, "guess_mode": u.guess_mode, "resize_mode": u.resize_mode,
                               "preprocessed": True,
                               **({} if u.thresholds is None else dict(zip(("threshold_a", "threshold_b"),
                                                                         u.thresholds)))} for u in request.controls]
    if request.hires is not None:
        h = request.hires
        body.update(hires=True, hires_scale=h.scale, hires_upscaler=h.upscaler, hires_steps=h.steps,
                    hires_strength=h.strength)
    return body


def retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the delay form; a date is ignored)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def never() -> bool:
    return False


class Backend:
    def __init__(self, url: str, *, attempts: int = ATTEMPTS, retry_seconds: float = RETRY_SECONDS,
                 read_timeout: float = READ_TIMEOUT):
        self.url = check_backend_url(url)
        self.attempts, self.retry_seconds = attempts, retry_seconds
        # One pool of connections for every request (keep-alive to the load balancer).
        self._http = httpx.Client(timeout=httpx.Timeout(read_timeout, connect=5.0),
                                  limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))

    def close(self) -> None:
        self._http.close()

    # -- start-up -------------------------------------------------------------------------------

    def describe(self, wait_seconds: float = math.inf) -> dict[str, Any]:
        """GET /v1/info: what the back ends offer (sizes, samplers, ...). Waits until one answers
        (back ends answer once warm), at most `wait_seconds` (0: one try). Raises OSError when
        none did in time."""
        deadline, pause, reason = time.monotonic() + wait_seconds, 0.25, ""
        while True:
            try:
                response = self._http.get(self.url + "/v1/info")
                if response.status_code == 200:
                    return response.json()
                reason = f"HTTP {response.status_code}"
            except (httpx.HTTPError, ValueError) as e:
                reason = f"{type(e).__name__}: {e}"
            if time.monotonic() + pause > deadline:
                raise OSError(f"no answer from GET /v1/info in {wait_seconds:.0f} s (last: {reason})")
            log.info("waiting for the back end at %s (%s)", self.url, reason)
            time.sleep(pause)
            pause = min(2 * pause, MAX_PAUSE)

    # -- one generation -------------------------------------------------------------------------

    def generate(self, request: Request, progress: Callable[[int, int], None] | None = None,
                 abandoned: Callable[[], bool] | None = None, image_format: str = "jpeg",
                 preview: Callable[[int, int, list[bytes]], None] | None = None):
        """The request's images (Generated), made by some back end. Raises RequestError
        with the back end's message for a request it refused, Cancelled when `abandoned()` turned
        true, Unavailable when no back end served it in `attempts` tries or `retry_seconds`.
        `preview(step, steps, files)` is given the back end's live previews (JPEG files)."""
        abandoned = abandoned or never
        body = json.dumps({**request_json(request), "format": image_format}).encode()
        start = time.monotonic()
        reason = ""
        for attempt in range(self.attempts):
            if abandoned():
                raise Cancelled("the caller has gone")
            try:
                return self._attempt(body, progress, abandoned, image_format, preview)
            except _Retry as e:
                reason = str(e)
                pause = min(MAX_PAUSE, e.pause if e.pause is not None else 0.1 * 2 ** attempt)
            log.info("attempt %d of %d at %s did not get the images (%s)", attempt + 1, self.attempts, self.url, reason)
            if attempt + 1 == self.attempts or time.monotonic() + pause - start > self.retry_seconds:
                break
            end = time.monotonic() + pause
            while time.monotonic() < end:  # bounded by `pause`, watching for the caller leaving
                if abandoned():
                    raise Cancelled("the caller has gone")
                time.sleep(min(0.1, max(0.0, end - time.monotonic())))
        log.warning("giving up on a request after %.1f s: %s", time.monotonic() - start, reason)
        raise Unavailable(UNAVAILABLE)

    def _attempt(self, body: bytes, progress: Callable[[int, int], None] | None, abandoned: Callable[[], bool],
                 image_format: str, preview: Callable[[int, int, list[bytes]], None] | None):
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        try:
            with self._http.stream("POST", self.url + "/v1/generate", content=body, headers=headers) as response:
                status = response.status_code
                if status in (502, 503, 504):  # busy, draining, or no back end up: another try
                    raise _Retry(f"HTTP {status}", retry_after(response.headers.get("Retry-After")))
                if status != 200:
                    message = _error_message(response)
                    if 400 <= status < 500:
                        raise RequestError(message)
                    raise BackendFailed(f"the back end answered HTTP {status}: {message}")
                for event, data in _events(response, abandoned):
                    if event == "progress":
                        if progress is not None:
                            progress(int(data["step"]), int(data["steps"]))
                    elif event == "preview":
                        if preview is not None:
                            preview(int(data["step"]), int(data["steps"]), _files(data["images"], "jpeg"))
                    elif event == "result":
                        return _generated(data, image_format)
                    elif event == "error":
                        if data.get("status") == 503:  # cancelled by its drain: another back end will do
                            raise _Retry(f"stopped by the back end: {data.get('error')}", 0.0)
                        if isinstance(data.get("status"), int) and 400 <= data["status"] < 500:
                            raise RequestError(str(data.get("error")))
                        raise BackendFailed(f"the back end failed: {data.get('error')}")
                raise _Retry("the back end's stream ended without the images")
        except httpx.TransportError as e:  # refused, reset, timed out, or broken off mid-stream
            raise _Retry(f"{type(e).__name__}: {e}") from None
        except RequestError:  # the back end's refusal, for the user (a ValueError, but not malformed)
            raise
        except (ValueError, KeyError, TypeError) as e:  # a malformed answer: better another back end
            raise _Retry(f"malformed answer: {e}") from None


def _error_message(response: httpx.Response) -> str:
    """The `error` of a JSON error answer (bounded read), else its status line."""
    text = b""
    for chunk in response.iter_bytes():
        text += chunk
        if len(text) > 65536:
            break
    try:
        message = json.loads(text)["error"]
        if isinstance(message, str):
            return message
    except (ValueError, KeyError, TypeError):
        pass
    return f"HTTP {response.status_code} {response.reason_phrase}"


def _events(response: httpx.Response, abandoned: Callable[[], bool]) -> Iterator[tuple[str, Any]]:
    """Server-sent events as (name, JSON data); checks `abandoned()` at every line (the back end
    sends a comment every second), raising Cancelled, which closes the stream."""
    event, data, received = "message", [], 0
    for line in response.iter_lines():
        received += len(line) + 1
        if received > MAX_RESPONSE_BYTES:
            raise ValueError(f"the answer is over {MAX_RESPONSE_BYTES >> 20} MiB")
        if abandoned():
            raise Cancelled("the caller has gone")
        if not line:
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))


def _files(images: Any, image_format: str) -> list[bytes]:
    """Base64 image files as a back end sends them; ValueError when they are anything else."""
    if not isinstance(images, list) or len(images) > 1024:
        raise ValueError("images must be a list of base64 files")
    files = []
    for text in images:
        try:
            blob = base64.b64decode(text, validate=True)
        except (binascii.Error, TypeError) as e:
            raise ValueError(f"an image is not base64: {e}") from None
        if not blob.startswith(MAGIC[image_format]):
            raise ValueError(f"an image is not a {image_format} file")
        files.append(blob)
    return files


def _generated(data: dict[str, Any], image_format: str):
    """The result event as Generated; ValueError when it is not what a back end sends."""
    files = _files(data["images"], image_format)
    seeds, parameters = data["seeds"], data["parameters"]
    if not files or not (len(files) == len(seeds) == len(parameters)) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ValueError("images, seeds and parameters do not match")
    timings = {k: float(v) for k, v in data["timings"].items()}
    missing = [stage for stage in ("text_encoding", "denoising", "decoding", "total") if stage not in timings]
    if missing:
        raise ValueError(f"timings lack {', '.join(missing)}")
    return Generated(files, [str(p) for p in parameters], seeds, str(data["sampler"]), timings,
                     schedule=str(data["schedule"]), rng=str(data["rng"]), format=image_format)
