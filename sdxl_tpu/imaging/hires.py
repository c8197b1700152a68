"""Hires. fix, as AUTOMATIC1111 runs it: make the image at its size, upscale it (its latents, or its
pixels and then encode them), and denoise again at the larger size from there, with its own steps
and denoising strength. Plain numpy and PIL; the larger size must be one the pipeline compiled
(static shapes: the two passes are two compiled sizes).

    Latent   the latents scaled bilinearly (torch's interpolate, align_corners False, A1111's "Latent")
    Lanczos  the decoded image scaled with Lanczos, then encoded again (A1111's "Lanczos")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

UPSCALERS = ("Latent", "Lanczos")
DEFAULT_UPSCALER = "Latent"  # A1111's
DEFAULT_SCALE = 2.0  # A1111's "Upscale by"
SCALE_RANGE = (1.0, 4.0)
DEFAULT_STRENGTH = 0.7  # A1111's hires denoising strength


@dataclass(frozen=True)
class Hires:
    """A hires fix: upscaled by `scale` to `size`, then `steps` steps (0: the first pass's count) at
    denoising `strength`."""
    scale: float
    upscaler: str
    steps: int
    strength: float
    size: tuple[int, int]  # (width, height) of the second pass: int(width * scale), int(height * scale)


def upscaled_size(size: tuple[int, int], scale: float) -> tuple[int, int]:
    """The second pass's size, as A1111 computes it (hr_upscale_to_x/y)."""
    return int(size[0] * scale), int(size[1] * scale)


def scales_to(size: tuple[int, int], sizes: Sequence[tuple[int, int]]) -> list[float]:
    """The upscale factors from `size` that land on a compiled size (its shape kept)."""
    found = []
    for w, h in sizes:
        scale = w / size[0]
        if w > size[0] and upscaled_size(size, scale) == (w, h) and SCALE_RANGE[0] < scale <= SCALE_RANGE[1]:
            found.append(round(scale, 4))
    return sorted(found)


def latent_upscale(latents: np.ndarray, height: int, width: int) -> np.ndarray:
    """(B, h, w, C) latents -> (B, height, width, C), bilinear with half-pixel centres and edges
    clamped: torch.nn.functional.interpolate(mode="bilinear", align_corners=False, antialias=False),
    A1111's "Latent" upscaler."""
    def weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src = np.maximum((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0)
        low = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        return low, np.minimum(low + 1, n_in - 1), (src - low).astype(np.float32)

    x = np.asarray(latents, np.float32)
    y0, y1, fy = weights(x.shape[1], height)
    x0, x1, fx = weights(x.shape[2], width)
    rows = x[:, y0] * (1 - fy)[None, :, None, None] + x[:, y1] * fy[None, :, None, None]
    return rows[:, :, x0] * (1 - fx)[None, None, :, None] + rows[:, :, x1] * fx[None, None, :, None]


__all__ = ["DEFAULT_SCALE", "DEFAULT_STRENGTH", "DEFAULT_UPSCALER", "Hires", "SCALE_RANGE", "UPSCALERS",
           "latent_upscale", "scales_to", "upscaled_size"]
