"""An image a client gives (img2img's starting image, a mask, PNG Info's file), decoded by its
content and nothing else: PNG, JPEG or WebP, whatever the name or the declared type says; its
size and pixel count checked from the header before anything is decoded (decompression bombs);
then made the RGB image a person meant, as A1111 makes it: EXIF orientation applied, the first
frame of an animation, transparency flattened onto white, palette, CMYK, greyscale and 16-bit
images converted. What comes back is pixels only: no metadata of the upload travels further.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from typing import Any, BinaryIO

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ..request.errors import RequestError

FORMATS = ("PNG", "JPEG", "WEBP")  # decoded; anything else (SVG, GIF, HTML, ...) is refused
MAX_BYTES = 16 * 2**20  # a 4096x4096 PNG of noise is about 50 MB; a photo's JPEG a few MB
MAX_PIXELS = 4096 * 4096  # checked from the header, before decoding
MIN_SIDE = 8
MAX_BASE64_CHARS = 4 * (MAX_BYTES // 3 + 1)  # MAX_BYTES as base64
BACKGROUND = (255, 255, 255)  # transparency is flattened onto it (A1111's img2img_background_color)
# An image as a request takes it (image_input here, mask.py's mask_input): a PIL image, a uint8 array,
# an image file's bytes or a binary file object, or the file as base64 text (bare or a data: URL;
# text is never a path).
ImageInput = Image.Image | np.ndarray | bytes | bytearray | memoryview | BinaryIO | str


def decode_image(data: Any, what: str = "Image", keep_alpha: bool = False) -> Image.Image:
    """`data` (bytes, or a binary file object) -> an RGB PIL image (`keep_alpha`: RGBA where the
    file has transparency, as a mask's), or a RequestError that names `what` and what is wrong
    with it."""
    if hasattr(data, "read"):
        data = data.read(MAX_BYTES + 1)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RequestError(f"{what} must be an image file (PNG, JPEG or WebP).")
    data = bytes(data)
    if not data:
        raise RequestError(f"{what} is empty.")
    if len(data) > MAX_BYTES:
        raise RequestError(f"{what} is larger than {MAX_BYTES // 2**20} MB.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
            width, height = image.size  # from the header: nothing decoded yet
            if width * height > MAX_PIXELS:
                raise RequestError(f"{what} is {width}x{height} pixels: it has more than {MAX_PIXELS // 10**6} "
                                   "megapixels.")
            if min(width, height) < MIN_SIDE:
                raise RequestError(f"{what} is {width}x{height} pixels; each side must be at least {MIN_SIDE}.")
            image.seek(0)  # an animation's first frame
            image.load()
            return _as_rgb(image, keep_alpha)
    except RequestError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):  # (PIL's own bound, far above ours)
        raise RequestError(f"{what} has more than {MAX_PIXELS // 10**6} megapixels.") from None
    except UnidentifiedImageError:
        raise RequestError(f"{what} is not a PNG, JPEG or WebP image.") from None
    except (OSError, ValueError, SyntaxError, EOFError, IndexError, TypeError, MemoryError):
        raise RequestError(f"{what} could not be read: the file is damaged or truncated.") from None


def image_input(value: Any, what: str = "Image") -> Image.Image:
    """A starting image as a client gives it: a PIL image, an (H, W, 3) uint8 array, an image
    file's bytes, or (in JSON) the file as base64, bare or as a data: URL. Files are decoded by their
    content (`decode_image`), whatever a data: URL's type says."""
    if isinstance(value, Image.Image):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8 or value.ndim != 3 or value.shape[2] != 3 or min(value.shape[:2]) < MIN_SIDE:
            raise RequestError(f"{what} as an array must be (height, width, 3) uint8, got {value.shape} {value.dtype}.")
        return Image.fromarray(value, "RGB")
    if isinstance(value, str):
        value = from_base64(value, what)
    return decode_image(value, what)


def from_base64(text: str, what: str = "Image") -> bytes:
    """An image file sent as base64 text (line breaks allowed; a data: URL's header is skipped)."""
    if len(text) > MAX_BASE64_CHARS + 1024:
        raise RequestError(f"{what} is larger than {MAX_BYTES // 2**20} MB.")
    if text.startswith("data:"):
        header, comma, text = text.partition(",")
        if not comma or not header.endswith(";base64"):
            raise RequestError(f"{what}: a data: URL must hold base64 ('data:image/png;base64,...').")
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{what} must be a PNG, JPEG or WebP file as base64 text.") from None


def _as_rgb(image: Image.Image, keep_alpha: bool = False) -> Image.Image:
    """The decoded image as a person sees it, in RGB (or RGBA), without its metadata."""
    image = ImageOps.exif_transpose(image)
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16-bit greyscale: to 8 bits, not clipped to white
        values = np.asarray(image, np.float64)
        peak = 65535.0 if image.mode != "I" or values.max() > 255 else 255.0
        image = Image.fromarray(np.clip(np.round(values / peak * 255.0), 0, 255).astype(np.uint8), "L")
    elif image.mode == "F":
        image = Image.fromarray(np.clip(np.asarray(image) * 255.0, 0, 255).astype(np.uint8), "L")
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        if keep_alpha:
            return Image.frombytes("RGBA", rgba.size, rgba.tobytes())
        flat = Image.new("RGBA", rgba.size, (*BACKGROUND, 255))
        flat.alpha_composite(rgba)
        image = flat
    out = image.convert("RGB")
    # A fresh image: pixels only, no EXIF, ICC profile, text chunks or XMP from the upload.
    return Image.frombytes("RGB", out.size, out.tobytes())
