"""OpenAI's Images API on the same server, as the official `openai` client calls it (base_url):

    POST /v1/images/generations   {prompt, model, n, size, response_format, output_format, ...}
    POST /v1/images/edits         multipart: image, mask (its transparent part is edited), prompt, ...
    GET  /v1/models               the model this server runs, and OpenAI's names for it (MODEL_ALIASES)
    GET  /v1/images/files/{name}  an image answered by URL (response_format "url"), kept an hour

Answers in OpenAI's shapes: {"created", "data": [{"b64_json"} or {"url"}]}, errors as {"error":
{"message", "type", "param", "code"}}, 429 with Retry-After when the queue is full. Beyond
OpenAI's fields a body may carry this server's own (negative_prompt, seed, steps, guidance_scale,
sampler, schedule, rng, strength, masked_content): the same checks as POST /v1/generate.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import logging
import secrets
import threading
import time
from typing import Any

import numpy as np
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..request.errors import RequestError
from ..request.fields import FIELDS
from ..imaging.image_input import decode_image
from ..a1111.images import FORMATS
from ..imaging.resize import nearest_size
from ..request.values import format_size, json_type
from ..server.batcher import QueueFull
from ..request.calls import split
from .many_images import one_call
from ..server.core import Server
from ..server.errors import log_refusal
from .http_io import MAX_BODY_BYTES, checked_request, json_body, logged_status, read_body

log = logging.getLogger("sdxl_tpu.routes.openai_api")

MAX_N = 10  # OpenAI's
KEPT_SECONDS, KEPT_BYTES = 3600, 256 << 20  # images answered by URL: an hour, at most 256 MB of them
# This server's own fields a body may add, by the name POST /v1/generate gives them: every field
# but those OpenAI's own shape carries (its prompt, size, and an edit's image and mask).
OPENAI_SHAPED = ("prompt", "size", "image", "mask")
OWN_FIELDS = tuple(f.api for f in FIELDS if f.api and f.api not in OPENAI_SHAPED)
_KIND = {f.api: f.kind for f in FIELDS if f.api in OWN_FIELDS}
NUMBERS = tuple(name for name, kind in _KIND.items() if kind in ("number", "whole"))
TAKEN = {"model", "prompt", "n", "size", "response_format", "output_format", "user", "quality", "background",
         "moderation", "output_compression", "style", *OWN_FIELDS}
CONTENT_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
# OpenAI's image models by the names chat front ends and plug-ins hard-code: each is the model this
# server runs (a tool that knows no other name still gets images); /v1/models lists them after it.
MODEL_ALIASES = ("dall-e-2", "dall-e-3", "gpt-image-1", "gpt-image-1-mini")


class OpenAIError(RequestError):
    """A request refused, with OpenAI's `param`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


def error_answer(status: int, message: str, param: str | None = None, retry_after: int | None = None) -> Response:
    kind = "rate_limit_error" if status == 429 else "server_error" if status >= 500 else "invalid_request_error"
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status, headers=headers)


