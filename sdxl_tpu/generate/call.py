"""One call of a Pipeline, top to bottom: checked per-image parameters -> host arrays -> the
compiled programs in order (text, the starting image's latents, noise, the denoising loop,
decode) -> images; and with a hires fix a second pass at the larger size from the first pass's
upscaled latents or pixels (imaging/hires.py). pipeline.py holds what the programs run on."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

import jax
import numpy as np
from jax.sharding import NamedSharding
from PIL import Image

from ..request.errors import GenerationError, RequestError
from ..imaging.hires import UPSCALERS, Hires, latent_upscale
from ..request.request import GenerationResult, ImageInfo, guided
from ..imaging.clip_image import normalized
from ..imaging.resize import fit_image, image_array
from ..request.values import not_a_choice, schedule_input
from ..sampler.tables import Sampler
from ..weights.embeddings import Embeddings
from ..weights.refiner import RefinerModels
from . import sampling, starting
from .denoising_loop import HostNoise, denoise_fused, denoise_stepwise
from .preview import Previews
from .upscaling import ModelUpscalers
from .compiling.layout import Layout, Size
from .compiling.programs import REFINER_PROGRAMS, Params, Program, controlnet_key
from .control import ControlUnit, scale_table
from .refining import refiner_switch, refiner_time_ids

Progress = Callable[[int, int], None]


class Pipeline(Protocol):
    """What a call reads of its pipeline: pipeline.Pipeline, which calls run_call (a protocol, so
    this module imports nothing of pipeline.py, not even for type checking: no import cycle)."""

    images_per_call: int  # the compiled batch
    default_sampler: str
    samplers: dict[str, Sampler]
    tokenizers: tuple
    max_prompt_chunks: int
    embeddings: Embeddings  # the textual inversion embeddings its prompts may name
    upscalers: ModelUpscalers  # the hires fix's upscaler models
    force_zeros_for_empty_prompt: bool
    stepwise: bool  # one program a step (progress, previews, stop) or all steps fused
    vae_factor: int
    layout: Layout
    lock: threading.Lock  # one call on the devices at a time
    batch_sharding: NamedSharding
    replicated: NamedSharding
    step_index: list[jax.Array]  # the table rows' indices, on the devices

    @property
    def params(self) -> Params: ...  # each network's replicated parameters

    @property
    def zeros(self) -> Callable[..., jax.Array]: ...  # (shape, dtype): zeros per image of a call, on the devices

    @property
    def key_stream(self) -> Callable[..., jax.Array]: ...  # (stream): the seeds' keys, as the programs take them

    def compiled(self, size: Size, names: Sequence[str] | None = None) -> dict[str, Program]: ...

    controlnets: dict  # name -> ControlNetConfig
    ip_adapter: str | None  # the IP-Adapter's name (a unit naming it gives an image prompt), if one is loaded
    refiner: RefinerModels | None  # the refiner a call's steps after its switch run on, if one is loaded

    def call_programs(self, *, guided: bool = True, given_latents: bool = False, image: bool = False,
                      controlnets: Sequence[str] = (), image_prompt: bool = False, refiner: bool = False) -> tuple: ...

    def filled(self, per_image: np.ndarray) -> np.ndarray: ...


def run_call(pipe: Pipeline, infos: Sequence[ImageInfo], latents: np.ndarray | None,
             init_images: np.ndarray | None, masks: np.ndarray | None, progress: Progress | None,
             stop: Callable[[], bool] | None, preview: Callable | None, preview_every: int,
             controls: tuple[ControlUnit, ...] = ()) -> GenerationResult:
    """Pipeline.run_images, which says what each argument is."""
    n = len(infos)
    if not 1 <= n <= pipe.images_per_call:
        raise ValueError(f"a call makes 1 to {pipe.images_per_call} images, not {n}")
    infos = [dataclasses.replace(info, sampler=info.sampler or pipe.default_sampler) for info in infos]
    first = infos[0]
    shared = lambda i: (i.size, i.steps, i.sampler, i.schedule, i.strength, i.hires, i.refiner_switch_at)
    if any(shared(i) != shared(first) for i in infos):
        raise ValueError("the images of one call must share their size, step count, sampler, schedule, "
                         "denoising strength, hires fix and refiner switch")
    if (init_images is None) != (first.strength is None):
        raise ValueError("images that start from an image need their denoising strength, and only they")
    if (masks is not None and init_images is None) or (init_images is not None and latents is not None):
        raise ValueError("masks come with init_images, and init_images without latents")
    if first.hires is not None and (init_images is not None or latents is not None):
        raise ValueError("a hires fix starts from noise")
    if first.refiner_switch_at is not None and (pipe.refiner is None or controls or first.hires):
        raise RequestError("this server has no refiner" if pipe.refiner is None else
                           "the refiner with a hires fix, ControlNet or an IP-Adapter is not supported yet")
    # The IP-Adapter's unit, if any: its images are image prompts, the encoder's crops (clip_image.py).
    prompts = [u for u in controls if u.controlnet == pipe.ip_adapter]
    if len(prompts) > 1:
        raise RequestError("one IP-Adapter unit a call: its image prompt is one image")
    image_prompt = prompts[0] if prompts else None
    controls = tuple(u for u in controls if u is not image_prompt)
    if first.hires is not None and controls:  # (an image prompt guides both passes)
        raise RequestError("ControlNet with a hires fix is not supported yet: make the image, then upscale it "
                           "with img2img")
    side = pipe.layout.image_prompt_size
    for unit in (*controls, *prompts):
        shape = (n, side, side, 3) if unit is image_prompt else (n, first.size[1], first.size[0], 3)
        if unit.images.shape != shape or unit.images.dtype != np.uint8:
            raise ValueError(f"{unit.controlnet!r}: its images must be {shape} uint8 (n, H, W, 3: the call's size, or "
                             f"the image encoder's for an IP-Adapter); got {unit.images.shape} {unit.images.dtype}")
        if unit is image_prompt and unit.guess_mode:
            raise RequestError(f"IP-Adapter {unit.controlnet!r}: guess mode is a ControlNet's")
    if first.sampler not in pipe.samplers:
        raise RequestError(not_a_choice("Sampler", first.sampler, pipe.samplers))
    if first.hires is not None and first.hires.upscaler not in (offered := (*UPSCALERS, *pipe.upscalers.names)):
        raise RequestError(not_a_choice("Hires upscaler", first.hires.upscaler, offered))
    # What ran, as its parameters will say: Automatic resolved to the sampler's schedule.
    infos = [dataclasses.replace(info, schedule=schedule_input(first.sampler, first.schedule)) for info in infos]
    hires = first.hires
    # With a hires fix, progress counts both passes' steps, as A1111's does.
    total = first.steps + (0 if hires is None else _hires_steps(pipe, infos[0], hires))
    told = (lambda step, steps: progress(step, total)) if progress and hires else progress
    begin = None if init_images is None else starting.prepare(init_images, masks, infos, pipe.vae_factor)
    plan = call_passes(pipe, infos, controlnets=[u.controlnet for u in controls], image_prompt=image_prompt is not None,
                       image=begin is not None, latents=latents is not None)
    out, timings = run_pass(pipe, infos, plan[0][1], latents=latents, begin=begin, progress=told, stop=stop,
                            preview=preview, preview_every=preview_every, controls=controls, image_prompt=image_prompt,
                            decode=hires is None or hires.upscaler != "Latent")
    if hires is not None:
        second = [dataclasses.replace(i, size=hires.size, steps=hires.steps or i.steps, strength=hires.strength,
                                      hires=None) for i in infos]
        h, w, _ = pipe.layout.latent_shape(hires.size)
        if hires.upscaler == "Latent":
            upscaled, begin = latent_upscale(out, h, w), None
        else:  # the image upscaled by Lanczos, or by a model then Lanczos (A1111's resize_image)
            model = None if hires.upscaler == "Lanczos" else pipe.upscalers[hires.upscaler]
            pixels = np.stack([image_array(fit_image(Image.fromarray(im), hires.size) if model is None
                                           else model.resize(Image.fromarray(im), hires.size)) for im in out])
            upscaled, begin = None, starting.prepare(pixels, None, second, pipe.vae_factor)
        after = (lambda step, steps: progress(first.steps + step, total)) if progress else None
        out, more = run_pass(pipe, second, plan[1][1], start_latents=upscaled, begin=begin, progress=after, stop=stop,
                             preview=preview, preview_every=preview_every, image_prompt=image_prompt)
        timings = {k: timings.get(k, 0.0) + more.get(k, 0.0) for k in {*timings, *more}}
    images = [Image.fromarray(img) for img in out]
    if init_images is not None:
        images = starting.finish(images, np.asarray(init_images), masks, infos)
    return GenerationResult(images=images, infos=infos, timings=timings)


def call_passes(pipe: Pipeline, infos: Sequence[ImageInfo], *, controlnets: Sequence[str] = (),
                image_prompt: bool = False, image: bool = False, latents: bool = False) -> list[tuple[Size, tuple]]:
    """The programs each pass of a call of `infos` runs, by size: the first's (from noise, `latents` or an
    `image`; the refiner's where it switches), then a hires fix's (from the first's image, or latents by Latent)."""
    first, guidance = infos[0], guided(infos)
    refine = pipe.refiner is not None and first.refiner_switch_at is not None
    passes = [(first.size, pipe.call_programs(guided=guidance, given_latents=latents, image=image, refiner=refine,
                                              controlnets=controlnets, image_prompt=image_prompt))]
    if first.hires is not None:  # (an image prompt guides both passes)
        passes.append((first.hires.size, pipe.call_programs(guided=guidance, image=first.hires.upscaler != "Latent",
                                                            image_prompt=image_prompt)))
    return passes


def _hires_steps(pipe: Pipeline, info: ImageInfo, hires: Hires) -> int:
    """The steps a hires pass runs (those its strength leaves, as for any image)."""
    steps = hires.steps or info.steps
    sampler = pipe.samplers[info.sampler or pipe.default_sampler]
    return steps - sampler.first_step(steps, hires.strength, info.schedule)


def run_pass(pipe: Pipeline, infos: list[ImageInfo], names: Sequence[str], *, latents: np.ndarray | None = None,
             begin: starting.Start | None = None, start_latents: np.ndarray | None = None,
             progress: Progress | None = None, stop: Callable[[], bool] | None = None, preview: Callable | None = None,
             preview_every: int = 0, decode: bool = True, controls: tuple[ControlUnit, ...] = (),
             image_prompt: ControlUnit | None = None) -> tuple[np.ndarray, dict[str, float]]:
    """One pass of the denoising loop for `infos` (all of one size, steps, sampler, schedule and
    strength): from noise, from given initial `latents` (diffusers' layout), from starting images
    (`begin`: encoded first) or from their latents (`start_latents`, (n, h, w, C)); guided by
    ControlNets (`controls`) and an IP-Adapter's image (`image_prompt`), running the programs of
    `names` (call_passes'). Returns the decoded images (n, H, W, 3) uint8 (or with `decode` False
    the final latents) and its timings."""
    n, first = len(infos), infos[0]
    size, steps, strength, schedule = first.size, first.steps, first.strength, first.schedule
    refiner, switch_at = pipe.refiner, first.refiner_switch_at
    # Only what this pass runs (all of them, where the pipeline was warmed up: nothing compiles then).
    programs = pipe.compiled(size, names)
    slots = infos + [infos[-1]] * (pipe.images_per_call - n)
    text = sampling.prepare(pipe.tokenizers, slots, pipe.force_zeros_for_empty_prompt, pipe.max_prompt_chunks,
                            pipe.embeddings)
    h, w, c = pipe.layout.latent_shape(size)
    if latents is not None:
        if (latents := np.asarray(latents, np.float32)).shape != (n, c, h, w):
            raise RequestError(f"latents must have shape {(n, c, h, w)}, got {latents.shape}.")
        latents = pipe.filled(latents)
    put = lambda x: jax.device_put(x, pipe.batch_sharding)
    sampler = pipe.samplers[first.sampler or pipe.default_sampler]
    host_tables = sampler.padded_tables(steps, schedule, strength)  # (strength: None from noise)
    # diffusers' inpainting at full strength on the checkpoint's schedule starts from the noise alone
    # (is_strength_max), and with an inpainting UNet does not encode the image for it.
    from_noise = strength == 1.0 and schedule == "Checkpoint" and first.masked_content is not None
    if from_noise:
        host_tables = host_tables._replace(init_image=np.float32(0.0),
                                           init_sigma=sampler.padded_tables(steps, schedule).init_sigma)
    # A row is one model evaluation; a step is one row, or two (DPM++ SDE's midpoint). From an
    # image, the steps its strength leaves.
    step_ends = sampler.step_ends(steps - sampler.first_step(steps, strength, schedule))
    tables = jax.device_put(host_tables, pipe.replicated)
    seeds = put(np.array([i.seed for i in slots], np.uint32))
    # RNG CPU: each image that draws its own noise, as A1111's ImageRNG draws it (denoising_loop.py).
    own = np.array([i.rng == "CPU" for i in slots])
    host = HostNoise([i.seed if cpu else None for i, cpu in zip(slots, own)], (c, h, w), host_tables, step_ends[-1],
                     put)
    zeros = pipe.zeros((h, w, c))
    inpainting_unet = pipe.layout.condition_channels > 0
    encodes_image = begin is not None and not (from_noise and inpainting_unet)

    with pipe.lock:
        start = time.perf_counter()
        lengths = put(text.lengths)
        context, pooled, cross_kv = programs["encode"](pipe.params["text_encoder"], pipe.params["text_encoder_2"],
                                                       pipe.params["unet"], *map(put, text[:6]), lengths,
                                                       put(text.zero_negative))
        image_kv = ()
        refined_text: Any = ()  # (the refiner's context, pooled, keys and values)
        if image_prompt is not None:  # (its keys and values, once a call, as the text's)
            image_kv = programs["image_prompt"](pipe.params["image_encoder"], pipe.params["ip_adapter"],
                                                put(pipe.filled(normalized(image_prompt.images))))
        if refiner is not None and switch_at is not None:  # (the refiner's text, dispatched beside the model's)
            refined_text = programs[REFINER_PROGRAMS[0]](
                pipe.params["text_encoder"], pipe.params["refiner/text_encoder_2"], pipe.params["refiner/unet"],
                *map(put, text[:6]), lengths, put(text.zero_negative & refiner.force_zeros_for_empty_prompt))
        image, image_seconds = zeros if start_latents is None else put(pipe.filled(start_latents)), 0.0
        keep, fill = pipe.zeros((h, w, 1)), pipe.zeros((), np.int32)
        # The host's draws in diffusers' order: the image's VAE sample, the initial noise, the masked image's.
        draws = [host.draw() if host and needed else zeros
                 for needed in (encodes_image, latents is None, inpainting_unet)]
        encode = lambda source, masked, draw, stream: programs["encode_image"](
            pipe.params["vae"], put(pipe.filled(source.pixels)), masked, seeds, draw, put(own), pipe.key_stream(stream))
        mask, masked_image = pipe.zeros((h, w, 1)), zeros
        if begin is not None or inpainting_unet:
            jax.block_until_ready((context, pooled))  # (timed apart: what an image adds to a call)
            began = time.perf_counter()
            if encodes_image:
                image = encode(begin, pipe.zeros((size[1], size[0]), np.uint8), draws[0], sampling.ENCODE_STREAM)
            if begin is not None:
                keep, fill = put(pipe.filled(begin.keep)), put(pipe.filled(begin.fill))
            if inpainting_unet:
                conditioned = begin or starting.blank(n, size, pipe.vae_factor)
                masked_image = encode(conditioned, put(pipe.filled(conditioned.masked)), draws[2],
                                      sampling.CONDITION_STREAM)
                mask = put(pipe.filled(starting.condition_mask(conditioned, pipe.vae_factor)))
            jax.block_until_ready((image, masked_image))
            image_seconds = time.perf_counter() - began
        if latents is None:
            state = programs["noise"](seeds, tables, draws[1], put(own), image, keep, fill, mask, masked_image)
        else:
            state = programs["init"](put(latents.transpose(0, 2, 3, 1)), seeds, tables, mask, masked_image)
            state = state._replace(host_noise=put(own))
        if inpainting_unet and schedule == "Checkpoint":
            # On the checkpoint's schedule diffusers re-imposes the known latents on a base UNet only
            # (A1111's CFGDenoiser, on its schedule types, on any UNet).
            state = state._replace(keep=pipe.zeros((h, w, 1)))
        jax.block_until_ready((context, pooled, state, image_kv, refined_text))
        t_text = time.perf_counter()
        conditioning = (context, cross_kv, lengths, pooled, put(text.time_ids), put(text.guidance), tables)
        denoise, extra = partial(programs[names[2]], pipe.params["unet"]), ()
        if image_prompt is not None:  # (its scale per row: one "residual", the same for both passes)
            extra += (image_kv, put(scale_table(image_prompt, 1, True, step_ends, pipe.images_per_call)[..., 0]))
        if controls:
            nets = tuple(pipe.params[controlnet_key(u.controlnet)] for u in controls)
            images = tuple(put(pipe.filled(u.images)) for u in controls)
            scales = tuple(put(scale_table(u, pipe.controlnets[u.controlnet].residuals,
                                           pipe.controlnets[u.controlnet].global_pool_conditions, step_ends,
                                           pipe.images_per_call)) for u in controls)
            extra += (nets, images, scales)
        if extra:
            plain = denoise  # (the image prompt's and the ControlNets' arguments come after the step's)
            denoise = lambda *a: plain(*a, *extra)  # noqa: E731
        switch, refined, r_conditioning = step_ends[-1], denoise, conditioning  # (the rows the refiner runs: none)
        if refiner is not None and switch_at is not None:  # its text's keys and values; each pass's size numbers
            r_context, r_pooled, r_kv = refined_text
            r_conditioning = (r_context, r_kv, lengths, r_pooled, put(refiner_time_ids(text.time_ids)),
                              *conditioning[5:])
            refined = partial(programs[REFINER_PROGRAMS[1 if guided(infos) else 2]], pipe.params["refiner/unet"])
            switch = refiner_switch(host_tables.timesteps, step_ends, switch_at, sampler.num_train_timesteps)

        def rows(s, first: int, end: int):  # rows first to end: the model's before the switch, the refiner's after
            if first < switch:
                s = denoise(s, *conditioning, np.array([first, min(end, switch)], np.int32))
            if end > switch:
                s = refined(s, *r_conditioning, np.array([max(first, switch), end], np.int32))
            return s

        if pipe.stepwise:
            on_device = partial(programs["preview"], pipe.params["taesd"]) if "preview" in programs else None
            previews = Previews(on_device, n, len(step_ends), preview, preview_every)  # (the steps that run)
            state = denoise_stepwise(lambda s, i: denoise(s, *conditioning, pipe.step_index[i]) if i < switch else
                                     refined(s, *r_conditioning, pipe.step_index[i]),
                                     state, step_ends, host, previews, progress, stop)
        else:
            state = denoise_fused(rows, state, step_ends, host, progress)
        t_denoise = time.perf_counter()
        if decode:
            out, finite = programs["decode"](pipe.params["vae"], state.x)
            out, finite = np.asarray(out)[:n], np.asarray(finite)[:n]  # (slicing on the device would compile)
        else:
            out = np.asarray(state.x)[:n]
            finite = np.isfinite(out).all(axis=(1, 2, 3))
        t_decode = time.perf_counter()
    if not finite.all():
        bad = [infos[i].seed for i in np.flatnonzero(~finite)]
        raise GenerationError(f"the model produced non-finite values (NaN/inf) for seeds {bad}; "
                              "try float32 or another seed")
    timings = {"text_encoding": t_text - start - image_seconds, "denoising": t_denoise - t_text,
               "decoding": t_decode - t_denoise, "total": t_decode - start}
    if begin is not None or inpainting_unet:
        timings["image_encoding"] = image_seconds
    return out, timings


__all__ = ["run_call", "run_pass"]
