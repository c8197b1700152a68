"""ControlNet's control images: the preprocessors that need no model (Canny as sd-webui-controlnet
runs it, invert, as-is), fitted to the size as img2img's image, and bad input refused by name."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
from PIL import Image

from sdxl_tpu import RequestError
from sdxl_tpu.imaging.control_image import canny, control_image, preprocess


def _square(size: int = 96) -> np.ndarray:
    """A grey square on black with a faint (low-contrast) inner square: strong and weak edges."""
    image = np.zeros((size, size, 3), np.uint8)
    image[20:76, 20:76] = 200
    image[40:56, 40:56] = 215
    return image


def test_canny_is_sd_webui_controlnets():
    """sd-webui-controlnet's canny is cv2.Canny(image, low, high) on the RGB image, made three
    channels: the same edges here; white on black, on the square's border and nowhere flat."""
    image = _square()
    edges = canny(image, 100, 200)
    assert edges.shape == image.shape and edges.dtype == np.uint8
    assert (edges[..., 0] == cv2.Canny(image, 100, 200)).all()
    assert (edges[..., 0] == edges[..., 1]).all() and (edges[..., 1] == edges[..., 2]).all()
    assert set(np.unique(edges)) <= {0, 255}
    assert edges[20, 30:60].any() or edges[19, 30:60].any()  # the outer border
    assert not edges[:10].any() and not edges[28:36, 28:36].any()  # flat areas
    # Lower thresholds find the faint inner square too; higher ones fewer edges.
    assert edges[36:60, 36:60].sum() == 0 and canny(image, 5, 10)[36:60, 36:60].any()
    assert canny(image, 200, 255).sum() <= edges.sum()


@pytest.mark.parametrize("low, high, message", [(0, 200, "low threshold"), (100, 256, "high threshold"),
                                                (150, 100, "must not be above"), (1.5, 200, "whole number"),
                                                (True, 200, "whole number")])
def test_bad_thresholds_are_named(low, high, message):
    with pytest.raises(RequestError, match=message):
        canny(_square(), low, high)


def test_invert_none_and_unknown_preprocessor():
    image = _square()
    assert (preprocess(image, "none") == image).all()
    assert (preprocess(image, "invert") == 255 - image).all()
    with pytest.raises(RequestError, match="preprocessor must be one of none, canny, invert"):
        preprocess(image, "openpose")


def test_a_clients_file_is_fitted_then_preprocessed():
    """A PNG file's bytes, 2:1, cropped to cover a square size (A1111's Crop and resize), then edges."""
    wide = np.zeros((64, 128, 3), np.uint8)
    wide[16:48, 48:80] = 255  # a square in the middle, which the crop keeps
    buffer = io.BytesIO()
    Image.fromarray(wide).save(buffer, format="PNG")
    out = control_image(buffer.getvalue(), (64, 64), "canny", resize_mode="Crop and resize")
    assert out.shape == (64, 64, 3)
    assert out[:, 16:48].any() and not out[:, :8].any()
    with pytest.raises(RequestError, match="ControlNet image is not a PNG, JPEG or WebP image"):
        control_image(b"not an image", (64, 64))
