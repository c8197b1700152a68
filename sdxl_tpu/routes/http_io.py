"""HTTP in and out for the JSON routes (the back end's own and AUTOMATIC1111's): a bounded body,
the back end's fields as one checked Request, refusals and the status of what stopped a request."""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse

from ..request.errors import Cancelled, RequestError
from ..request.fields import FIELDS
from ..imaging.image_input import MAX_BASE64_CHARS
from ..request.control import MAX_UNITS
from ..a1111.images import FORMATS
from ..a1111.infotext import parse as parse_parameters, request_fields, usable
from ..request.request import Request
from ..request.styles import MAX_STYLED_PROMPT_CHARS
from ..request.values import json_type, shown
from ..server.batcher import QueueFull, ShuttingDown, StillCompiling
from ..server.core import Server
from ..server.errors import log_refusal

# A generation's JSON keys: the form's fields by their API names (request/fields.py), an A1111
# parameters text, whether a mask comes blurred already (a front end forwards its requests' masks
# so: remote.request_json), how many images to make (left out: as many as a call makes) and their
# file format (left out: the server's --image-format).
JSON_KEYS = (*(f.api for f in FIELDS if f.api), "mask_blurred", "parameters", "count", "format", "controlnet")
# The longest fields as json.dumps escapes them (12 bytes for an emoji): two styled prompts of some
# 20,300 characters (a front end's request), about 490 kB, or a parameters text of 60,000 (720 kB);
# and a starting image, its mask and each ControlNet unit's image of at most 16 MB each, as base64.
MAX_BODY_BYTES = (1 << 20) + (2 + MAX_UNITS) * MAX_BASE64_CHARS
RETRY_AFTER = {"busy": 1, "draining": 1, "loading": 5}  # seconds, for 503s


class Refused(RequestError):
    """A request refused before it is read as fields: the body itself is wrong (status code)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def error_response(status: int, message: str, retry_after: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def read_body(http: HTTPRequest, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, refused (413) past `limit` bytes without reading the rest."""
    declared = http.headers.get("content-length")
    too_large = Refused(413, f"The request body is over {limit:,} bytes: a generation request is a JSON object of "
                             "text fields and at most two images (a starting image and its mask) of 16 MB each, as "
                             "base64.")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise too_large
    body = bytearray()
    try:
        async for chunk in http.stream():
            body += chunk
            if len(body) > limit:
                raise too_large
    except ClientDisconnect:
        raise Cancelled("the caller left while sending the request") from None
    return bytes(body)


def json_body(body: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object (400 otherwise)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:  # (UnicodeDecodeError is a ValueError)
        message = e.msg if isinstance(e, json.JSONDecodeError) else "not valid UTF-8 JSON" if isinstance(
            e, UnicodeDecodeError) else "nested too deeply"
        raise Refused(400, f"The request body must be a JSON object: {message}.") from None
    if not isinstance(data, dict):
        raise Refused(400, f"The request body must be a JSON object, got {json_type(data)}.")
    return data


def parse_request(body: bytes, server: Server) -> tuple[Request, list[str], str | None]:
    """The body as one checked Request (fields named as Pipeline.generate's arguments), notes on
    what an A1111 `parameters` text said that is not used (see `checked_request`), and the file
    format asked for (None: the server's)."""
    data = json_body(body)
    unknown = [key for key in data if key not in JSON_KEYS]
    if unknown:
        raise Refused(422, f"Unknown field {shown(unknown[0])}; the fields are: {', '.join(JSON_KEYS)}.")
    image_format = data.pop("format", None)
    if image_format is not None and (not isinstance(image_format, str) or image_format not in FORMATS):
        raise Refused(422, f"The field 'format' must be one of {', '.join(FORMATS)}, got {shown(image_format)}.")
    return *checked_request(data, server), image_format


def checked_request(data: dict[str, Any], server: Server) -> tuple[Request, list[str]]:
    """The back end's fields as one checked Request, and notes: fields given explicitly win over an
    A1111 `parameters` text, what is left out takes the server's defaults (the launch preset's steps
    and guidance, the offer's sampler, Schedule type and RNG). A seed left out, null or -1 is drawn
    at random. The Schedule type is checked with the sampler that runs."""
    offer, notes = server.offer, []
    if "parameters" in data:
        pasted, notes = request_fields(parse_parameters(data.pop("parameters")), offer.sizes, offer.samplers,
                                       offer.upscalers)
        data = {**usable(pasted, data), **data}
    if "prompt" not in data:
        raise Refused(422, "The field 'prompt' is required.")
    server.warmup.check_size(data.get("size"))
    blurred = data.pop("mask_blurred", False)
    if not isinstance(blurred, bool):
        raise Refused(422, f"The field 'mask_blurred' must be true or false, got {json_type(blurred)}.")
    # Left out (an optional field: or null), the server's default; a random seed; no negative prompt.
    fallback = {**offer.defaults(), "negative": "", "seed": None}
    left_out = lambda f: f.api not in data or (f.optional and data[f.api] is None)  # noqa: E731
    given: dict[str, Any] = {f.api: fallback.get(f.name) if left_out(f) else data[f.api]
                             for f in FIELDS if f.api and f.api != "prompt"}
    return Request.of(data["prompt"], **given, sizes=offer.sizes, samplers=offer.samplers, mask_blurred=blurred,
                      count=data.get("count"), max_chars=MAX_STYLED_PROMPT_CHARS, controlnet=data.get("controlnet"),
                      controlnets=offer.controlnets, ip_adapters=offer.ip_adapters, upscalers=offer.upscalers,
                      wildcards=server.wildcards), notes


def logged_status(error: BaseException, path: str, log: logging.Logger, what: str) -> tuple[int, str, int | None]:
    """status_of(error), logged as every route logs what stopped a request: a failure of ours (500)
    with its traceback ("`what` failed"), a refusal in one line (called in the `except` block)."""
    status, message, retry = status_of(error)
    if status == 500:
        log.exception("%s failed", what)
    elif isinstance(error, RequestError):
        log_refusal(path, error)
    return status, message, retry


def status_of(error: BaseException) -> tuple[int, str, int | None]:
    """(HTTP status, message, Retry-After) for what stopped a request."""
    if isinstance(error, Refused):
        return error.status, str(error), None
    if isinstance(error, QueueFull):
        return 503, str(error), RETRY_AFTER["busy"]
    if isinstance(error, ShuttingDown):
        return 503, str(error), RETRY_AFTER["draining"]
    if isinstance(error, StillCompiling):  # another host may have the size already
        return 503, str(error), RETRY_AFTER["loading"]
    if isinstance(error, RequestError):
        return 422, str(error), None
    if isinstance(error, Cancelled):  # the caller left, or the drain's deadline passed: another host may serve it
        return 503, "The request was cancelled before its images were ready.", RETRY_AFTER["draining"]
    return 500, "Something went wrong on the server; it has been logged.", None


