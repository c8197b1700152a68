"""The sharded programs of one image size: each a stage of sampling.py under jax.shard_map over a
one-axis Mesh, parameters replicated (P()), the image batch split (P(BATCH)), with the abstract
arguments to lower it with. What they are built for besides the size is a small `Layout`; the
networks come as their graphs and (replicated) parameter states."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TypeAlias, cast

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from ...sampler.tables import MAX_ROWS, Tables
from .. import sampler_update, sampling
from ..preview import decode_taesd, preview_size
from .layout import BATCH, Layout, Size

Graphs = Mapping[str, nnx.GraphDef]  # each network's module graph, by NETWORKS' names (and "taesd")
Params = Mapping[str, nnx.State]  # each network's parameters (replicated; abstract before the weights)
Program = jax.stages.Compiled  # one compiled program, as JAX makes it or reads it back
# One argument of a program: a pytree (nnx.State, Tables, sampler_update.State, tuples) whose leaves are
# jax.ShapeDtypeStructs to lower it with (the parameters' are jax.Arrays once the weights are in).
PyTree: TypeAlias = "jax.ShapeDtypeStruct | jax.Array | nnx.State | tuple[PyTree, ...]"
Args = tuple[PyTree, ...]  # a program's arguments, in order
Specs = P | tuple[P, ...]  # how a program's outputs are split over the mesh: one spec for all, or one each

NETWORKS = ("text_encoder", "text_encoder_2", "unet", "vae")
# denoise: with classifier-free guidance; denoise_unguided: the conditional pass alone, for calls
# whose every image has guidance <= 1 (distilled models): half the UNet batch. (And "preview", with TAESD.)
# encode_image: an image's latents (img2img), sampled with JAX's noise or the host's.
PROGRAMS = ("encode", "encode_image", "noise", "init", "denoise", "denoise_unguided", "decode")
# With an IP-Adapter: its image's keys and values (image_prompt), and each denoising step with them.
IMAGE_PROMPT = "_ip"  # (the denoising step's name's suffix)
IP_PROGRAMS = ("image_prompt", "denoise" + IMAGE_PROMPT, "denoise_unguided" + IMAGE_PROMPT)
IP_NETWORKS = ("image_encoder", "ip_adapter")  # (their entries in Graphs and Params)
# With a refiner: its text's and its denoising steps (the steps after the switch), on its networks.
REFINER = "refiner_"
REFINER_PROGRAMS = tuple(REFINER + name for name in ("encode", "denoise", "denoise_unguided"))
# Their compile's length on one TPU v5e at 1024x1024 (2026-12-05: the denoising steps 124-128 s, the
# decoder 114, TAESD's preview smaller, the text encoders 36, the image encoder 14, the rest 0.1-1.5):
# traced in this order, each compile starting once its program is, a size's compiles end soonest.
SLOWEST_FIRST = ("denoise_ip", "denoise", "denoise_unguided_ip", "denoise_unguided", "refiner_denoise",
                 "refiner_denoise_unguided", "decode", "preview", "encode", "refiner_encode", "image_prompt",
                 "encode_image", "noise", "init")


def slowest_first(names: Sequence[str]) -> list[str]:
    """`names` in SLOWEST_FIRST's order (a denoising step with ControlNets, slower still, first)."""
    return sorted(names, key=lambda name: (SLOWEST_FIRST.index(name.split("+")[0]), -name.count("+")))


def shard(mesh: Mesh, fn: Callable, in_specs: tuple[Specs, ...], out_specs: Specs) -> jax.stages.Wrapped:
    # check_vma=False: Pallas kernels (splash attention, traced for TPU) declare their outputs
    # without varying-axis types, which the check would reject; every output here is batch-split.
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False))


def controlled(name: str, controlnets: Sequence[str]) -> str:
    """The program `name` (denoise or denoise_unguided, _ip with an image prompt) with these
    ControlNets (the pipeline's, by name) adding their residuals: one program per combination, e.g.
    "denoise+canny+depth"."""
    return "+".join([name, *controlnets])


def denoise_name(guided: bool = True, image_prompt: bool = False, controlnets: Sequence[str] = ()) -> str:
    """The denoising step's program: with guidance, an IP-Adapter's image, these ControlNets."""
    return controlled(("denoise" if guided else "denoise_unguided") + (IMAGE_PROMPT if image_prompt else ""),
                      controlnets)


