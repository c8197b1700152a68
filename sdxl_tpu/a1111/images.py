"""Images as files with their generation parameters embedded, as AUTOMATIC1111 writes them (so
"what made this?" travels with the file): one place for the CLI, the app and the back end.

PNG carries the parameters in its "parameters" text chunk; JPEG and WebP in the EXIF UserComment
(type UNDEFINED, "UNICODE\\0" and UTF-16BE), as AUTOMATIC1111 writes it with piexif. JPEG at quality
95 is what the app serves by default: a 1024x1024 image encodes in about 10 ms, where PNG takes
140 ms at any compression level.
"""

from __future__ import annotations

import io
import os
import struct
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from .infotext import Stamp, parameters_text
from ..request.request import ImageInfo

if TYPE_CHECKING:
    from PIL import Image

FORMATS = {"jpeg": "jpg", "png": "png", "webp": "webp"}  # format -> file extension
_EXIF_IFD, _USER_COMMENT = 0x8769, 0x9286
_UNICODE = b"UNICODE\0"
_LONG, _UNDEFINED = 4, 7  # TIFF field types


def encode(image: "Image.Image", parameters: str, fmt: str = "png") -> bytes:
    """The image as a file of format `fmt` (jpeg, png, webp) with `parameters` embedded."""
    from PIL.PngImagePlugin import PngInfo

    out = io.BytesIO()
    if fmt == "png":
        meta = PngInfo()
        meta.add_text("parameters", parameters)
        # Level 1: 1.2-1.35x faster than the default (6) at 1024x1024, about 10 % larger.
        image.save(out, "PNG", pnginfo=meta, compress_level=1)
    elif fmt in ("jpeg", "webp"):
        options = {"quality": 95} if fmt == "jpeg" else {"quality": 90, "method": 0}
        image.save(out, fmt.upper(), exif=user_comment_exif(parameters), **options)
    else:
        raise ValueError(f"image format {fmt!r}: use one of {', '.join(FORMATS)}")
    return out.getvalue()


def user_comment_exif(text: str) -> bytes:
    """An EXIF block holding `text` as its UserComment and nothing else, written by hand: Pillow
    would type the field BYTE, which piexif (A1111's reader) returns as a tuple, not the text.

    Little-endian TIFF: IFD0 with one pointer to the Exif IFD, which has one UNDEFINED field."""
    payload = _UNICODE + text.encode("utf-16-be")
    entry = lambda tag, kind, count, value: struct.pack("<HHII", tag, kind, count, value)
    ifd = lambda field: struct.pack("<H", 1) + field + struct.pack("<I", 0)  # one field, no next IFD
    exif_ifd_at = 8 + 18
    tiff = (b"II*\0" + struct.pack("<I", 8) + ifd(entry(_EXIF_IFD, _LONG, 1, exif_ifd_at))
            + ifd(entry(_USER_COMMENT, _UNDEFINED, len(payload), exif_ifd_at + 18)) + payload)
    return b"Exif\0\0" + tiff


def encode_preview(pixels) -> bytes:
    """A live preview ((h, w, 3) uint8) as a small JPEG: no parameters, it is not the image."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=85)
    return out.getvalue()


def png_bytes(pixels) -> bytes:
    """Pixels ((h, w, 3) uint8) as a plain PNG, lossless and quick: an image passed on (a front
    end's starting image to its back end), not a result."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG", compress_level=1)
    return out.getvalue()


def read_parameters(image: "Image.Image") -> str | None:
    """The parameters an image file carries (PNG text chunk or EXIF UserComment), if any."""
    if "parameters" in image.info:
        return image.info["parameters"]
    comment = image.getexif().get_ifd(_EXIF_IFD).get(_USER_COMMENT)
    if isinstance(comment, bytes) and comment.startswith(_UNICODE):
        return comment[len(_UNICODE):].decode("utf-16-be")
    return None


def postprocessed_png(image: "Image.Image", postprocessing: str, parameters: str | None) -> bytes:
    """An Extras result as AUTOMATIC1111 writes it: a PNG keeping the source's generation
    `parameters` (so PNG Info still reads what made it) with `postprocessing` (its
    "Postprocess upscale by: ..." line) in a text chunk of that name."""
    from PIL.PngImagePlugin import PngInfo

    meta = PngInfo()
    if parameters:
        meta.add_text("parameters", parameters)
    meta.add_text("postprocessing", postprocessing)
    out = io.BytesIO()
    image.save(out, "PNG", pnginfo=meta)
    return out.getvalue()


_encoders: ThreadPoolExecutor | None = None
_encoders_lock = threading.Lock()


def encode_all(images: Sequence["Image.Image"], parameters: Sequence[str], fmt: str) -> list[bytes]:
    """One call's images as files of format `fmt`, each with its `parameters` text, encoded in
    parallel (Pillow's encoders release the GIL): what the playground writes and the back end sends."""
    global _encoders
    with _encoders_lock:
        if _encoders is None:
            _encoders = ThreadPoolExecutor(max_workers=8, thread_name_prefix="sdxl-encode")
    return list(_encoders.map(lambda pair: encode(pair[0], pair[1], fmt), zip(images, parameters, strict=True)))


def save_png(image: "Image.Image", info: ImageInfo, path: str | os.PathLike, *, model: Stamp | str) -> None:
    """Write a PNG with the parameters in its "parameters" text chunk."""
    Path(path).write_bytes(encode(image, parameters_text(info, model), "png"))
