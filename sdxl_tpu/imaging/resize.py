"""A starting image (img2img) fitted to a compiled size, by AUTOMATIC1111's resize modes, and the
compiled size that suits an image best. Plain PIL and numpy: the page, the API and the pipeline
fit images alike.

    Just resize      stretched to the size (the aspect ratio may change)
    Crop and resize  scaled to cover the size, centred, the overflow cut off
    Resize and fill  scaled to fit inside the size, centred, the bands filled by stretching the
                     image's edge rows or columns (outpainting starts here)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from ..request.errors import RequestError
from ..request.names import DEFAULT_RESIZE_MODE, RESIZE_MODES


def _resized(image: Image.Image, width: int, height: int) -> Image.Image:
    return image.resize((width, height), resample=Image.Resampling.LANCZOS)


def fit_image(image: Any, size: tuple[int, int], mode: str = DEFAULT_RESIZE_MODE) -> Image.Image:
    """`image` (PIL, or an (H, W, 3) uint8 array) as an RGB image of `size` (width, height), as
    A1111's images.resize_image fits it (Lanczos; no upscaler model); a greyscale ("L") image, a
    mask, stays greyscale."""
    if mode not in RESIZE_MODES:
        raise RequestError(f"Resize mode must be one of {', '.join(RESIZE_MODES)}, got {mode!r}.")
    im = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image, np.uint8))
    im = im if im.mode == "L" else im.convert("RGB")
    width, height = size
    if mode == "Just resize" or im.size == (width, height):
        return _resized(im, width, height) if im.size != (width, height) else im
    ratio, src_ratio = width / height, im.width / im.height
    covering = mode == "Crop and resize"
    src_w, src_h, x, y = placed(im.size, size, covering)
    resized = _resized(im, src_w, src_h)
    out = Image.new(im.mode, (width, height))
    out.paste(resized, box=(x, y))
    if covering:
        return out
    if ratio < src_ratio:  # bands above and below: the first and last rows, stretched
        fill = height // 2 - src_h // 2
        if fill > 0:
            out.paste(resized.resize((width, fill), box=(0, 0, width, 0)), box=(0, 0))
            out.paste(resized.resize((width, fill), box=(0, resized.height, width, resized.height)),
                      box=(0, fill + src_h))
    elif ratio > src_ratio:  # bands left and right: the first and last columns, stretched
        fill = width // 2 - src_w // 2
        if fill > 0:
            out.paste(resized.resize((fill, height), box=(0, 0, 0, height)), box=(0, 0))
            out.paste(resized.resize((fill, height), box=(resized.width, 0, resized.width, height)),
                      box=(fill + src_w, 0))
    return out


def placed(image_size: tuple[int, int], size: tuple[int, int], covering: bool) -> tuple[int, int, int, int]:
    """Where a fitted image lies in `size`: (width, height, left, top) of the image scaled to cover
    the size (Crop and resize) or to fit inside it (Resize and fill), aspect ratio kept, centred."""
    (width, height), (w, h) = size, image_size
    wide = width / height > w / h if covering else width / height < w / h
    src_w, src_h = (width, h * width // w) if wide else (w * height // h, height)
    return src_w, src_h, width // 2 - src_w // 2, height // 2 - src_h // 2


def new_area_mask(image_size: tuple[int, int], size: tuple[int, int]) -> np.ndarray:
    """Outpainting: the mask (height, width) uint8 of what Resize and fill adds around an image of
    `image_size` fitted to `size`, white (repainted) on the bands, black on the image."""
    src_w, src_h, x, y = placed(image_size, size, covering=False)
    mask = np.full((size[1], size[0]), 255, np.uint8)
    mask[max(y, 0):y + src_h, max(x, 0):x + src_w] = 0
    return mask


def image_array(image: Image.Image) -> np.ndarray:
    """An RGB image as the pipeline takes it: (H, W, 3) uint8."""
    return np.asarray(image.convert("RGB"), np.uint8)


def nearest_size(image_size: tuple[int, int], sizes: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The compiled size whose aspect ratio is nearest the image's (ratios compared in log terms,
    so 2:1 and 1:2 are as far from 1:1); among equals, the one nearest in pixel count."""
    width, height = image_size
    aspect = np.log(width / height)
    return min(sizes, key=lambda s: (round(abs(np.log(s[0] / s[1]) - aspect), 6),
                                     abs(np.log(s[0] * s[1] / (width * height)))))