def controlnet_key(name: str) -> str:
    """A ControlNet's entry in Graphs and Params."""
    return f"controlnet/{name}"


def program(name: str, layout: Layout, size: Size, graphs: Graphs,
            params: Params) -> tuple[jax.stages.Wrapped, Args]:
    """The jitted program `name` for `size`, and abstract arguments to lower or trace it with."""
    if name in REFINER_PROGRAMS:  # (on the refiner's networks, in their layout)
        if not layout.refiner_pooled_dim:
            raise ValueError(f"no program {name!r}: no refiner is loaded")
        keys = {key: f"refiner/{key}" for key in ("unet", "text_encoder_2")}
        return _BUILDERS[name.removeprefix(REFINER)](_Shapes(layout.for_refiner, size), {**graphs, **{
            k: graphs[v] for k, v in keys.items()}}, {**params, **{k: params[v] for k, v in keys.items()}})
    base, *controlnets = name.split("+")
    if base not in _BUILDERS or (controlnets and not base.startswith("denoise")):
        raise ValueError(f"no program {name!r}; programs: "
                         f"{', '.join([*PROGRAMS, 'preview', *IP_PROGRAMS, *REFINER_PROGRAMS])}")
    if (base == "image_prompt" or base.endswith(IMAGE_PROMPT)) and "ip_adapter" not in graphs:
        raise ValueError(f"no program {name!r}: no IP-Adapter is loaded")
    if missing := [c for c in controlnets if controlnet_key(c) not in graphs]:
        raise ValueError(f"no ControlNet {missing[0]!r} for program {name!r}")
    if controlnets:
        return _BUILDERS[base](_Shapes(layout, size), graphs, params, controlnets=tuple(controlnets))
    return _BUILDERS[base](_Shapes(layout, size), graphs, params)


class _Shapes:
    """The abstract arguments of one layout and size."""

    def __init__(self, layout: Layout, size: tuple[int, int]):
        self.layout, self.size, b = layout, size, layout.batch
        self.batch = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype,
                                                                            sharding=layout.batch_sharding)
        self.rep = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype, sharding=layout.replicated)
        self.ids = self.batch((b, 2, layout.chunks, sampling.MAX_TOKENS), jnp.int32)
        self.weights = self.batch((b, 2, layout.chunks, sampling.MAX_TOKENS))
        self.embedded = tuple(self.batch((b, 2, layout.chunks, sampling.MAX_TOKENS, width),
                                         jnp.dtype(layout.text_dtype)) for width in layout.text_widths)
        self.lengths = self.batch((b, 2), jnp.int32)
        self.latents = self.batch((b, *layout.latent_shape(size)))
        self.seeds = self.batch((b,), jnp.uint32)
        self.flags = self.batch((b,), jnp.bool_)
        self.tables = Tables(self.rep((MAX_ROWS,)), self.rep((MAX_ROWS,)), self.rep((MAX_ROWS, 6)), self.rep(()),
                             self.rep(()), self.rep((MAX_ROWS, 5)))
        self.images = self.batch((b, size[1], size[0], 3), jnp.uint8)
        self.masked = self.batch((b, size[1], size[0]), jnp.uint8)
        self.stream = self.rep((), jnp.uint32)
        self.mask = self.batch((b, *layout.latent_shape(size)[:2], 1))
        self.keep = self.batch((b, *layout.latent_shape(size)[:2], 1))
        self.codes = self.batch((b,), jnp.int32)
        # SDXL's six size and crop numbers an image; a refiner's five a pass (with its aesthetic score)
        self.time_ids = self.batch((b, 2, 5) if layout.refiner else (b, 6))
        side = layout.image_prompt_size  # (an IP-Adapter's image prompts, as its encoder takes them)
        self.prompt_pixels = self.batch((b, side, side, 3))


def _network(graphs: Graphs, name: str) -> Callable:
    return partial(nnx.merge, graphs[name])


def _encode(s: _Shapes, graphs, params):
    """Token ids -> the context, pooled, and the UNet's cross-attention keys and values of it."""
    te1, te2, unet = _network(graphs, "text_encoder"), _network(graphs, "text_encoder_2"), _network(graphs, "unet")
    first = not s.layout.refiner  # (a refiner's context: the second encoder's alone)

    def fn(p1, p2, pu, *a):
        context, pooled = sampling.encode_text(te1(p1) if first else None, te2(p2), *a)
        return context, pooled, sampling.cross_attention_kv(unet(pu), context)

    bat = P(BATCH)
    return shard(s.layout.mesh, fn, (P(), P(), P()) + (bat,) * 8, (bat, bat, bat)), (
        params["text_encoder"], params["text_encoder_2"], params["unet"], s.ids, s.ids, s.weights, s.weights,
        *s.embedded, s.lengths, s.flags)