class URLImages:
    """Images answered by URL, kept in memory for an hour (the oldest dropped past 256 MB)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.files: collections.OrderedDict[str, tuple[float, bytes]] = collections.OrderedDict()

    def add(self, data: bytes, image_format: str) -> str:
        name = f"{secrets.token_urlsafe(18)}.{image_format}"
        with self.lock:
            self.files[name] = (time.monotonic(), data)
            now, total = time.monotonic(), sum(len(d) for _, d in self.files.values())
            while self.files and (total > KEPT_BYTES or now - next(iter(self.files.values()))[0] > KEPT_SECONDS):
                total -= len(self.files.popitem(last=False)[1][1])
        return name

    def get(self, name: str) -> bytes | None:
        with self.lock:
            kept = self.files.get(name)
        return None if kept is None or time.monotonic() - kept[0] > KEPT_SECONDS else kept[1]


def openai_routes(server: Server) -> list[Route]:
    """The OpenAI Images API routes of `server`."""
    kept = URLImages()

    def fields_of(data: dict[str, Any], edit: bool = False) -> tuple[dict[str, Any], int, str, str]:
        unknown = sorted(set(data) - TAKEN - ({"image", "mask"} if edit else set()))
        if unknown:
            raise OpenAIError(f"Unknown parameter: '{unknown[0]}'.", unknown[0])
        model = data.get("model")
        if model not in (None, server.offer.model, *MODEL_ALIASES):
            raise OpenAIError(f"The model '{model}' does not exist here; this server runs '{server.offer.model}' "
                              f"(also by OpenAI's names: {', '.join(MODEL_ALIASES)}).", "model", 404)
        if not isinstance(data.get("prompt"), str) or not data["prompt"].strip():
            raise OpenAIError("prompt is required: a text of what to draw.", "prompt")
        n = data.get("n", 1)  # (an edit's, sent as text, read_edit made a number)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
            raise OpenAIError(f"n must be a whole number from 1 to {MAX_N}, got {json_type(n)}.", "n")
        answer = "b64_json" if data.get("response_format") is None else data["response_format"]
        if answer not in ("b64_json", "url"):
            raise OpenAIError("response_format must be 'b64_json' or 'url'.", "response_format")
        image_format = "png" if data.get("output_format") is None else data["output_format"]
        if not isinstance(image_format, str) or image_format not in FORMATS:
            raise OpenAIError(f"output_format must be one of {', '.join(FORMATS)}.", "output_format")
        for name, taken in (("quality", ("auto", "standard")), ("background", ("auto", "opaque")),
                            ("style", ("natural",))):
            if data.get(name) not in (None, *taken):
                raise OpenAIError(f"{name} '{data[name]}' cannot be honoured here; {', '.join(taken)} can.", name)
        fields = {"prompt": data["prompt"], **{k: data[k] for k in OWN_FIELDS if k in data}}
        for name in NUMBERS:  # (one number each: no lists here)
            if isinstance(fields.get(name), (list, dict)):
                raise OpenAIError(f"{name} must be a number, got {json_type(fields[name])}.", name)
        size = data.get("size")
        if size not in (None, "auto"):
            fields["size"] = size
        return fields, n, answer, image_format

    async def answer(http: HTTPRequest, fields: dict[str, Any], n: int, answer: str, image_format: str) -> dict:
        request, _ = await asyncio.to_thread(checked_request, fields, server)
        data = []
        for one in split(request, n, server.offer.images_per_call):
            made = await one_call(server, http, one, image_format)
            server.metrics.count_images(len(made.files), made.timings.get("encoding", 0.0))
            for blob in made.files:
                data.append({"b64_json": base64.b64encode(blob).decode("ascii")} if answer == "b64_json" else
                            {"url": f"{str(http.base_url).rstrip('/')}/v1/images/files/{kept.add(blob, image_format)}"})
        return {"created": int(time.time()), "data": data, "output_format": image_format,
                "size": format_size(request.size)}

    async def run(http: HTTPRequest, read) -> Response:
        if server.warmup.status in ("loading", "error"):
            return error_answer(503, server.warmup.message, retry_after=5)
        try:
            with server.metrics.counted(time.monotonic(), http.url.path):
                result = await answer(http, *await read(http))
        except OpenAIError as e:
            log_refusal(http.url.path, e)
            return error_answer(e.status, str(e), e.param)
        except Exception as e:  # noqa: BLE001 (every failure is an answer)
            status, message, retry = logged_status(e, http.url.path, log, "an OpenAI API generation")
            status = 429 if isinstance(e, QueueFull) else status  # (OpenAI's "slow down")
            return error_answer(400 if status == 422 else status, message, retry_after=retry)
        return JSONResponse(result)

    async def read_generation(http: HTTPRequest):
        return fields_of(json_body(await read_body(http)))

    async def read_edit(http: HTTPRequest):
        if not http.headers.get("content-type", "").startswith("multipart/form-data"):
            raise OpenAIError("An edit is sent as multipart/form-data: image, mask, prompt, ...")
        declared = http.headers.get("content-length")
        if declared is None or not declared.isdigit() or int(declared) > MAX_BODY_BYTES:
            raise OpenAIError(f"The request body must declare its length, at most {MAX_BODY_BYTES:,} bytes.", None, 413)
        try:
            form = await http.form(max_files=3, max_fields=40, max_part_size=MAX_BODY_BYTES)
        except Exception as e:  # noqa: BLE001 (a malformed body: the parser's message)
            raise OpenAIError(f"The multipart body could not be read: {str(e)[:200]}") from None
        data: dict[str, Any] = {}
        for key, value in form.multi_items():
            key = key[:-2] if key.endswith("[]") else key
            if key in data:
                raise OpenAIError(f"One {key} is taken here.", key)
            data[key] = value if isinstance(value, str) else await value.read()
        for key, value in list(data.items()):  # (a form's values are text: read as each field's kind)
            kind = "whole" if key == "n" else _KIND.get(key)
            if not isinstance(value, str):
                continue
            if kind == "whole" and value.lstrip("-").isdigit():
                data[key] = int(value)
            elif kind == "switch" and value in ("true", "false"):
                data[key] = value == "true"
            elif kind == "number":
                try:
                    data[key] = float(value)
                except ValueError:
                    raise OpenAIError(f"{key} must be a number.", key) from None
        if not isinstance(data.get("image"), bytes):
            raise OpenAIError("image is required: the image file to edit.", "image")
        fields, n, answer_as, image_format = fields_of(data, edit=True)
        image = await asyncio.to_thread(decode_image, data["image"], "image")
        fields.update(image=data["image"], strength=fields.get("strength", 1.0 if data.get("mask") else 0.75))
        if "size" not in fields:
            fields["size"] = format_size(nearest_size(image.size, server.offer.sizes))
        if data.get("mask") is not None:
            fields["mask"] = await asyncio.to_thread(edited_area, data["mask"], image.size)
            fields.setdefault("masked_content", "fill")
        return fields, n, answer_as, image_format

    async def generations(http: HTTPRequest) -> Response:
        return await run(http, read_generation)

    async def edits(http: HTTPRequest) -> Response:
        return await run(http, read_edit)

    async def models(http: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                         "owned_by": "sdxl-tpu"}
                                                        for name in (server.offer.model, *MODEL_ALIASES)]})

    async def files(http: HTTPRequest) -> Response:
        name = http.path_params["name"]
        data = kept.get(name)
        if data is None:
            return error_answer(404, "No such image (images answered by URL are kept an hour).")
        return Response(data, media_type=CONTENT_TYPES[name.rsplit(".", 1)[1]],
                        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "private, max-age=3600"})

    return [Route("/v1/images/generations", generations, methods=["POST"]),
            Route("/v1/images/edits", edits, methods=["POST"]), Route("/v1/models", models, methods=["GET"]),
            Route("/v1/images/files/{name}", files, methods=["GET"])]


def edited_area(data: bytes, size: tuple[int, int]) -> np.ndarray:
    """OpenAI's mask (the image's size; where it is transparent, the image is edited) as this
    server's: (H, W) uint8, 255 where the image is repainted."""
    mask = decode_image(data, "mask", keep_alpha=True)
    if mask.size != size:
        raise OpenAIError(f"mask is {mask.width}x{mask.height} pixels but the image is {size[0]}x{size[1]}: they "
                          "must be the same size.", "mask")
    if mask.mode != "RGBA":
        raise OpenAIError("mask must have transparency (an alpha channel): its transparent part is edited.", "mask")
    return np.where(np.asarray(mask.getchannel("A")) < 128, 255, 0).astype(np.uint8)

__all__ = ["openai_routes"]
