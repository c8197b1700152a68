"""AUTOMATIC1111's Extras for one image (`POST /sdapi/v1/extra-single-image`, its
ExtrasSingleImageRequest): an image upscaled by Lanczos or one of the server's upscaler models
(`--upscalers`), by a factor or to a size (covered, then cropped to it at its centre), as its
postprocessing_upscale does. Face restoration and a second upscaler are not offered here: a request
that turns them on is refused by name. The image is decoded by its content; the answer is a PNG. The
page's Extras tab (page/page_extras.py) runs the same upscale (`extras_upscale`)."""

from __future__ import annotations

import asyncio
import base64
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from PIL import Image
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..a1111.images import postprocessed_png
from ..a1111.png_info import carried_parameters
from ..imaging.hires import SCALE_RANGE
from ..imaging.image_input import decode_image, from_base64
from ..request.errors import RequestError
from ..request.values import choice_input, number_input
from ..server.core import Server
from .http_io import error_response, json_body, logged_status, read_body

log = logging.getLogger("sdxl_tpu.routes.extras")
NONE = "None"  # A1111's upscaler that leaves the image as it is
MAX_SIDE = 8192  # of what an upscale makes (A1111's upscaling_resize_w/h go to 8192)
MAX_PIXELS = 4096 * 4096  # of what an upscale makes: a 1024x1024 image times 4
OFF = {"gfpgan_visibility": 0, "codeformer_visibility": 0, "extras_upscaler_2_visibility": 0, "upscaler_2": NONE}


def upscaler_names(upscalers: tuple[str, ...]) -> tuple[str, ...]:
    """The upscalers an Extras upscale offers besides None, by A1111's names: Lanczos, then the
    server's models (`upscalers`: Offer.upscalers). (The page's Extras menu lists these.)"""
    return ("Lanczos", *upscalers)


def extras_plan(data: dict[str, Any], size: tuple[int, int], upscalers: tuple[str, ...],
                labels: Mapping[str, str] | None = None) -> tuple[str, float, tuple[int, int] | None]:
    """(upscaler, scale, crop) of an Extras request for an image of `size`: the factor A1111's
    postprocessing_upscale applies (resize_mode 1: the larger ratio to upscaling_resize_w/h, then,
    with upscaling_crop, a crop to that size), checked so that what it makes stays within MAX_PIXELS.
    A refusal names a field by its key, or by `labels`' name for it (the page's labels)."""
    for key, off in OFF.items():  # (left out, empty or at A1111's value that turns it off)
        if data.get(key) not in (None, "", off, str(off)):
            raise RequestError(f"{key} is not offered here (no face restoration or second upscaler): leave it "
                               f"at {off!r}.")
    label = lambda key: str((labels or {}).get(key, key))  # noqa: E731
    upscaler = choice_input(data.get("upscaler_1", NONE), label("upscaler_1"), (NONE, *upscaler_names(upscalers)))
    mode = number_input(data.get("resize_mode", 0), "resize_mode", 0, 1, whole=True)
    crop = None
    if mode == 0:
        scale = float(number_input(data.get("upscaling_resize", 2), label("upscaling_resize"), *SCALE_RANGE))
    else:
        width, height = (int(number_input(data.get(f"upscaling_resize_{k}", 512), f"upscaling_resize_{k}", 64,
                                          MAX_SIDE, whole=True)) for k in ("w", "h"))
        scale = max(width / size[0], height / size[1])
        crop_given = data.get("upscaling_crop", True)
        if not isinstance(crop_given, bool):
            raise RequestError("upscaling_crop must be true or false.")
        crop = (width, height) if crop_given else None
    made = math.ceil(size[0] * scale) * math.ceil(size[1] * scale)
    if upscaler != NONE and (made > MAX_PIXELS or max(size) * scale > MAX_SIDE):
        raise RequestError(f"Upscaling {size[0]}x{size[1]} by {scale:g} would make {made:,} pixels; this server "
                           f"makes at most {MAX_PIXELS:,} (4096x4096).")
    return upscaler, scale, crop


def centre_crop(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """A1111's crop after an upscale to cover `size`: the image pasted at the centre of a black canvas of `size`."""
    canvas = Image.new("RGB", size)
    canvas.paste(image, box=(size[0] // 2 - image.width // 2, size[1] // 2 - image.height // 2))
    return canvas


@dataclass(frozen=True)
class Upscaled:
    """What an Extras upscale made: the image as a PNG file, its size, the upscaler, the factor and
    the source image's size."""
    png: bytes
    size: tuple[int, int]
    upscaler: str
    scale: float
    source: tuple[int, int]

    @property
    def info(self) -> str:
        return postprocess_info(self.upscaler, self.scale)


def postprocess_info(upscaler: str, scale: float) -> str:
    """A1111's infotext of a postprocessing upscale."""
    return f"Postprocess upscale by: {scale:g}, Postprocess upscaler: {upscaler}"


def extras_upscale(server: Server, file: bytes, data: dict[str, Any],
                   labels: Mapping[str, str] | None = None) -> Upscaled:
    """An Extras request's upscale of an image `file` (`data`: the request's other fields, as
    ExtrasSingleImageRequest names them), blocking: the route's and the page's Extras tab's one way.
    The PNG keeps the parameters the file carried and says the upscale, as A1111's does.
    A model upscale runs on the device through the engine, which holds the pipeline's lock: it
    waits for the generation call it meets, never runs beside one."""
    image = decode_image(file, "Image")
    source = image.size
    upscaler, scale, crop = extras_plan(data, source, server.offer.upscalers, labels)
    if upscaler != NONE:
        image = server.engine.upscale(image, upscaler, scale)
    if crop is not None and image.size != crop:
        image = centre_crop(image, crop)
    png = postprocessed_png(image, postprocess_info(upscaler, scale), carried_parameters(file))
    return Upscaled(png, image.size, upscaler, scale, source)


def extras_routes(server: Server) -> list[Route]:
    async def extra_single_image(http: HTTPRequest) -> Response:
        try:
            data = json_body(await read_body(http))
            if not isinstance(data.get("image"), str):
                raise RequestError("image must be an image file as base64 text (PNG, JPEG or WebP).")
            file = from_base64(data["image"], "Image")
            made = await asyncio.to_thread(extras_upscale, server, file, data)
        except Exception as e:  # noqa: BLE001 (every failure is an answer)
            return error_response(*logged_status(e, http.url.path, log, "an Extras upscale"))
        return JSONResponse({"html_info": f"<p>{made.info}</p>", "image": base64.b64encode(made.png).decode("ascii")})

    return [Route("/sdapi/v1/extra-single-image", extra_single_image, methods=["POST"])]


__all__ = ["MAX_PIXELS", "Upscaled", "centre_crop", "extras_plan", "extras_routes", "extras_upscale", "upscaler_names"]