def _unit_noise(seeds, host, use_host, shape: tuple[int, int, int], stream: int | None = None) -> jax.Array:
    """Each image's unit noise: the host's where it draws its own (RNG CPU), else JAX's from its seed."""
    return jnp.where(use_host[:, None, None, None], host, sampling.get_noise(seeds, *shape, stream=stream))


def _noise(s: _Shapes, graphs, params):
    """JAX's initial noise, or the host's for the images that draw their own (RNG CPU), and the
    images' latents it noises (img2img; zeros from noise alone), kept where `keep` is 1
    (inpainting), where the mask repaints them replaced as starting.LATENT_FILL says (A1111: by the
    initial noise, or by nothing); an inpainting UNet's condition carried along."""
    h, w, c = s.layout.latent_shape(s.size)

    def fn(seeds, tables, host, use_host, image, keep, fill, mask, masked_image):
        noise = _unit_noise(seeds, host, use_host, (h, w, c))
        fill = fill[:, None, None, None]
        image = jnp.where(fill == 1, image * keep + noise * (1 - keep), jnp.where(fill == 2, image * keep, image))
        condition = _condition(s.layout, mask, masked_image)
        return sampler_update.init(noise, seeds, tables, image, keep, condition, s.layout.noise_rows)._replace(
            host_noise=use_host)

    bat = P(BATCH)
    return shard(s.layout.mesh, fn, (bat, P(), bat, bat, bat, bat, bat, bat, bat), bat), (
        s.seeds, s.tables, s.latents, s.flags, s.latents, s.keep, s.codes, s.mask, s.latents)


def _condition(layout: Layout, mask: jax.Array, masked_image: jax.Array) -> jax.Array | None:
    """An inpainting UNet's input beside the latents: the mask, then the masked image's latents
    (diffusers' order); None for a base UNet."""
    return jnp.concatenate([mask, masked_image], axis=-1) if layout.condition_channels else None


def _encode_image(s: _Shapes, graphs, params):
    """Images -> their latents, the VAE's sample drawn by JAX (from the seed's key's `stream`) or
    given by the host (RNG CPU); the pixels where `masked` is 1 encoded as zeros (an inpainting
    UNet's masked image)."""
    vae, (h, w, c), bat = _network(graphs, "vae"), s.layout.latent_shape(s.size), P(BATCH)

    def fn(p, images, masked, seeds, host, use_host, stream):
        noise = _unit_noise(seeds, host, use_host, (h, w, c), stream=stream)
        return sampling.encode_image(vae(p), images, noise, masked)

    return shard(s.layout.mesh, fn, (P(), bat, bat, bat, bat, bat, P()), bat), (
        params["vae"], s.images, s.masked, s.seeds, s.latents, s.flags, s.stream)


def _init(s: _Shapes, graphs, params):
    """The state from initial latents the caller gives (and an inpainting UNet's condition)."""
    bat = P(BATCH)
    fn = lambda latents, seeds, tables, mask, masked_image: sampler_update.init(
        latents, seeds, tables, condition=_condition(s.layout, mask, masked_image), noise_rows=s.layout.noise_rows)
    return shard(s.layout.mesh, fn, (bat, bat, P(), bat, bat), bat), (s.latents, s.seeds, s.tables, s.mask, s.latents)


def _image_prompt(s: _Shapes, graphs, params):
    """An IP-Adapter's image prompts -> its keys and values of every image's two passes."""
    encoder, adapter, bat = _network(graphs, "image_encoder"), _network(graphs, "ip_adapter"), P(BATCH)
    fn = lambda pe, pa, pixels: sampling.image_prompt_kv(encoder(pe), adapter(pa), pixels)
    return shard(s.layout.mesh, fn, (P(), P(), bat), bat), (params["image_encoder"], params["ip_adapter"],
                                                             s.prompt_pixels)



