"""The samplers' device half: one update for every sampler, driven by its tables (sampler/tables.py).

    x' = a x + b eps + c m + n z        m' = p x + q eps

Pure functions, float32; jit-able with the tables as inputs, so any sampler at any step count runs
the same compiled program.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ..sampler.tables import Tables


class State(NamedTuple):
    x: jax.Array           # (B, h, w, C) float32 latents
    prediction: jax.Array  # the previous step's data prediction m (zeros before the first step)
    seeds: jax.Array       # (B,) uint32: each image's seed, for the noise an ancestral step adds
    # Where the host draws the step noise (RNG CPU): the unit noise of the next K noisy rows, handed
    # over at once (K: init's noise_rows), and which of them the next noisy row takes.
    noise: jax.Array       # (B, K, h, w, C)
    noise_slot: jax.Array  # (B,) int32
    host_noise: jax.Array  # (B,) bool: the image takes its step noise from `noise`, not from JAX
    # Inpainting (tables.known says when): the latents kept, where `keep` is 1 (zeros: nothing kept).
    known: jax.Array       # (B, h, w, C): the starting image's latents
    keep: jax.Array        # (B, h, w, 1) float32: 1 where the image is kept, 0 where it is repainted
    first_noise: jax.Array  # (B, h, w, C): the initial unit noise, which noises `known` (diffusers)
    # An inpainting UNet's extra input channels, beside the latents: the mask and the masked image's
    # latents (B, h, w, 1 + C); for a base UNet one channel of zeros, unused (a zero-size array
    # would lose its batch sharding).
    condition: jax.Array


def init(noise: jax.Array, seeds: jax.Array, tables: Tables, image: jax.Array | None = None,
         keep: jax.Array | None = None, condition: jax.Array | None = None, noise_rows: int = 1) -> State:
    """The state before step 0, from unit normal noise and the images' seeds (step noise from JAX;
    the host sets `noise` (room for `noise_rows` rows' worth), `noise_slot` and `host_noise` to give
    its own); starting from an image (img2img), its latents noised to the first step's level, and
    (inpainting) kept where `keep` says; an inpainting UNet's `condition` (none for a base UNet)."""
    zeros = jnp.zeros_like(noise)
    b = noise.shape[0]
    x = noise * tables.init_sigma
    if image is not None:
        x = x + tables.init_image * image
    keep = jnp.zeros((*noise.shape[:-1], 1), jnp.float32) if keep is None else keep
    condition = jnp.zeros((*noise.shape[:-1], 1), jnp.float32) if condition is None else condition
    return State(x, zeros, seeds, jnp.zeros((b, noise_rows, *noise.shape[1:]), noise.dtype),
                 jnp.zeros((b,), jnp.int32), jnp.zeros(seeds.shape, jnp.bool_), zeros if image is None else image,
                 keep, noise, condition)


def model_input(state: State, i: jax.Array, tables: Tables) -> tuple[jax.Array, jax.Array]:
    """What the model sees at step i: the scaled latents and the timestep."""
    return state.x * jnp.asarray(tables.input_scale)[i], jnp.asarray(tables.timesteps)[i]


def step_noise(seeds: jax.Array, i: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """The unit noise of step i, per image from its own seed (a stream apart from the initial
    noise, which uses the seed's key itself): an image never depends on its slot or batch."""
    draw = lambda s: jax.random.normal(jax.random.fold_in(jax.random.key(s), i + 1), shape, jnp.float32)
    return jax.vmap(draw)(seeds)


def step(state: State, eps: jax.Array, i: jax.Array, tables: Tables, noise: jax.Array | None = None) -> State:
    """Step i (pure, float32). `noise` replaces the seeds' step noise (tests inject diffusers')."""
    a, b, c, n, p, q = jnp.asarray(tables.update)[i]
    if tables.known is not None:  # inpainting, A1111's way: the denoised estimate takes the known latents
        _, _, _, d_u, d_v = jnp.asarray(tables.known)[i]
        divisor = jnp.where(d_v != 0, d_v, 1.0)
        eps = jnp.where(d_v != 0, eps + state.keep * ((state.known - d_u * state.x) / divisor - eps), eps)
    if noise is None:  # only ancestral and SDE steps draw noise
        host = state.host_noise[:, None, None, None]
        given = jax.vmap(lambda rows, slot: rows[slot])(state.noise, state.noise_slot)
        noise = jax.lax.cond(n != 0, lambda: jnp.where(host, given, step_noise(state.seeds, i, state.x.shape[1:])),
                             lambda: jnp.zeros_like(state.x))
    x = a * state.x + b * eps + c * state.prediction + n * noise
    state = state._replace(noise_slot=state.noise_slot + (n != 0).astype(jnp.int32))
    if tables.known is not None:  # and diffusers' way: the latents take the known ones, noised to the next level
        x_image, x_noise, x_blend, _, _ = jnp.asarray(tables.known)[i]
        target = x_image * state.known + x_noise * state.first_noise
        x = jnp.where(x_blend != 0, x + state.keep * (target - x), x)
    return state._replace(x=x, prediction=p * state.x + q * eps)


__all__ = ["State", "init", "model_input", "step", "step_noise"]
