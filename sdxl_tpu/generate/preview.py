"""Live previews: while a call denoises, the current estimate of each final image, decoded cheaply.

Every sampler's state carries its data prediction, the estimate of the clean latents after the
latest step (sampler_update.py's State). A preview decodes it one of two ways:
  - "approx" (default): a linear map of the four latent channels to RGB, on the host, at latent
    resolution, with no weights. The factors are ComfyUI's for SDXL latents (A1111's "Approx
    cheap" is the same idea with its own fit).
  - "taesd": the tiny autoencoder for SDXL (madebyollin/taesdxl, taesd.py), compiled per size with
    the other programs and run on the device while the next steps run.
Neither compiles anything per request.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

DECODERS = ("approx", "taesd")
# ComfyUI's comfy/latent_formats.py, SDXL: rgb = latents @ FACTORS + BIAS, in [-1, 1].
LATENT_RGB_FACTORS = np.array([[0.3651, 0.4232, 0.4341],
                               [-0.2533, -0.0042, 0.1068],
                               [0.1076, 0.1111, -0.0362],
                               [-0.3165, -0.2492, -0.2188]], np.float32)
LATENT_RGB_BIAS = np.array([0.1084, -0.0175, -0.0011], np.float32)


def approx_rgb(latents: np.ndarray) -> np.ndarray:
    """(B, h, w, 4) latents (as the UNet sees them) -> (B, h, w, 3) uint8 images."""
    rgb = np.asarray(latents, np.float32) @ LATENT_RGB_FACTORS + LATENT_RGB_BIAS
    return np.round(np.clip((rgb + 1.0) / 2.0, 0.0, 1.0) * 255.0).astype(np.uint8)


def preview_size(size: tuple[int, int], vae_factor: int) -> tuple[int, int]:
    """(width, height) of a TAESD preview: twice the latent resolution (256 px for 1024), at most the image's."""
    w, h = size
    return min(w, 2 * w // vae_factor), min(h, 2 * h // vae_factor)


def decode_taesd(taesd, latents: jax.Array, size: tuple[int, int]) -> jax.Array:
    """(B, h, w, C) latents -> (B, height, width, 3) uint8 images of `size` (width, height), by TAESD."""
    image = taesd.decode(latents).astype(jnp.float32)
    w, h = size
    if image.shape[1:3] != (h, w):
        image = jax.image.resize(image, (image.shape[0], h, w, 3), "linear", antialias=True)
    return jnp.round(jnp.clip(image / 2 + 0.5, 0.0, 1.0) * 255.0).astype(jnp.uint8)


class Previews:
    """One call's previews. After step `done` (every `every` steps, not after the last), the
    state's clean-latents estimate is decoded: on the host at once (approx), or on the device by
    `on_device` (TAESD: latents -> uint8 images), whose result is handed over at a later step
    once ready, so the host never waits for it. `callback(step, steps, images)` gets the first
    `images` of the batch (the rest are padding)."""

    def __init__(self, on_device: Callable[[jax.Array], jax.Array] | None, images: int, steps: int,
                 callback: Callable[[int, int, np.ndarray], None] | None, every: int):
        self.on_device, self.images, self.steps = on_device, images, steps
        self.callback, self.every = callback, every if callback is not None else 0
        self.pending: tuple[int, jax.Array] | None = None

    def after_step(self, done: int, prediction: jax.Array) -> None:
        if self.every <= 0:
            return
        if self.pending is not None and self.pending[1].is_ready():  # pyright: ignore[reportAttributeAccessIssue]
            self._hand_over(*self.pending)
            self.pending = None
        if done % self.every or done >= self.steps or self.pending is not None:
            return
        if self.on_device is None:
            self._hand_over(done, approx_rgb(np.asarray(prediction)[:self.images]))
        else:
            self.pending = (done, self.on_device(prediction))

    def _hand_over(self, step: int, images) -> None:
        if self.callback is not None:
            self.callback(step, self.steps, np.asarray(images)[:self.images])


def count(steps: int, every_steps: int) -> int:
    """How many previews a run of `steps` steps shows."""
    return 0 if every_steps <= 0 else math.ceil(steps / every_steps) - 1