def _denoise(s: _Shapes, graphs, params, guided: bool, image_prompt: bool = False, controlnets: tuple[str, ...] = ()):
    """One step (stepwise: the last argument is the step) or all of them; with an `image_prompt`,
    its keys and values and scale tables after the step (sampling.ImagePromptInput); with
    `controlnets`, each one's parameters, control images and scale tables after those (sampling.Control)."""
    layout, unet, bat = s.layout, _network(graphs, "unet"), P(BATCH)
    condition = cast(jax.Array, s.batch((layout.batch, *layout.condition_shape(s.size))))  # (its shape: eval_shape)
    context = s.batch((layout.batch, 2, layout.chunks * sampling.MAX_TOKENS, layout.context_dim))
    # The state's and the text's cross-attention keys' and values' shapes, in one trace.
    state, cross_kv = jax.tree.map(lambda x: s.batch(x.shape, x.dtype), jax.eval_shape(
        lambda latents, seeds, tables, p, c: (
            sampler_update.init(latents, seeds, tables, condition=condition, noise_rows=layout.noise_rows),
            sampling.cross_attention_kv(unet(p), c)), s.latents, s.seeds, s.tables, params["unet"], context))
    loop = partial(sampling.denoise_step if layout.stepwise else sampling.denoise, guided=guided)
    nets = [_network(graphs, controlnet_key(name)) for name in controlnets]

    def fn(p, *a):
        control = image = None
        if nets:
            *a, nets_p, images, scales = a
            control = sampling.Control(tuple(net(q) for net, q in zip(nets, nets_p, strict=True)), images, scales)
        if image_prompt:
            *a, kv, scales = a
            image = sampling.ImagePromptInput(kv, scales)
        return loop(unet(p), *a, control=control, image=image)

    args = (params["unet"], state, context, cross_kv, s.lengths, s.batch((layout.batch, 2, layout.pooled_dim)),
            s.time_ids, s.batch((layout.batch,)), s.tables,
            s.rep((), jnp.int32) if layout.stepwise else s.rep((2,), jnp.int32))
    specs = (P(),) + (bat,) * 7 + (P(), P())
    if image_prompt:
        fn_kv, kv_args = _image_prompt(s, graphs, params)
        kv = jax.tree.map(lambda x: s.batch(x.shape, x.dtype), jax.eval_shape(fn_kv, *kv_args))
        args += (kv, s.batch((layout.batch, 2, MAX_ROWS)))
        specs += (bat, bat)
    if controlnets:
        states = tuple(params[controlnet_key(name)] for name in controlnets)
        images = tuple(s.batch((layout.batch, s.size[1], s.size[0], 3), jnp.uint8) for _ in controlnets)
        scales = tuple(s.batch((layout.batch, 2, MAX_ROWS, _residuals(params, name))) for name in controlnets)
        args += (states, images, scales)
        specs += ((P(),) * len(controlnets), (bat,) * len(controlnets), (bat,) * len(controlnets))
    return shard(layout.mesh, fn, specs, bat), args


def _residuals(params: Params, name: str) -> int:
    """How many residuals a ControlNet of the pipeline returns: one per zero convolution of its skips,
    and its mid block's."""
    return len(params[controlnet_key(name)]["controlnet_down_blocks"]) + 1


def _decode(s: _Shapes, graphs, params):
    vae, bat = _network(graphs, "vae"), P(BATCH)
    fn = lambda p, x: sampling.decode(vae(p), x)
    return shard(s.layout.mesh, fn, (P(), bat), (bat, bat)), (params["vae"], s.latents)


def _preview(s: _Shapes, graphs, params):
    """TAESD's image of the current clean-latents estimate, at preview size."""
    taesd, at, bat = _network(graphs, "taesd"), preview_size(s.size, s.layout.vae_factor), P(BATCH)
    fn = lambda p, x: decode_taesd(taesd(p), x, at)
    return shard(s.layout.mesh, fn, (P(), bat), bat), (params["taesd"], s.latents)


_BUILDERS = {"encode": _encode, "encode_image": _encode_image, "noise": _noise, "init": _init,
             "denoise": partial(_denoise, guided=True), "denoise_unguided": partial(_denoise, guided=False),
             "denoise" + IMAGE_PROMPT: partial(_denoise, guided=True, image_prompt=True),
             "denoise_unguided" + IMAGE_PROMPT: partial(_denoise, guided=False, image_prompt=True),
             "image_prompt": _image_prompt, "decode": _decode, "preview": _preview}
