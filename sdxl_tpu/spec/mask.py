"""Inpainting's mask, as AUTOMATIC1111 prepares and applies it; plain PIL and numpy.

    a mask image -> binary (an alpha channel that is not all opaque, else its grey levels; white
    repaints) -> blurred (mask blur, a Gaussian each way) -> fitted to the size as the image is
    -> the latents' mask (downscaled, rounded) and the overlay that keeps the input's pixels
    wherever the blurred mask is black.

The starting image's masked area is first filled from its surroundings ("fill", and under the
latent choices too, as A1111 does); "latent noise" and "latent nothing" then replace the masked
latents on the device (generate/programs.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image, ImageFilter, ImageOps

from .errors import RequestError
from .image_input import decode_image, from_base64
from .resize import fit_image

MASKED_CONTENT = ("fill", "original", "latent noise", "latent nothing")  # A1111's, in its order
DEFAULT_MASKED_CONTENT = "original"
DEFAULT_MASK_BLUR = 4
MAX_MASK_BLUR = 64  # A1111's slider


def mask_input(value: Any, image_size: tuple[int, int], what: str = "Mask") -> Image.Image:
    """A mask as a client gives it (a PIL image, an (H, W) or (H, W, 3|4) uint8 array, a file's
    bytes or base64), the size of the image it masks, as a binary "L" image: A1111's
    create_binary_mask (an alpha channel that is not all opaque is the mask, cut at 128; else the
    grey levels)."""
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8 or value.ndim not in (2, 3) or (value.ndim == 3 and value.shape[2] not in (1, 3, 4)):
            raise RequestError(f"{what} as an array must be (height, width) or (height, width, 3 or 4) uint8, got "
                               f"{value.shape} {value.dtype}.")
        value = Image.fromarray(value[..., 0] if value.ndim == 3 and value.shape[2] == 1 else value)
    elif not isinstance(value, Image.Image):
        value = decode_image(from_base64(value, what) if isinstance(value, str) else value, what, keep_alpha=True)
    if value.size != tuple(image_size):
        raise RequestError(f"{what} is {value.width}x{value.height} pixels but the image is "
                           f"{image_size[0]}x{image_size[1]}: they must be the same size.")
    if value.mode in ("RGBA", "LA", "PA") and value.getchannel("A").getextrema() != (255, 255):
        return value.getchannel("A").point(lambda x: 255 if x > 128 else 0)
    return value.convert("L")


def gaussian_blur(mask: np.ndarray, sigma: float, axis: int) -> np.ndarray:
    """OpenCV's GaussianBlur along one axis as A1111 calls it (kernel 2 * int(2.5 sigma + 0.5) + 1
    taps, borders reflected without repeating the edge), uint8 in and out; by FFT, so a large
    blur costs no more than a small one."""
    half = int(2.5 * sigma + 0.5)
    taps = np.exp(-np.arange(-half, half + 1) ** 2 / (2 * sigma ** 2))
    taps /= taps.sum()
    x = np.moveaxis(mask.astype(np.float64), axis, -1)
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(half, half)], mode="reflect")
    n = padded.shape[-1] + 2 * half
    full = np.fft.irfft(np.fft.rfft(padded, n) * np.fft.rfft(taps, n), n)[..., 2 * half:2 * half + x.shape[-1]]
    return np.moveaxis(np.clip(np.round(full), 0, 255).astype(np.uint8), -1, axis)


def fit_mask(mask: Image.Image, size: tuple[int, int], resize_mode: str, blur: int) -> np.ndarray:
    """A binary mask at its image's size -> blurred (x, then y, as A1111) and fitted to `size` by
    the image's resize mode: (height, width) uint8, 255 repaints."""
    array = np.asarray(mask, np.uint8)
    if blur > 0:
        array = gaussian_blur(gaussian_blur(array, blur, axis=1), blur, axis=0)
    return np.asarray(fit_image(Image.fromarray(array, "L"), size, resize_mode), np.uint8)


def latent_mask(mask: np.ndarray, factor: int) -> np.ndarray:
    """The fitted mask at the latents' size, (h, w) float32 of 0 and 1 (1 repaints): downscaled as
    A1111 does (PIL's bicubic), then rounded (its mask_round)."""
    h, w = mask.shape[0] // factor, mask.shape[1] // factor
    small = np.asarray(Image.fromarray(mask, "L").resize((w, h), Image.Resampling.BICUBIC), np.float32) / 255
    return np.round(small).astype(np.float32)


def fill(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A1111's "fill": the masked area painted with ever less blurred colours of what surrounds it
    (masking.fill): (H, W, 3) uint8 in and out."""
    rgb, alpha = Image.fromarray(image, "RGB"), ImageOps.invert(Image.fromarray(mask, "L"))
    kept = Image.new("RGBa", rgb.size)
    kept.paste(rgb.convert("RGBA").convert("RGBa"), mask=alpha)
    out = Image.new("RGBA", rgb.size)
    for radius, repeats in ((256, 1), (64, 1), (16, 2), (4, 4), (2, 2), (0, 1)):
        blurred = kept.filter(ImageFilter.GaussianBlur(radius)).convert("RGBA")
        for _ in range(repeats):
            out.alpha_composite(blurred)
    return np.asarray(out.convert("RGB"), np.uint8)


def overlay(result: Image.Image, original: np.ndarray, mask: np.ndarray) -> Image.Image:
    """The result with the original's pixels over it wherever the blurred mask (doubled, as A1111's
    mask_for_overlay) is not full: exactly the original where the mask is black."""
    doubled = Image.fromarray(np.clip(mask.astype(np.float32) * 2, 0, 255).astype(np.uint8), "L")
    kept = Image.new("RGBa", result.size)
    kept.paste(Image.fromarray(original, "RGB").convert("RGBA").convert("RGBa"), mask=ImageOps.invert(doubled))
    out = result.convert("RGBA")
    out.alpha_composite(kept.convert("RGBA"))
    return out.convert("RGB")


__all__ = ["DEFAULT_MASKED_CONTENT", "DEFAULT_MASK_BLUR", "MASKED_CONTENT", "MAX_MASK_BLUR", "fill", "fit_mask",
           "gaussian_blur", "latent_mask", "mask_input", "overlay"]
