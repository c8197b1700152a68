"""SDXL sampling, top to bottom; nothing else lives here.

    prompt -> token ids -> text embeddings -> noise -> denoising loop -> VAE decode -> images

Pure functions on batch-major arrays; along axis 1 of the text arrays, index 0 is the negative
(unconditional) prompt and index 1 the prompt. How they are compiled, sharded and called is
pipeline.py's business; which update a step makes is in the sampler's tables (scheduler.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import scheduler
from .request import ImageInfo
from .scheduler import State, Tables

MAX_TOKENS = 77


class TextInputs(NamedTuple):
    """The host arrays of one call's text and conditioning."""
    ids1: np.ndarray           # (B, 2, 77) int32: (negative, prompt) ids, first tokenizer
    ids2: np.ndarray           # (B, 2, 77) int32: the same, second tokenizer
    zero_negative: np.ndarray  # (B,) bool: use zeros for the negative embeddings
    time_ids: np.ndarray       # (B, 6) float32: SDXL's size micro-conditioning
    guidance: np.ndarray       # (B,) float32


def tokenize(tokenizer, texts: Sequence[str]) -> np.ndarray:
    """Texts -> (len(texts), 77) int32 token ids, padded and truncated as SDXL's pipeline does."""
    return tokenizer(list(texts), padding="max_length", max_length=MAX_TOKENS, truncation=True,
                     return_tensors="np").input_ids.astype(np.int32)


def prepare(tokenizers, images: Sequence[ImageInfo], force_zeros_for_empty_prompt: bool = True) -> TextInputs:
    """Per-image parameters -> host arrays. Like diffusers, an empty negative prompt means zero
    negative embeddings (force_zeros_for_empty_prompt), and the micro-conditioning says the
    image is uncropped at its own size."""
    n = len(images)
    both = [t for im in images for t in (im.negative_prompt, im.prompt)]
    width, height = images[0].size
    return TextInputs(
        ids1=tokenize(tokenizers[0], both).reshape(n, 2, MAX_TOKENS),
        ids2=tokenize(tokenizers[1], both).reshape(n, 2, MAX_TOKENS),
        zero_negative=np.array([force_zeros_for_empty_prompt and not im.negative_prompt.strip() for im in images]),
        time_ids=np.tile(np.array([height, width, 0, 0, height, width], np.float32), (n, 1)),
        guidance=np.array([im.guidance_scale for im in images], np.float32))


def encode_text(te1, te2, ids1: jax.Array, ids2: jax.Array, zero_negative: jax.Array):
    """Token ids (B, 2, 77) of both tokenizers -> context (B, 2, 77, D1 + D2) and pooled (B, 2, P)."""
    b = ids1.shape[0]
    h1, _ = te1(ids1.reshape(2 * b, -1))
    h2, pooled = te2(ids2.reshape(2 * b, -1))
    context = jnp.concatenate([h1, h2], axis=-1).reshape(b, 2, MAX_TOKENS, -1).astype(jnp.float32)
    pooled = pooled.reshape(b, 2, -1).astype(jnp.float32)
    keep = jnp.stack([~zero_negative, jnp.ones_like(zero_negative)], axis=1).astype(jnp.float32)
    return context * keep[:, :, None, None], pooled * keep[:, :, None]


def get_noise(seeds: jax.Array, height: int, width: int, channels: int) -> jax.Array:
    """One unit normal latent (h, w, C) per seed: an image depends on its own seed only."""
    sample = lambda s: jax.random.normal(jax.random.key(s), (height, width, channels), jnp.float32)
    return jax.vmap(sample)(seeds)


def denoise_step(unet, state: State, context: jax.Array, pooled: jax.Array, time_ids: jax.Array,
                 guidance: jax.Array, tables: Tables, i: jax.Array, guided: bool = True) -> State:
    """Step i with classifier-free guidance; latents and sampler math in float32.

    Each image's unconditional and conditional pass run side by side in one UNet batch
    (image-major, so a device holding an image holds both of its passes). Unguided (every
    image's guidance <= 1, as distilled models run) the conditional pass alone: half the batch.
    """
    b = state.x.shape[0]
    x_in, t = scheduler.model_input(state, i, tables)
    if not guided:  # what diffusers does for guidance_scale <= 1: the conditional prediction alone
        eps = unet(x_in, t, context[:, 1], pooled[:, 1], time_ids).astype(jnp.float32)
        return scheduler.step(state, eps, i, tables)
    eps = unet(jnp.repeat(x_in, 2, axis=0), t, context.reshape(2 * b, *context.shape[2:]), pooled.reshape(2 * b, -1),
               jnp.repeat(time_ids, 2, axis=0)).astype(jnp.float32)
    eps = eps.reshape(b, 2, *eps.shape[1:])
    g = jnp.where(guidance > 1.0, guidance, 1.0)[:, None, None, None]
    return scheduler.step(state, eps[:, 0] + g * (eps[:, 1] - eps[:, 0]), i, tables)


def denoise(unet, state: State, context: jax.Array, pooled: jax.Array, time_ids: jax.Array,
            guidance: jax.Array, tables: Tables, num_steps: jax.Array, guided: bool = True) -> State:
    """All steps in one loop on the device. The bound `num_steps` is traced, so any step count
    up to the table size runs the same compiled program."""
    step = lambda i, s: denoise_step(unet, s, context, pooled, time_ids, guidance, tables, i, guided)
    return jax.lax.fori_loop(0, num_steps, step, state)


def decode(vae, latents: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Latents -> uint8 images (B, H, W, 3) and a per-image flag: all pixels finite.

    One image at a time (diffusers' "VAE slicing"): the decoder's full-resolution activations set
    the peak memory of a call, and a working set a quarter the size decodes faster where memory
    is the bottleneck (measured on a CPU, 4 images of 1024x1024: 2-4x faster, peak 5.4 GB instead of
    15 GB). On a 4-chip host each chip decodes one image anyway."""
    def one(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        image = vae.decode(x[None])[0].astype(jnp.float32)
        return jnp.round(jnp.clip(image / 2 + 0.5, 0.0, 1.0) * 255.0).astype(jnp.uint8), jnp.isfinite(image).all()

    return jax.lax.map(one, latents)
