"""One compiled, replicated SDXL pipeline: compilation, sharding and dispatch of sampling.py.

`Pipeline` compiles the stages of sampling.py once per image size (ahead of time), with the
parameters replicated on every device and the image batch split across them (jax.shard_map over
a one-axis Mesh): a device makes its own images, conditional and unconditional pass included,
and never talks to another. Everything a user changes per request (prompts, seeds, guidance,
steps, size micro-conditioning) is an input of the compiled programs, never a reason to compile.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from jax.typing import DTypeLike

from ..sampler.tables import MAX_ROWS, Sampler
from ..a1111.infotext import Stamp
from ..a1111.dynamic_prompts import Wildcards
from ..a1111.prompts import DEFAULT_MAX_CHUNKS, MAX_CHUNKS
from ..imaging.image_input import ImageInput
from ..models.controlnet import ControlNetModel
from ..request.errors import RequestError
from ..request.request import GenerationResult, ImageInfo, Request
from ..request.values import format_size, not_a_choice, size_input
from ..weights.checkpoint import Models
from ..weights.embeddings import Embeddings
from ..weights.ip_adapter import ImagePromptModels
from ..weights.refiner import RefinerModels
from .upscaling import ModelUpscalers
from .call import run_call
from .control import ControlUnit, checked_names, units_of
from .compiling.compiled import CompiledPrograms
from .compiling.layout import BATCH, Device, Layout, Size, call_batch
from .compiling.programs import (NETWORKS, PROGRAMS, REFINER_PROGRAMS, Program, controlled, controlnet_key,
                                 denoise_name, program)
from .compiling.stored_programs import ProgramStore
from .networks import Networks

class Pipeline:
    """SDXL compiled for a fixed set of image sizes and images per call, replicated on `mesh`.

    `params` holds each network's replicated parameter state (swap an entry for other weights of
    the same architecture). `samplers` are the samplers a request may name (the first, or
    `default_sampler`, when it names none). `step_progress` compiles one program per step, so progress can be
    reported (and a call stopped) per step; without it all steps run in one fused loop on the device.
    `program_store` (stored_programs.py): where compiled programs are kept, and loaded untraced.
    """

    def __init__(self, models: Models, tokenizers: tuple, samplers: Sampler | Mapping[str, Sampler], *,
                 default_sampler: str | None = None, sizes: Sequence[Size | str] = ((1024, 1024),),
                 network_sizes: Sequence[Size | str] | None = None,
                 images_per_call: int = 4, devices: Sequence[Device] | None = None, model_name: str = "",
                 force_zeros_for_empty_prompt: bool = True, step_progress: bool = True,
                 preview_decoder: nnx.Module | None = None, max_prompt_chunks: int = DEFAULT_MAX_CHUNKS,
                 stamp: Stamp | None = None, program_store: ProgramStore | None = None,
                 controlnets: Mapping[str, ControlNetModel] | None = None, embeddings: Embeddings | None = None,
                 upscalers: ModelUpscalers | None = None, image_prompt: ImagePromptModels | None = None,
                 refiner: RefinerModels | None = None):
        devices = list(devices or jax.devices())
        self.mesh = Mesh(np.array(devices), (BATCH,))
        self.images_per_call = call_batch(images_per_call, len(devices))
        # Samplers are tables for one compiled update (sampler/tables.py): any of them per request.
        self.samplers = {samplers.name: samplers} if isinstance(samplers, Sampler) else dict(samplers)
        self.default_sampler = default_sampler or next(iter(self.samplers))
        self.tokenizers, self.model_name = tokenizers, model_name
        self.stamp = stamp or Stamp(model_name)  # what its images' parameters say made them
        self.force_zeros_for_empty_prompt, self.stepwise = force_zeros_for_empty_prompt, step_progress
        if not 1 <= max_prompt_chunks <= MAX_CHUNKS:
            raise ValueError(f"max_prompt_chunks {max_prompt_chunks}: from 1 to {MAX_CHUNKS} chunks of 75 tokens")
        # Room for the longest prompt in every program; a shorter one's chunks are masked out.
        self.max_prompt_chunks = max_prompt_chunks
        # Textual inversion embeddings the prompts may name (inputs of the text program); the hires fix's upscalers.
        self.embeddings, self.upscalers = embeddings or Embeddings.none_for(models), upscalers or ModelUpscalers()
        self.layout = Layout(
            mesh=self.mesh, batch=self.images_per_call, vae_factor=2 ** (len(models.vae.config.block_out_channels) - 1),
            latent_channels=models.vae.config.latent_channels, condition_channels=models.condition_channels,
            chunks=max_prompt_chunks, text_widths=self.embeddings.dims, text_dtype=str(self.embeddings.dtype),
            pooled_dim=models.pooled_dim, stepwise=step_progress,
            image_prompt_size=image_prompt.encoder.config.image_size if image_prompt else 0,
            refiner_pooled_dim=refiner.text_encoder_2.config.projection_dim or 0 if refiner else 0)
        self.vae_factor = self.layout.vae_factor
        self.sizes = self.layout.checked_sizes(sizes)
        self.network_sizes = [size_input(s, self.sizes) for s in (sizes if network_sizes is None else network_sizes)]
        self.lock = threading.Lock()
        self.batch_sharding, self.replicated = self.layout.batch_sharding, self.layout.replicated
        # Each network's graph and replicated parameters (networks.py; abstract ones until take_weights).
        self.networks = Networks(self.replicated)
        self.graphs, self.params = self.networks.graphs, self.networks.params
        for name in NETWORKS:
            self.networks.add(name, getattr(models, name))
        # Live previews: TAESD on the device when given, else the linear approximation on the host.
        self.preview_decoder = "taesd" if preview_decoder is not None else "approx"
        if preview_decoder is not None:
            self.networks.add("taesd", preview_decoder)
        # ControlNets a call may use, by name (models/controlnet.py), each joining the step (programs.controlled).
        self.controlnets = {}
        for name, net in checked_names(controlnets or {}).items():
            self.networks.add(controlnet_key(name), net)
            self.controlnets[name] = net.config
        # An IP-Adapter a call's unit may name (its image's keys and values: the image_prompt program).
        self.ip_adapter = None if image_prompt is None else image_prompt.name
        if image_prompt is not None:
            self.networks.add("image_encoder", image_prompt.encoder)
            self.networks.add("ip_adapter", image_prompt.adapter)
        self.refiner = refiner  # (the steps after a call's switch run on it: REFINER_PROGRAMS)
        if refiner is not None:
            self.networks.add("refiner/unet", refiner.unet)
            self.networks.add("refiner/text_encoder_2", refiner.text_encoder_2)
        self._compiled = CompiledPrograms(self.layout, self.graphs, self.params, program_store)
        self.program_store = program_store
        # Row indices live on the devices already, so the stepwise loop transfers nothing per step.
        self.step_index = [jax.device_put(np.int32(i), self.replicated) for i in range(MAX_ROWS)]

    @property
    def has_weights(self) -> bool:
        return not self.networks.abstract

    def take_weights(self, models: Models) -> None:
        """The weights of `models`, networks of the shapes this pipeline was built for (its
        abstract ones, filled): what it computes with from now on; compiled programs are kept."""
        self.networks.take(models)

    # -- the sharded programs -------------------------------------------------------------------

    def trace(self, name: str, size: Size | str) -> jax.stages.Traced:
        """Program `name` for `size`, traced but not compiled (to inspect or lower elsewhere)."""
        fn, args = program(name, self.layout, size_input(size, self.sizes), self.graphs, self.params)
        return fn.trace(*args)

    def programs_at(self, size: Size | None = None) -> tuple[str, ...]:
        """The programs of `size` compiled before a call asks: PROGRAMS, TAESD's preview, and at `network_sizes`
        (or size None) the IP-Adapter's, the refiner's and each ControlNet's guided step; others when asked."""
        plain = PROGRAMS + (("preview",) if self.preview_decoder == "taesd" else ())
        if size is not None and size not in self.network_sizes:
            return plain
        return (plain + (("image_prompt", denoise_name(image_prompt=True)) if self.ip_adapter else ())
                + (REFINER_PROGRAMS[:2] if self.refiner else ())
                + tuple(controlled("denoise", [name]) for name in self.controlnets))

    def call_programs(self, *, guided: bool = True, given_latents: bool = False, image: bool = False,
                      controlnets: Sequence[str] = (), image_prompt: bool = False,
                      refiner: bool = False) -> tuple[str, ...]:
        """The programs one pass of a call runs: `guided` (a guidance scale above 1), from
        `given_latents` (diffusers' latents=) or from an `image`, with `controlnets` (by name), an
        `image_prompt` (the IP-Adapter's) and the `refiner`; the defaults: text to image. The
        denoising step's is third (the refiner's: last)."""
        denoise = denoise_name(guided, image_prompt, controlnets)
        return ("encode", "init" if given_latents else "noise", denoise, "decode",
                *(("image_prompt",) if image_prompt else ()),
                *((REFINER_PROGRAMS[0], REFINER_PROGRAMS[1 if guided else 2]) if refiner else ()),
                *(("encode_image",) if image or self.layout.condition_channels else ()),
                *(("preview",) if self.preview_decoder == "taesd" and self.stepwise else ()))

    def compiled(self, size: Size | str, names: Sequence[str] | None = None) -> dict[str, Program]:
        """The compiled programs for `size` (those of `names`, or programs_at's), compiled (once) if needed."""
        size = size_input(size, self.sizes)
        return self._compiled.get(size, self.programs_at(size) if names is None else names)

    @functools.lru_cache(maxsize=None)  # noqa: B019 (a few per size, for the pipeline's life)
    def zeros(self, shape: tuple[int, ...], dtype: DTypeLike = np.float32) -> jax.Array:
        """Zeros of `shape` per image of a call, kept on the devices: the host noise of a call where
        no image draws its own; the image latents, kept mask and latent fill of a call from noise."""
        return jax.device_put(np.zeros((self.images_per_call, *shape), dtype), self.batch_sharding)

    @functools.lru_cache(maxsize=None)  # noqa: B019 (two, for the pipeline's life)
    def key_stream(self, stream: int) -> jax.Array:
        """A stream of the seeds' keys (sampling.ENCODE_STREAM ...), as the programs take it."""
        return jax.device_put(np.uint32(stream), self.replicated)

    def filled(self, per_image: np.ndarray) -> np.ndarray:
        """A call's per-image array, its free slots of the compiled batch filled with the last image's."""
        return np.concatenate([per_image, np.repeat(per_image[-1:], self.images_per_call - len(per_image), axis=0)])

    def is_compiled(self, size: tuple[int, int], names: Sequence[str] | None = None) -> bool:
        """Whether every program of `size` (or those of `names`) is compiled."""
        return self._compiled.has(size, self.programs_at(size) if names is None else names)

    def load_stored(self, sizes: Sequence[tuple[int, int]], names: Sequence[str] | None = None) -> None:
        """What the program store (if any) holds of `sizes`' programs (or those of `names`), loaded side
        by side across the sizes (a restart's remaining sizes at once); nothing is compiled."""
        self._compiled.load_stored([(n, s) for s in sizes for n in (self.programs_at(s) if names is None else names)])

    def warmup(self, sizes: Sequence[tuple[int, int]] | None = None, names: Sequence[str] | None = None
               ) -> dict[str, float]:
        """Compile every size (or those of `sizes`), every program (or those of `names`), what the
        program store holds loaded first, side by side; returns seconds per size (after that load)."""
        seconds, sizes = {}, self.sizes if sizes is None else sizes
        self.load_stored(sizes, names)
        for size in sizes:
            start = time.perf_counter()
            self.compiled(size, names)
            seconds[format_size(size)] = time.perf_counter() - start
        return seconds

    # -- requests -------------------------------------------------------------------------------

    def stamp_for(self, info: ImageInfo) -> Stamp:
        """What made `info`'s image besides its own parameters: the stamp, with the embeddings its prompts name."""
        used = self.embeddings.used(self.tokenizers[0], (info.prompt, info.negative_prompt), self.max_prompt_chunks)
        return dataclasses.replace(self.stamp, embeddings=used)

    @property
    def ip_adapters(self) -> tuple[str, ...]:
        return () if self.ip_adapter is None else (self.ip_adapter,)

    @property
    def unit_models(self) -> tuple[str, ...]:
        """What a call's ControlNet units may name: its ControlNets and its IP-Adapter."""
        return (*self.controlnets, *self.ip_adapters)

    @property
    def sampler(self) -> Sampler:
        """The default sampler."""
        return self.samplers[self.default_sampler]

    def request(self, prompt: str | Sequence[str], negative_prompt: str | Sequence[str] = "", *,
                seed: int | Sequence[int] | None = None, guidance_scale: float | Sequence[float] = 5.0,
                steps: int = 20, size: Size | str = (1024, 1024), sampler: str | None = None,
                schedule: str | None = None, rng: str | None = None, strength: float | None = None,
                image: ImageInput | None = None, resize_mode: str | None = None, **more: Any) -> Request:
        """A checked request for this pipeline (RequestError names what is wrong); `more`: Request.of's
        other fields by their API names (`controlnet`: units by sd-webui-controlnet's field names)."""
        return Request.of(prompt, negative_prompt, seed=seed, guidance_scale=guidance_scale, steps=steps, size=size,
                          sizes=self.sizes, sampler=sampler, samplers=list(self.samplers), schedule=schedule, rng=rng,
                          strength=strength, image=image, resize_mode=resize_mode, controlnets=self.unit_models,
                          ip_adapters=self.ip_adapters, upscalers=self.upscalers.names, **more)

    def generate(self, prompt: str | Sequence[str], negative_prompt: str | Sequence[str] = "", *,
                 seed: int | Sequence[int] | None = None, guidance_scale: float | Sequence[float] = 5.0,
                 steps: int = 20, size: Size | str = (1024, 1024), sampler: str | None = None,
                 schedule: str | None = None, rng: str | None = None, latents: np.ndarray | None = None,
                 image: ImageInput | None = None, strength: float | None = None, resize_mode: str | None = None,
                 mask_image: ImageInput | None = None, mask_blur: int | None = None, masked_content: str | None = None,
                 inpaint_area: str | None = None, mask_padding: int | None = None, hires: bool | None = None,
                 hires_scale: float | None = None, hires_upscaler: str | None = None, hires_steps: int | None = None,
                 hires_strength: float | None = None, dynamic_prompts: str | None = None,
                 wildcards: str | os.PathLike | None = None, refiner_switch_at: float | None = None,
                 progress: Callable[[int, int], None] | None = None) -> GenerationResult:
        """Generate `images_per_call` images.

        prompt / negative_prompt / guidance_scale: one value for every image, or one per image.
        seed: an int (image i gets seed + i), one per image, or None or -1 (random, as A1111's -1).
        sampler: one of `samplers` by name (AUTOMATIC1111's: "Euler", "Euler a", "DPM++ 2M",
            "DPM++ 2M Karras", ...: request/names.py's SAMPLERS); None: the default.
        schedule: Schedule type (request/names.py's SCHEDULES; default "Checkpoint": the checkpoint's
            scheduler config as diffusers runs it); rng: "JAX" (default) or "CPU" (PyTorch's CPU
            generator, per image from its seed, as A1111's CPU source and ComfyUI draw it).
        latents: optional initial noise in diffusers' layout (images, 4, h, w), as diffusers' `latents=`.
        image: start from this image (img2img; a PIL image, an (H, W, 3) uint8 array or an image
            file's bytes), fitted to `size` by `resize_mode` (A1111's; default Just resize), its
            latents noised to what a denoising `strength` leaves (default 0.75, A1111's), as diffusers'
            img2img pipeline on the checkpoint's schedule, as A1111 on its schedule types.
        mask_image: inpainting: repaint where this mask of the image's size is white, its edge blurred
            by `mask_blur` pixels (default 4), from `masked_content` (A1111's; default "original");
            the rest keeps the image's pixels (as diffusers' inpainting pipeline on the checkpoint's
            schedule, as A1111 on its schedule types: imaging/mask.py, sampler/tables.py). `inpaint_area`
            "Only masked": the mask's region and `mask_padding` pixels around it (default 32)
            denoised at `size`, pasted back into the image at its own size. An inpainting UNet (9
            input channels) also takes the mask and the masked image's latents, as diffusers and
            A1111 give them.
        An embedding of the pipeline's (textual inversion) is named in a prompt by its file's name.
        hires: a hires fix, as A1111's Hires. fix (text to image only): the images made at `size`, upscaled
            by `hires_scale` (default 2; the larger size must be one of `sizes`) with `hires_upscaler`
            ("Latent", the default, or "Lanczos"), then denoised again there for `hires_steps` (0, the
            default: as many as the first pass) at `hires_strength` (default 0.7).
        dynamic_prompts: {a|b} and __name__ (a line of `wildcards` folder's file) in the prompts, as
            sd-dynamic-prompts: "Random" (default: each image's from its seed), "Combinatorial", "Off".
        refiner_switch_at: the steps after this fraction of the training timesteps run on the refiner
            (A1111's "Refiner switch at", diffusers' denoising_end/denoising_start; None: none).
        progress: progress(step, steps) after each step (this thread; step_progress=False: once, at the end)."""
        fields = {name: value for name, value in locals().items()  # (the request's, by their API names)
                  if name not in ("self", "prompt", "negative_prompt", "latents", "progress", "mask_image",
                                  "wildcards")}
        request = self.request(prompt, negative_prompt, **fields, mask=mask_image, wildcards=Wildcards(wildcards))
        return self.run(request, latents=latents, progress=progress)

    def run(self, request: Request, *, images: int | None = None, latents: np.ndarray | None = None,
            progress: Callable[[int, int], None] | None = None, stop: Callable[[], bool] | None = None,
            **previews) -> GenerationResult:
        """Generate `images` (default: images_per_call) images of a checked request (see `generate`;
        from its image, if it has one; `previews`: run_images' preview and preview_every)."""
        n = self.images_per_call if images is None else images
        inits = None if request.image is None else np.repeat(request.image[None], n, axis=0)
        masks = None if request.mask is None else np.repeat(request.mask[None], n, axis=0)
        result = self.run_images(request.images(n), latents=latents, init_images=inits, masks=masks,
                                 progress=progress, stop=stop, **previews)
        return dataclasses.replace(result, images=request.finish(result.images))

    def run_images(self, infos: Sequence[ImageInfo], *, latents: np.ndarray | None = None,
                   init_images: np.ndarray | None = None, masks: np.ndarray | None = None,
                   progress: Callable[[int, int], None] | None = None,
                   stop: Callable[[], bool] | None = None,
                   preview: Callable[[int, int, np.ndarray], None] | None = None,
                   preview_every: int = 0, controls: Sequence[ControlUnit] = ()) -> GenerationResult:
        """Generate one image per entry of `infos` (1 to images_per_call, all of one size, step
        count and sampler; they may come from different requests) in one call. Free slots of the compiled batch
        are filled with copies of the last image and discarded: each device makes its images alone,
        so an image's pixels do not depend on its slot or on the other images of the call.

        init_images: (n, H, W, 3) uint8 at the call's size: the images they start from (img2img),
            each image's denoising strength (ImageInfo.strength) saying how far.
        masks: (n, H, W) uint8 with init_images (inpainting): where each is repainted (255), as
            starting.py prepares and applies them.
        stop: polled after each denoising step (stepwise pipelines); when it returns True the call
            ends there and raises Cancelled.
        preview: called as preview(step, steps, images) every `preview_every` steps (stepwise
            pipelines; not after the last), images (n, h, w, 3) uint8: the current estimate of each
            image (see preview.py). A TAESD preview is decoded on the device while the next steps
            run, and handed over once ready.
        controls: ControlNets guiding the images (control.ControlUnit: one of `controlnets` by name,
            its control images at the call's size, weight, steps and guess mode); left out: the
            units the infos carry (ImageInfo.controls, as a request's images have them).
        """
        if not self.has_weights:
            raise RuntimeError("this pipeline was built from abstract networks and has no weights yet (take_weights)")
        controls = tuple(controls) or units_of(infos)
        if unknown := [u.controlnet for u in controls if u.controlnet not in self.unit_models]:
            raise RequestError(not_a_choice("ControlNet", unknown[0], self.unit_models))
        return run_call(self, infos, latents, init_images, masks, progress, stop, preview, preview_every, controls)

