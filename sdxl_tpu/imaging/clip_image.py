"""An image prompt's pixels as CLIP's image encoder takes them, as transformers' CLIPImageProcessor
(its PIL backend, the one diffusers' IP-Adapter pipelines run without torchvision) prepares them:
RGB (transparency on white), the shortest side resized to 224 (bicubic), the centre 224 x 224
cropped, scaled to [0, 1] and normalized with OpenAI CLIP's mean and deviation. Plain PIL and numpy,
channels-last."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from .image_input import image_input

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
CLIP_IMAGE_SIZE = 224
# sd-webui-controlnet's preprocessors of an IP-Adapter unit: each names an image encoder, and here
# the one loaded beside the IP-Adapter is used whichever is named (the name is kept in the parameters).
IP_ADAPTER_MODULES = ("ip-adapter-auto", "ip-adapter_clip_sdxl", "ip-adapter_clip_sdxl_plus_vith", "ip-adapter_clip_g",
                      "ip-adapter_clip_h")


def resized_size(width: int, height: int, shortest: int) -> tuple[int, int]:
    """(width, height) with the shorter side `shortest` and the longer scaled alike, rounded down
    (transformers' get_resize_output_image_size, default_to_square=False)."""
    if width <= height:
        return shortest, int(shortest * height / width)
    return int(shortest * width / height), shortest


def rgb(image: Image.Image) -> Image.Image:
    """The image in RGB, transparency composited onto white (transformers' convert_to_rgb)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def clip_crop(image: Image.Image | np.ndarray, size: int = CLIP_IMAGE_SIZE) -> np.ndarray:
    """One image (PIL, any mode, or an (H, W, 3) uint8 array) -> its centre (size, size, 3) uint8,
    the shortest side resized to `size` first: what the encoder sees, before normalizing."""
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
            raise ValueError(f"an image prompt as an array must be (H, W, 3) uint8, not {image.shape} {image.dtype}")
        image = Image.fromarray(image)
    image = rgb(image)
    resized = np.asarray(image.resize(resized_size(*image.size, size), resample=Image.Resampling.BICUBIC))
    h, w = resized.shape[:2]
    top, left = (h - size) // 2, (w - size) // 2
    return resized[top:top + size, left:left + size]


def normalized(crops: np.ndarray, mean: Sequence[float] = OPENAI_CLIP_MEAN,
               std: Sequence[float] = OPENAI_CLIP_STD) -> np.ndarray:
    """Crops (..., size, size, 3) uint8 -> the encoder's input, float32."""
    # (float64 first, then float32, then the float32 statistics: as transformers computes it)
    scaled = (crops.astype(np.float64) * (1 / 255)).astype(np.float32)
    return (scaled - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)


def clip_pixels(image: Image.Image | np.ndarray, size: int = CLIP_IMAGE_SIZE) -> np.ndarray:
    """One image (PIL, any mode, or an (H, W, 3) uint8 array) -> (size, size, 3) float32."""
    return normalized(clip_crop(image, size))


def image_prompt(value: Any, label: str) -> np.ndarray:
    """A client's image prompt (what image_input takes) as the image encoder sees it, 224 x 224
    uint8 (clip_crop): what a request keeps of it."""
    return clip_crop(image_input(value, label))


def clip_batch(images: Sequence[Image.Image | np.ndarray], size: int = CLIP_IMAGE_SIZE) -> np.ndarray:
    """Images -> (N, size, size, 3) float32, the image encoder's input."""
    return np.stack([clip_pixels(im, size) for im in images])
