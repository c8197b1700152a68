"""An upscaler model (models/esrgan.py) run over images of any size, for hires fix and Extras: one program,
compiled for its tile size and tiles per batch, runs every image's tiles (imaging/upscale.py cuts and
stitches them), so nothing a user uploads compiles anything. Pixels go in and come out as A1111 hands them
to its upscalers: [0, 1], blue-green-red (A1111 flips every spandrel model's input so), rounded to uint8.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from PIL import Image

from ..imaging.upscale import BATCH, OVERLAP, TILE, Tiling, resize_with, upscale_by, upscale_tiled
from ..models.esrgan import UpscalerNet
from ..models.layers import Precision
from ..weights.upscalers import UpscalerFile


def _tiles(graphdef: Any, bgr: bool, state: Any, tiles: jax.Array) -> jax.Array:
    model = nnx.merge(graphdef, state)
    x = tiles.astype(jnp.float32) / 255
    x = x[..., ::-1] if bgr else x
    y = model(x).astype(jnp.float32)
    y = y[..., ::-1] if bgr else y
    return jnp.round(jnp.clip(y, 0, 1) * 255).astype(jnp.uint8)


# Tiles a batch on an accelerator: R-ESRGAN 4x+ on one TPU v5e, 1024 -> 4096 pixels, took 4.23 s an image
# at 4 tiles a batch, 2.79-2.82 at 8, 3.14 at 16 (2026-12-07; General 4xV3: 1.33-1.36 s at each). A
# CPU keeps imaging/upscale.py's 4: a small image's one tile would otherwise run with seven of padding.
ACCELERATOR_BATCH = 8


class TiledUpscaler:
    """`model` compiled for `batch` tiles of `tile` pixels (overlapping by `overlap` or more). `name`: how
    the page and the parameters text name it (A1111's)."""

    def __init__(self, model: UpscalerNet, name: str = "", *, tile: int = TILE, overlap: int = OVERLAP,
                 batch: int | None = None, bgr: bool = True):
        self.name, self.scale = name, model.scale
        self.batch = batch or (BATCH if jax.default_backend() == "cpu" else ACCELERATOR_BATCH)
        self.tiling = Tiling(tile, overlap, model.multiple)
        graphdef, self._state = nnx.split(model)
        self._program = jax.jit(functools.partial(_tiles, graphdef, bgr))

    def warm(self) -> None:
        """Compile now (the first image would otherwise): a batch of black tiles, run."""
        t = self.tiling.tile
        jax.block_until_ready(self._program(self._state, np.zeros((self.batch, t, t, 3), np.uint8)))

    def run(self, image: np.ndarray) -> np.ndarray:
        """(H, W, 3) uint8 -> (H*scale, W*scale, 3) uint8: the model applied once."""
        if np.ndim(image) != 3 or np.shape(image)[2] != 3:
            raise ValueError(f"an RGB image is (H, W, 3), not {np.shape(image)}")
        return upscale_tiled(image, lambda tiles: self._program(self._state, tiles), self.scale, self.tiling,
                             self.batch)

    def apply(self, image: Image.Image) -> Image.Image:
        return Image.fromarray(self.run(np.asarray(image.convert("RGB"))))

    def upscale(self, image: Image.Image, scale: float) -> Image.Image:
        """Extras' upscale: A1111's Upscaler.upscale (the model until the image is at least `scale` times
        its size, its sides multiples of 8, then Lanczos to that)."""
        return upscale_by(image.convert("RGB"), scale, self.apply)

    def resize(self, image: Image.Image, size: tuple[int, int]) -> Image.Image:
        """Hires fix's upscale to `size` (width, height), as A1111's resize_image does with an upscaler."""
        return resize_with(image.convert("RGB"), size, self.apply)


class ModelUpscalers:
    """A server's upscaler models by A1111's name (weights/upscalers.find_upscalers' `found`), each
    read and compiled when first used (or warmed), then kept; `skipped`: the folder's files not
    offered, and why."""

    def __init__(self, files: Mapping[str, UpscalerFile] | None = None, skipped: Mapping[str, str] | None = None,
                 precision: Precision | None = None):
        self.files, self.skipped, self.precision = dict(files or {}), dict(skipped or {}), precision
        self._made: dict[str, TiledUpscaler] = {}
        self._lock = threading.Lock()  # (two calls asking for one model read and compile it once)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.files)

    def __getitem__(self, name: str) -> TiledUpscaler:
        with self._lock:
            if name not in self._made:
                self._made[name] = TiledUpscaler(self.files[name].load(self.precision), name)
            return self._made[name]

    def warm(self) -> None:
        """Read and compile every model now, so that no request waits for it."""
        for name in self.files:
            self[name].warm()
