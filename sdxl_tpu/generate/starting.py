"""The host half of a call that starts from images (img2img, inpainting): what the VAE encodes,
where the latents are kept and what fills the rest, and the finished images with the input's
pixels wherever the mask kept them. Plain numpy and PIL (imaging/mask.py); the device half is
compiling/programs.py's noise program and sampler_update.py's blends."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from PIL import Image

from ..imaging.mask import ONLY_MASKED, fill, latent_mask, overlay
from ..request.request import ImageInfo


# Inpainting's "Masked content" as the noise program takes it, per image: what fills the masked latents.
LATENT_FILL = {"latent noise": 1, "latent nothing": 2}  # (anything else: 0, the image's own latents)


class Start(NamedTuple):
    pixels: np.ndarray  # (n, H, W, 3) uint8: what the VAE encodes (the masked area filled, but "original")
    keep: np.ndarray    # (n, h, w, 1) float32: 1 where the latents are kept (zeros without a mask)
    fill: np.ndarray    # (n,) int32: LATENT_FILL's code per image
    # (n, H, W) uint8: 1 where an inpainting UNet's masked image is blanked (the blurred mask
    # rounded, as A1111 rounds it; everywhere without a mask, as A1111 conditions img2img).
    masked: np.ndarray


def prepare(images: np.ndarray, masks: np.ndarray | None, infos: Sequence[ImageInfo], factor: int) -> Start:
    """Checked (n, H, W, 3) uint8 starting images and (n, H, W) uint8 masks (255 repaints; None:
    img2img) at the call's size -> the arrays the device takes."""
    n, height, width = len(infos), infos[0].size[1], infos[0].size[0]
    images = np.asarray(images)
    if images.shape != (n, height, width, 3) or images.dtype != np.uint8:
        raise ValueError(f"init_images must be uint8 of shape {(n, height, width, 3)}, got {images.dtype} "
                         f"{images.shape}")
    keep = np.zeros((n, height // factor, width // factor, 1), np.float32)
    codes = np.zeros(n, np.int32)
    if masks is None:
        return Start(images, keep, codes, np.ones((n, height, width), np.uint8))
    masks = np.asarray(masks)
    if masks.shape != (n, height, width) or masks.dtype != np.uint8:
        raise ValueError(f"masks must be uint8 of shape {(n, height, width)}, got {masks.dtype} {masks.shape}")
    pixels = images.copy()
    filled: dict[bytes, np.ndarray] = {}  # (a request's images share one image and mask: filled once)
    for i, (info, mask) in enumerate(zip(infos, masks)):
        if info.masked_content is None:
            raise ValueError("an image with a mask needs its masked content (ImageInfo.masked_content)")
        keep[i, ..., 0] = 1 - latent_mask(mask, factor)
        codes[i] = LATENT_FILL.get(info.masked_content, 0)
        if info.masked_content != "original":  # A1111 fills the pixels under the latent choices too
            key = hashlib.blake2b(images[i].tobytes() + mask.tobytes(), digest_size=16).digest()
            if key not in filled:
                filled[key] = fill(images[i], mask)
            pixels[i] = filled[key]
    return Start(pixels, keep, codes, (masks >= 128).astype(np.uint8))


def blank(n: int, size: tuple[int, int], factor: int) -> Start:
    """No starting image (from noise): an inpainting UNet's condition is all mask, over a blank
    image (A1111's txt2img conditioning; diffusers' with a white mask)."""
    width, height = size
    return Start(np.zeros((n, height, width, 3), np.uint8), np.zeros((n, height // factor, width // factor, 1),
                 np.float32), np.zeros(n, np.int32), np.ones((n, height, width), np.uint8))


def condition_mask(start: Start, factor: int) -> np.ndarray:
    """The mask an inpainting UNet takes beside the latents (n, h, w, 1): torch's nearest
    downscale of the rounded mask, as diffusers and A1111 make it."""
    return start.masked[:, ::factor, ::factor, None].astype(np.float32)


def finish(results: Sequence[Image.Image], images: np.ndarray, masks: np.ndarray | None,
           infos: Sequence[ImageInfo]) -> list[Image.Image]:
    """The decoded images, with the starting image's pixels over them where the mask kept them
    (Only masked: once pasted back into the whole image, Request.finish)."""
    if masks is None:
        return list(results)
    return [result if info.inpaint_area == ONLY_MASKED else overlay(result, image, mask)
            for result, image, mask, info in zip(results, images, masks, infos)]
