"""Upscaling with a model (ESRGAN, Real-ESRGAN), as A1111 does for hires fix and Extras, in plain numpy and
PIL; the model itself is a function on a batch of tiles (compiled once, elsewhere).

An image of any size is cut into tiles of one size, run a fixed number at a time (the last batch padded),
and stitched back: so the model runs one compiled shape, whatever is uploaded. Tiles overlap by at least
`overlap` pixels, lie inside the image (those at its edges end at its edges; an image smaller than a tile
is padded, reflected, to one), and meet halfway across each overlap, blended linearly over overlap/2
pixels there: no output pixel comes from a tile's outer overlap/4 pixels, so where the network sees no
farther than that, the tiled result is the untiled one.

A1111's rule for a size (its Upscaler.upscale): the model is applied until the image is at least the
target (at most three times; the target's sides rounded down to multiples of 8), then Lanczos makes it
the target exactly.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

TILE = 192  # A1111's default tile (ESRGAN_tile)
OVERLAP = 16
BATCH = 4
MAX_PASSES = 3  # A1111's


@dataclass(frozen=True)
class Tiling:
    """Tiles of `tile` pixels a side overlapping by `overlap` or more, whose sides and positions are
    multiples of `multiple` (a pixel-unshuffling network's factor)."""
    tile: int = TILE
    overlap: int = OVERLAP
    multiple: int = 1

    def __post_init__(self) -> None:
        if self.multiple < 1 or self.tile % self.multiple or self.overlap < 0:
            raise ValueError(f"tiles of {self.tile} px by multiples of {self.multiple}, overlap {self.overlap}")
        if 2 * self.overlap + self.multiple > self.tile:
            raise ValueError(f"an overlap of {self.overlap} px leaves tiles of {self.tile} px too little of their own")

    def starts(self, n: int) -> list[int]:
        """Where the tiles along a side of `n` pixels (a multiple of `multiple`, at least a tile) begin:
        spread evenly, the first at 0, the last at n - tile."""
        t, m = self.tile, self.multiple
        step = t - self.overlap - (m - 1)  # (positions rounded down to multiples: the overlap stays)
        count = 1 + math.ceil((n - t) / step)
        if count == 1:
            return [0]
        return [m * (k * (n - t) // (count - 1) // m) for k in range(count)]

    def padded(self, n: int) -> int:
        return max(self.tile, -(-n // self.multiple) * self.multiple)


def _axis_weights(starts: list[int], tile: int, overlap: int, scale: int) -> list[np.ndarray]:
    """Each tile's weights along one side, output pixel by output pixel: 1 on its own part, ramps across
    the middle half of each overlap, normalised so the tiles' weights sum to one everywhere."""
    span, ramp = tile * scale, max(1.0, overlap * scale / 2)
    cuts = [(a + b + tile) * scale / 2 for a, b in zip(starts, starts[1:])]  # output pixels
    weights = []
    for k, start in enumerate(starts):
        centre = start * scale + np.arange(span) + 0.5
        w = np.ones(span)
        if k > 0:
            w *= np.clip((centre - (cuts[k - 1] - ramp / 2)) / ramp, 0, 1)
        if k < len(starts) - 1:
            w *= np.clip(((cuts[k] + ramp / 2) - centre) / ramp, 0, 1)
        weights.append(w)
    total = np.zeros((starts[-1] + tile) * scale)
    for start, w in zip(starts, weights):
        total[start * scale:start * scale + span] += w
    return [(w / total[s * scale:s * scale + span]).astype(np.float32) for s, w in zip(starts, weights)]


def upscale_tiled(image: np.ndarray, run: Callable[[np.ndarray], Any], scale: int, tiling: Tiling,
                  batch: int = BATCH) -> np.ndarray:
    """(H, W, C) uint8 -> (H*scale, W*scale, C) uint8 by `run`, which takes (batch, tile, tile, C) uint8
    tiles and gives (batch, tile*scale, tile*scale, C) uint8 (or an array that becomes one: a device's,
    left running while the next batch is sent)."""
    image = np.asarray(image)
    if image.ndim != 3 or image.dtype != np.uint8 or min(image.shape) < 1:
        raise ValueError(f"an image is (H, W, C) uint8, not {image.shape} {image.dtype}")
    h, w, c = image.shape
    t = tiling.tile
    ph, pw = tiling.padded(h), tiling.padded(w)
    padded = np.pad(image, ((0, ph - h), (0, pw - w), (0, 0)), mode="reflect") if (ph, pw) != (h, w) else image
    ys, xs = tiling.starts(ph), tiling.starts(pw)
    places = [(y, x) for y in ys for x in xs]
    outputs: list[np.ndarray] = []
    pending: deque = deque()
    for first in range(0, len(places), batch):
        tiles = np.zeros((batch, t, t, c), np.uint8)  # (the last batch's spare tiles stay black)
        for i, (y, x) in enumerate(places[first:first + batch]):
            tiles[i] = padded[y:y + t, x:x + t]
        pending.append(run(tiles))
        if len(pending) > 2:
            outputs += list(np.asarray(pending.popleft()))
    while pending:
        outputs += list(np.asarray(pending.popleft()))
    wy = dict(zip(ys, _axis_weights(ys, t, tiling.overlap, scale)))
    wx = dict(zip(xs, _axis_weights(xs, t, tiling.overlap, scale)))
    span = t * scale
    out = np.zeros((ph * scale, pw * scale, c), np.float32)
    for (y, x), tile in zip(places, outputs):
        if tile.shape != (span, span, c):
            raise ValueError(f"the model gave a tile of {tile.shape}, not {(span, span, c)}")
        weight = wy[y][:, None, None] * wx[x][None, :, None]
        out[y * scale:y * scale + span, x * scale:x * scale + span] += tile.astype(np.float32) * weight
    return np.clip(np.round(out[:h * scale, :w * scale]), 0, 255).astype(np.uint8)


def target_size(size: tuple[int, int], scale: float) -> tuple[int, int]:
    """(width, height) A1111's Upscaler.upscale aims for: each side times `scale`, rounded down to a multiple of 8."""
    return int((size[0] * scale) // 8 * 8), int((size[1] * scale) // 8 * 8)


def upscale_by(image: Image.Image, scale: float, apply: Callable[[Image.Image], Image.Image]) -> Image.Image:
    """A1111's Upscaler.upscale: `apply` (the model, once) until the image is at least target_size (or
    stops growing; three times at most), then Lanczos to target_size exactly."""
    dest = target_size(image.size, scale)
    for _ in range(MAX_PASSES):
        before = image.size
        image = apply(image)
        if image.size == before or (image.width >= dest[0] and image.height >= dest[1]):
            break
    return image if image.size == dest else image.resize(dest, resample=Image.Resampling.LANCZOS)


def lanczos_by(image: Image.Image, scale: float) -> Image.Image:
    """A1111's "Lanczos" upscaler (UpscalerLanczos): Upscaler.upscale with Lanczos as the model."""
    return upscale_by(image, scale, lambda im: im.resize((int(im.width * scale), int(im.height * scale)),
                                                         resample=Image.Resampling.LANCZOS))


def resize_with(image: Image.Image, size: tuple[int, int],
                apply: Callable[[Image.Image], Image.Image]) -> Image.Image:
    """A1111's resize_image ("Just resize") with a model upscaler, as hires fix uses it: upscale_by the
    larger of the two ratios when that is above 1, then Lanczos to `size` (width, height) exactly."""
    width, height = size
    scale = max(width / image.width, height / image.height)
    if scale > 1.0:
        image = upscale_by(image, scale, apply)
    return image if image.size == (width, height) else image.resize((width, height), resample=Image.Resampling.LANCZOS)
