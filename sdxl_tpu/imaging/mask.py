"""Inpainting's mask, as AUTOMATIC1111 prepares and applies it; plain PIL and numpy.

    a mask image -> binary (an alpha channel that is not all opaque, else its grey levels; white
    repaints) -> blurred (mask blur, a Gaussian each way) -> fitted to the size as the image is
    -> the latents' mask (downscaled, rounded) and the overlay that keeps the input's pixels
    wherever the blurred mask is black. (Inpaint area "Only masked": the blurred mask's region,
    padded, cropped from image and mask and fitted to the size; the results pasted back.)

The starting image's masked area is first filled from its surroundings ("fill", and under the
latent choices too, as A1111 does); "latent noise" and "latent nothing" then replace the masked
latents on the device (generate/compiling/programs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageFilter, ImageOps

from ..request.errors import RequestError
from .image_input import decode_image, from_base64
from .resize import fit_image

MASKED_CONTENT = ("fill", "original", "latent noise", "latent nothing")  # A1111's, in its order
DEFAULT_MASKED_CONTENT = "original"
DEFAULT_MASK_BLUR = 4
MAX_MASK_BLUR = 64  # A1111's slider
# Inpaint area: the whole picture at the size, or only the masked part (with padding around it)
# cropped, denoised at the size and pasted back into the image at its own size.
INPAINT_AREAS = ("Whole picture", "Only masked")
DEFAULT_INPAINT_AREA, ONLY_MASKED = INPAINT_AREAS
DEFAULT_MASK_PADDING = 32  # A1111's "Only masked padding, pixels"
MAX_MASK_PADDING = 256  # its slider


def mask_input(value: Any, image_size: tuple[int, int], what: str = "Mask",
               fitted_size: tuple[int, int] | None = None) -> Image.Image:
    """A mask as a client gives it (a PIL image, an (H, W) or (H, W, 3|4) uint8 array, a file's
    bytes or base64), the size of the image it masks (or `fitted_size`: of the image fitted to the
    size to make, as an outpainting's mask of the new area is), as a binary "L" image: A1111's
    create_binary_mask (an alpha channel that is not all opaque is the mask, cut at 128; else the
    grey levels)."""
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8 or value.ndim not in (2, 3) or (value.ndim == 3 and value.shape[2] not in (1, 3, 4)):
            raise RequestError(f"{what} as an array must be (height, width) or (height, width, 3 or 4) uint8, got "
                               f"{value.shape} {value.dtype}.")
        value = Image.fromarray(value[..., 0] if value.ndim == 3 and value.shape[2] == 1 else value)
    elif not isinstance(value, Image.Image):
        value = decode_image(from_base64(value, what) if isinstance(value, str) else value, what, keep_alpha=True)
    if value.size != tuple(image_size) and (fitted_size is None or value.size != tuple(fitted_size)):
        fitted = "" if fitted_size is None else (f" (or the size to make, {fitted_size[0]}x{fitted_size[1]}: a mask "
                                                 "of the image fitted to it, as for outpainting)")
        raise RequestError(f"{what} is {value.width}x{value.height} pixels but the image is "
                           f"{image_size[0]}x{image_size[1]}: they must be the same size{fitted}.")
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


def blur_mask(mask: Image.Image, blur: int) -> np.ndarray:
    """A binary mask blurred (x, then y, as A1111): (height, width) uint8, 255 repaints."""
    array = np.asarray(mask, np.uint8)
    if blur > 0:
        array = gaussian_blur(gaussian_blur(array, blur, axis=1), blur, axis=0)
    return array


def fit_mask(mask: np.ndarray, size: tuple[int, int], resize_mode: str) -> np.ndarray:
    """A blurred mask fitted to `size` by the image's resize mode."""
    return np.asarray(fit_image(Image.fromarray(mask, "L"), size, resize_mode), np.uint8)


def crop_region(mask: np.ndarray, padding: int, size: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """Only masked: the box (x1, y1, x2, y2) around the blurred mask's non-black pixels, `padding`
    more each way, within the image, then widened to `size`'s aspect ratio (A1111's
    get_crop_region_v2 and expand_crop_region); None for a mask with nothing to repaint."""
    box = Image.fromarray(mask, "L").getbbox()
    if box is None:
        return None
    height, width = mask.shape
    x1, y1, x2, y2 = box
    if padding:
        x1, y1, x2, y2 = max(x1 - padding, 0), max(y1 - padding, 0), min(x2 + padding, width), min(y2 + padding, height)
    if (x2 - x1) / (y2 - y1) > size[0] / size[1]:
        y1, y2 = _widened(y1, y2, (x2 - x1) / (size[0] / size[1]), height)
    else:
        x1, x2 = _widened(x1, x2, (y2 - y1) * (size[0] / size[1]), width)
    return x1, y1, x2, y2


def _widened(start: int, end: int, desired: float, limit: int) -> tuple[int, int]:
    """One side of expand_crop_region: grown about its centre to `desired`, shifted back inside."""
    grow = int(desired - (end - start))
    start, end = start - grow // 2, end + grow - grow // 2
    if end >= limit:
        start, end = start - (end - limit), limit
    if start < 0:
        start, end = 0, end - start
    return start, min(end, limit)


@dataclass(frozen=True)
class Crop:
    """Only masked: the starting image at its own size, its blurred mask, and the region that was
    cropped from them and denoised at the call's size."""
    image: np.ndarray  # (H, W, 3) uint8
    mask: np.ndarray  # (H, W) uint8
    region: tuple[int, int, int, int]  # x1, y1, x2, y2

    def paste(self, result: Image.Image) -> Image.Image:
        """A result pasted back (A1111's uncrop: fitted to the region by Crop and resize) and the
        image laid over it through its blurred mask (not doubled, as A1111 keeps it here)."""
        x1, y1, x2, y2 = self.region
        canvas = Image.new("RGBA", (self.image.shape[1], self.image.shape[0]))
        canvas.paste(fit_image(result, (x2 - x1, y2 - y1), "Crop and resize"), (x1, y1))
        return overlay(canvas, self.image, self.mask, doubled=False)


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


def overlay(result: Image.Image, original: np.ndarray, mask: np.ndarray, doubled: bool = True) -> Image.Image:
    """The result with the original's pixels over it wherever the blurred mask (doubled, as A1111's
    mask_for_overlay for the whole picture) is not full: exactly the original where it is black."""
    if doubled:
        mask = np.clip(mask.astype(np.float32) * 2, 0, 255).astype(np.uint8)
    kept = Image.new("RGBa", result.size)
    kept.paste(Image.fromarray(original, "RGB").convert("RGBA").convert("RGBa"),
               mask=ImageOps.invert(Image.fromarray(mask, "L")))
    out = result.convert("RGBA")
    out.alpha_composite(kept.convert("RGBA"))
    return out.convert("RGB")


__all__ = ["Crop", "DEFAULT_INPAINT_AREA", "DEFAULT_MASKED_CONTENT", "DEFAULT_MASK_BLUR", "DEFAULT_MASK_PADDING",
           "INPAINT_AREAS", "MASKED_CONTENT", "MAX_MASK_BLUR", "MAX_MASK_PADDING", "ONLY_MASKED", "blur_mask",
           "crop_region", "fill", "fit_mask", "gaussian_blur", "latent_mask", "mask_input", "overlay"]
