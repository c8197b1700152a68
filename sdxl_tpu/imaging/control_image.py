"""A ControlNet's control image, as sd-webui-controlnet prepares one with a preprocessor that needs no
model of its own: the image a client gives, fitted to the compiled size by img2img's resize modes,
then run through the preprocessor (at that size, as its "Pixel Perfect" mode does). Plain PIL,
numpy and OpenCV.

    none    the image as it is: a depth map, lineart, a pose skeleton... the user made elsewhere
    canny   OpenCV's Canny edges (low and high threshold, 1-255; sd-webui-controlnet's 100 and 200)
    invert  white lines on black from black lines on white (sd-webui-controlnet's
            "invert (from white bg & black line)")
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..request.errors import RequestError
from ..request.names import DEFAULT_RESIZE_MODE
from .image_input import image_input
from .resize import fit_image, image_array

PREPROCESSORS = ("none", "canny", "invert")
CANNY_THRESHOLDS = (100, 200)  # sd-webui-controlnet's defaults (its sliders run from 1 to 255)


def canny(image: np.ndarray, low: int = CANNY_THRESHOLDS[0], high: int = CANNY_THRESHOLDS[1]) -> np.ndarray:
    """Canny's edges of an (H, W, 3) uint8 image as white on black, three equal channels, as
    sd-webui-controlnet computes them (cv2.Canny on the RGB image, then to three channels)."""
    import cv2  # (only where an edge map is asked for: OpenCV is large)

    for name, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= 255:
            raise RequestError(f"Canny's {name} threshold must be a whole number from 1 to 255, got {value!r}.")
    if low > high:
        raise RequestError(f"Canny's low threshold ({low}) must not be above its high threshold ({high}).")
    edges = cv2.Canny(np.ascontiguousarray(image, np.uint8), int(low), int(high))
    return np.repeat(edges[:, :, None], 3, axis=2)


def preprocess(image: np.ndarray, preprocessor: str = "none", low: int = CANNY_THRESHOLDS[0],
               high: int = CANNY_THRESHOLDS[1]) -> np.ndarray:
    """`image` (H, W, 3) uint8 through `preprocessor` (PREPROCESSORS)."""
    if preprocessor not in PREPROCESSORS:
        raise RequestError(f"ControlNet preprocessor must be one of {', '.join(PREPROCESSORS)}, got {preprocessor!r}.")
    if preprocessor == "canny":
        return canny(image, low, high)
    return 255 - image if preprocessor == "invert" else image


def control_image(value: Any, size: tuple[int, int], preprocessor: str = "none", *,
                  resize_mode: str = DEFAULT_RESIZE_MODE, low: int = CANNY_THRESHOLDS[0],
                  high: int = CANNY_THRESHOLDS[1]) -> np.ndarray:
    """A client's control image (what image_input takes: PIL, an array, a file's bytes, base64) as
    the ControlNet sees it at `size` (width, height): (H, W, 3) uint8, fitted, then preprocessed."""
    fitted = image_array(fit_image(image_input(value, "ControlNet image"), size, resize_mode))
    return preprocess(fitted, preprocessor, low, high)
