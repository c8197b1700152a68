"""The sharded programs of one image size, as a Pipeline compiles them: each a stage of
sampling.py under jax.shard_map over the pipeline's one-axis Mesh, parameters replicated (P()),
the image batch split (P(BATCH)), with the abstract arguments to lower it with."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from . import sampling
from . import update
from .preview import decode_taesd, preview_size
from ..sampler.tables import MAX_ROWS, Tables

if TYPE_CHECKING:
    from .pipeline import Pipeline

BATCH = "batch"  # the mesh axis images are split over
NETWORKS = ("text_encoder", "text_encoder_2", "unet", "vae")
# denoise: with classifier-free guidance; denoise_unguided: the conditional pass alone, for calls
# whose every image has guidance <= 1 (distilled models): half the UNet batch.
PROGRAMS = ("encode", "noise", "init", "denoise", "denoise_unguided", "decode")


def shard(mesh: Mesh, fn: Callable, in_specs: tuple, out_specs: Any) -> Callable:
    # check_vma=False: Pallas kernels (splash attention, traced for TPU) declare their outputs
    # without varying-axis types, which the check would reject; every output here is batch-split.
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False))


def program(pipe: Pipeline, name: str, size: tuple[int, int]) -> tuple[Callable, tuple]:
    """The jitted program `name` of `pipe` for `size`, and abstract arguments to lower or trace it with."""
    w, h = size
    b, lh, lw, c = pipe.images_per_call, h // pipe.vae_factor, w // pipe.vae_factor, pipe.latent_channels
    batch = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype, sharding=pipe.batch_sharding)
    rep = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype, sharding=pipe.replicated)
    k, tokens = pipe.max_prompt_chunks, pipe.max_prompt_chunks * sampling.MAX_TOKENS
    ids, latents = batch((b, 2, k, sampling.MAX_TOKENS), jnp.int32), batch((b, lh, lw, c))
    weights, lengths = batch((b, 2, k, sampling.MAX_TOKENS)), batch((b, 2), jnp.int32)
    tables = Tables(rep((MAX_ROWS,)), rep((MAX_ROWS,)), rep((MAX_ROWS, 6)), rep(()))
    seeds = batch((b,), jnp.uint32)
    te1, te2, unet, vae = (partial(nnx.merge, pipe.graphs[n]) for n in NETWORKS)
    bat = P(BATCH)
    if name == "encode":
        fn = lambda p1, p2, *a: sampling.encode_text(te1(p1), te2(p2), *a)
        return shard(pipe.mesh, fn, (P(), P()) + (bat,) * 6, (bat, bat)), (
            pipe.params["text_encoder"], pipe.params["text_encoder_2"], ids, ids, weights, weights, lengths,
            batch((b,), jnp.bool_))
    if name == "noise":  # JAX's initial noise, or the host's for the images that draw their own (RNG CPU)
        def fn(s, t, host, use_host):
            noise = jnp.where(use_host[:, None, None, None], host, sampling.get_noise(s, lh, lw, c))
            return update.init(noise, s, t)._replace(host_noise=use_host)
        return shard(pipe.mesh, fn, (bat, P(), bat, bat), bat), (seeds, tables, latents, batch((b,), jnp.bool_))
    if name == "init":  # the state from initial latents the caller gives
        return shard(pipe.mesh, update.init, (bat, bat, P()), bat), (latents, seeds, tables)
    if name in ("denoise", "denoise_unguided"):  # one step (stepwise: the last argument is the step) or all
        state = jax.tree.map(lambda s: batch(s.shape, s.dtype),
                             jax.eval_shape(update.init, latents, seeds, tables))
        loop = partial(sampling.denoise_step if pipe.stepwise else sampling.denoise, guided=name == "denoise")
        fn = lambda params, *a: loop(unet(params), *a)
        args = (pipe.params["unet"], state, batch((b, 2, tokens, pipe.context_dim)), lengths,
                batch((b, 2, pipe.pooled_dim)), batch((b, 6)), batch((b,)), tables,
                rep((), jnp.int32) if pipe.stepwise else rep((2,), jnp.int32))
        return shard(pipe.mesh, fn, (P(),) + (bat,) * 6 + (P(), P()), bat), args
    if name == "decode":
        fn = lambda params, x: sampling.decode(vae(params), x)
        return shard(pipe.mesh, fn, (P(), bat), (bat, bat)), (pipe.params["vae"], latents)
    if name == "preview":  # TAESD's image of the current clean-latents estimate, at preview size
        taesd = partial(nnx.merge, pipe.graphs["taesd"])
        fn = lambda params, x: decode_taesd(taesd(params), x, preview_size((w, h), pipe.vae_factor))
        return shard(pipe.mesh, fn, (P(), bat), bat), (pipe.params["taesd"], latents)
    raise ValueError(f"no program {name!r}; programs: {', '.join(PROGRAMS)}")
