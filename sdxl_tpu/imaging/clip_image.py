"""An image prompt's pixels as CLIP's image encoder takes them, as transformers' CLIPImageProcessor
(its PIL backend, the one diffusers' IP-Adapter pipelines run without torchvision) prepares them:
RGB (transparency on white), the shortest side resized to 224 (bicubic), the centre 224 x 224
cropped, scaled to [0, 1] and normalized with OpenAI CLIP's mean and deviation. Plain PIL and numpy,
channels-last."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
CLIP_IMAGE_SIZE = 224


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


def clip_pixels(image: Image.Image | np.ndarray, size: int = CLIP_IMAGE_SIZE,
                mean: Sequence[float] = OPENAI_CLIP_MEAN, std: Sequence[float] = OPENAI_CLIP_STD) -> np.ndarray:
    """One image (PIL, any mode, or an (H, W, 3) uint8 array) -> (size, size, 3) float32."""
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
            raise ValueError(f"an image prompt as an array must be (H, W, 3) uint8, not {image.shape} {image.dtype}")
        image = Image.fromarray(image)
    image = rgb(image)
    resized = np.asarray(image.resize(resized_size(*image.size, size), resample=Image.Resampling.BICUBIC))
    h, w = resized.shape[:2]
    top, left = (h - size) // 2, (w - size) // 2
    crop = resized[top:top + size, left:left + size]
    # (float64 first, then float32, then the float32 statistics: as transformers computes it)
    scaled = (crop.astype(np.float64) * (1 / 255)).astype(np.float32)
    return (scaled - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)


def clip_batch(images: Sequence[Image.Image | np.ndarray], size: int = CLIP_IMAGE_SIZE) -> np.ndarray:
    """Images -> (N, size, size, 3) float32, the image encoder's input."""
    return np.stack([clip_pixels(im, size) for im in images])
