"""One compiled, replicated SDXL pipeline.

The data flow, top to bottom:
    prompt -> token ids -> text embeddings -> noise -> denoising loop -> VAE decode -> images

Each stage is a pure function below. `Pipeline` compiles them once per image size (ahead of
time), with the parameters replicated on every device and the image batch split across them
(jax.shard_map over a one-axis Mesh): a device makes its own images, conditional and
unconditional pass included, and never talks to another. Everything a user changes per request
(prompts, seeds, guidance, steps, size micro-conditioning) is an input of the compiled programs.
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .checkpoint import Models, load_models, load_tokenizers, resolve
from .compilation import DEFAULT_COMPILE_CACHE, enable_compile_cache
from .scheduler import MAX_STEPS, EulerDiscrete, euler_step, scale_model_input
from .weights import read_json

MAX_TOKENS = 77
MAX_SEED = 2**32 - 1
BATCH = "batch"  # the mesh axis images are split over


# ---------------------------------------------------------------------------------------------
# The stages (pure functions; batch-major arrays; index 0 of axis 1 = unconditional/negative)
# ---------------------------------------------------------------------------------------------

def tokenize(tokenizer, texts: Sequence[str]) -> np.ndarray:
    """Texts -> (len(texts), 77) int32 token ids, padded and truncated as SDXL's pipeline does."""
    return tokenizer(list(texts), padding="max_length", max_length=MAX_TOKENS, truncation=True,
                     return_tensors="np").input_ids.astype(np.int32)


def encode_text(te1, te2, ids1: jax.Array, ids2: jax.Array, zero_negative: jax.Array):
    """Token ids (B, 2, 77) of both tokenizers -> context (B, 2, 77, D1 + D2) and pooled (B, 2, P).

    Where `zero_negative` is set the negative embeddings are zeros, as diffusers does for an
    empty negative prompt (force_zeros_for_empty_prompt).
    """
    b = ids1.shape[0]
    h1, _ = te1(ids1.reshape(2 * b, -1))
    h2, pooled = te2(ids2.reshape(2 * b, -1))
    context = jnp.concatenate([h1, h2], axis=-1).reshape(b, 2, MAX_TOKENS, -1).astype(jnp.float32)
    pooled = pooled.reshape(b, 2, -1).astype(jnp.float32)
    keep = jnp.stack([~zero_negative, jnp.ones_like(zero_negative)], axis=1).astype(jnp.float32)
    return context * keep[:, :, None, None], pooled * keep[:, :, None]


def get_noise(seeds: jax.Array, init_sigma: jax.Array, height: int, width: int, channels: int) -> jax.Array:
    """One normal latent (h, w, C) per seed, scaled to the first sigma: an image depends on its own seed only."""
    sample = lambda s: jax.random.normal(jax.random.key(s), (height, width, channels), jnp.float32)
    return jax.vmap(sample)(seeds) * init_sigma


def denoise_step(unet, x: jax.Array, i: jax.Array, context: jax.Array, pooled: jax.Array, time_ids: jax.Array,
                 guidance: jax.Array, timesteps: jax.Array, sigmas: jax.Array) -> jax.Array:
    """Step i of Euler sampling with classifier-free guidance; latents and scheduler math in float32.

    Each image's unconditional and conditional pass run side by side in one UNet batch
    (image-major, so a device holding an image holds both of its passes).
    """
    b = x.shape[0]
    sigma, sigma_next = sigmas[i], sigmas[i + 1]
    x_in = jnp.repeat(scale_model_input(x, sigma), 2, axis=0)
    eps = unet(x_in, timesteps[i], context.reshape(2 * b, *context.shape[2:]), pooled.reshape(2 * b, -1),
               jnp.repeat(time_ids, 2, axis=0)).astype(jnp.float32)
    eps = eps.reshape(b, 2, *eps.shape[1:])
    # diffusers skips guidance when guidance_scale <= 1: that is the conditional prediction alone.
    g = jnp.where(guidance > 1.0, guidance, 1.0)[:, None, None, None]
    return euler_step(x, eps[:, 0] + g * (eps[:, 1] - eps[:, 0]), sigma, sigma_next)


def denoise(unet, x: jax.Array, context: jax.Array, pooled: jax.Array, time_ids: jax.Array, guidance: jax.Array,
            timesteps: jax.Array, sigmas: jax.Array, num_steps: jax.Array) -> jax.Array:
    """All steps in one loop on the device. The bound `num_steps` is traced, so any step count
    up to the table size runs the same compiled program."""
    step = lambda i, x: denoise_step(unet, x, i, context, pooled, time_ids, guidance, timesteps, sigmas)
    return jax.lax.fori_loop(0, num_steps, step, x)


def decode(vae, latents: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Latents -> uint8 images (B, H, W, 3) and a per-image flag: all pixels finite."""
    images = vae.decode(latents).astype(jnp.float32)
    finite = jnp.isfinite(images).all(axis=(1, 2, 3))
    images = jnp.round(jnp.clip(images / 2 + 0.5, 0.0, 1.0) * 255.0).astype(jnp.uint8)
    return images, finite


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------

@dataclass
class ImageInfo:
    seed: int
    prompt: str
    negative_prompt: str
    guidance_scale: float
    steps: int
    size: tuple[int, int]  # (width, height)
    sampler: str = "Euler"

    def parameters_text(self, model: str) -> str:
        """AUTOMATIC1111's "parameters" PNG text chunk."""
        lines = [self.prompt]
        if self.negative_prompt:
            lines.append(f"Negative prompt: {self.negative_prompt}")
        lines.append(f"Steps: {self.steps}, Sampler: {self.sampler}, CFG scale: {self.guidance_scale:g}, "
                     f"Seed: {self.seed}, Size: {self.size[0]}x{self.size[1]}, Model: {model}")
        return "\n".join(lines)


@dataclass
class GenerationResult:
    images: list  # PIL.Image.Image
    infos: list[ImageInfo]
    timings: dict[str, float] = field(default_factory=dict)  # seconds: text_encoding, denoising, decoding, total

    @property
    def seeds(self) -> list[int]:
        return [i.seed for i in self.infos]


class GenerationError(RuntimeError):
    """The pipeline produced something that is not an image (e.g. NaN)."""


# ---------------------------------------------------------------------------------------------
# The compiled, replicated pipeline
# ---------------------------------------------------------------------------------------------

def _parse_size(size: Any) -> tuple[int, int]:
    if isinstance(size, str):
        parts = size.lower().replace(" ", "").split("x")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"size must look like WIDTHxHEIGHT (e.g. 1024x1024), got {size!r}")
        size = (int(parts[0]), int(parts[1]))
    try:
        width, height = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"size must be (width, height), got {size!r}") from None
    return width, height


def _per_image(value: Any, n: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name}: got {len(value)} values for {n} images")
        return list(value)
    return [value] * n


class Pipeline:
    """SDXL compiled for a fixed set of image sizes and images per call, replicated on `mesh`."""

    def __init__(self, models: Models, tokenizers: tuple, scheduler: EulerDiscrete, *,
                 sizes: Sequence[Any] = ((1024, 1024),), images_per_call: int = 4,
                 devices: Sequence[jax.Device] | None = None, model_name: str = "",
                 force_zeros_for_empty_prompt: bool = True, step_progress: bool = True):
        devices = list(devices or jax.devices())
        self.mesh = Mesh(np.array(devices), (BATCH,))
        n = len(devices)
        self.images_per_call = math.ceil(images_per_call / n) * n
        self.tokenizers = tokenizers
        self.scheduler = scheduler
        self.model_name = model_name
        self.force_zeros_for_empty_prompt = force_zeros_for_empty_prompt
        self.vae_factor = 2 ** (len(models.vae.config.block_out_channels) - 1)
        self.latent_channels = models.unet.config.in_channels
        self.sizes = []
        for s in sizes:
            w, h = _parse_size(s)
            if w <= 0 or h <= 0 or w % self.vae_factor or h % self.vae_factor:
                raise ValueError(f"size {w}x{h}: width and height must be positive multiples of {self.vae_factor}")
            self.sizes.append((w, h))
        self._lock = threading.Lock()
        self.stepwise = step_progress

        replicated = NamedSharding(self.mesh, P())
        # Parameters: split each nnx module into its (static) graph and its arrays; replicate the arrays.
        self._graphs, self._params = {}, {}
        for name in ("text_encoder", "text_encoder_2", "unet", "vae"):
            graph, state = nnx.split(getattr(models, name))
            self._graphs[name] = graph
            self._params[name] = jax.device_put(state, replicated)
        self._compiled: dict[Any, Any] = {}
        # Step indices live on the devices already, so the stepwise loop transfers nothing per step.
        self._step_index = [jax.device_put(np.int32(i), replicated) for i in range(MAX_STEPS)]

    # -- sharded programs ---------------------------------------------------------------------

    def _shard(self, fn: Callable, in_specs: tuple, out_specs: Any) -> Callable:
        # check_vma=False: Pallas kernels (splash attention, traced for TPU) declare their outputs
        # without varying-axis types, which the check would reject; every output here is batch-split.
        return jax.jit(jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False))

    def _encode_program(self):
        g1, g2 = self._graphs["text_encoder"], self._graphs["text_encoder_2"]

        def fn(p1, p2, ids1, ids2, zero_negative):
            return encode_text(nnx.merge(g1, p1), nnx.merge(g2, p2), ids1, ids2, zero_negative)

        return self._shard(fn, (P(), P(), P(BATCH), P(BATCH), P(BATCH)), (P(BATCH), P(BATCH)))

    def _noise_program(self, size):
        w, h = size
        lh, lw = h // self.vae_factor, w // self.vae_factor
        return self._shard(partial(get_noise, height=lh, width=lw, channels=self.latent_channels),
                           (P(BATCH), P()), P(BATCH))

    def _denoise_program(self):
        """The whole loop in one program (fused), or one step per program call (stepwise, so the
        host can report progress without a callback inside the program: JAX's persistent cache
        never stores programs that hold host callbacks)."""
        graph = self._graphs["unet"]
        batch = P(BATCH)
        specs = (P(), batch, batch, batch, batch, batch, P(), P(), P())
        if self.stepwise:
            def step(params, x, context, pooled, time_ids, guidance, timesteps, sigmas, i):
                return denoise_step(nnx.merge(graph, params), x, i, context, pooled, time_ids, guidance, timesteps,
                                    sigmas)
            return self._shard(step, specs, batch)

        def loop(params, x, context, pooled, time_ids, guidance, timesteps, sigmas, num_steps):
            return denoise(nnx.merge(graph, params), x, context, pooled, time_ids, guidance, timesteps, sigmas,
                           num_steps)
        return self._shard(loop, specs, batch)

    def _decode_program(self):
        graph = self._graphs["vae"]
        return self._shard(lambda params, latents: decode(nnx.merge(graph, params), latents),
                           (P(), P(BATCH)), (P(BATCH), P(BATCH)))

    def _abstract_inputs(self, size):
        w, h = size
        b = self.images_per_call
        lh, lw = h // self.vae_factor, w // self.vae_factor
        batch = NamedSharding(self.mesh, P(BATCH))
        rep = NamedSharding(self.mesh, P())
        s = lambda shape, dtype, sharding=batch: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
        return {
            "ids": s((b, 2, MAX_TOKENS), jnp.int32),
            "zero_negative": s((b,), jnp.bool_),
            "seeds": s((b,), jnp.uint32),
            "noise": s((b, lh, lw, self.latent_channels), jnp.float32),
            "time_ids": s((b, 6), jnp.float32),
            "guidance": s((b,), jnp.float32),
            "timesteps": s((MAX_STEPS,), jnp.float32, rep),
            "sigmas": s((MAX_STEPS + 1,), jnp.float32, rep),
            "scalar_f32": s((), jnp.float32, rep),
            "scalar_i32": s((), jnp.int32, rep),
        }

    def compiled(self, size: tuple[int, int]) -> dict[str, Any]:
        """The compiled programs for `size`, compiling them (once) if needed."""
        size = _parse_size(size)
        if size not in self.sizes:
            raise ValueError(f"size {size[0]}x{size[1]} is not compiled; available: "
                             + ", ".join(f"{w}x{h}" for w, h in self.sizes))
        if "encode" not in self._compiled:
            a = self._abstract_inputs(self.sizes[0])
            self._compiled["encode"] = self._encode_program().lower(
                self._params["text_encoder"], self._params["text_encoder_2"], a["ids"], a["ids"],
                a["zero_negative"]).compile()
        if size not in self._compiled:
            a = self._abstract_inputs(size)
            enc = self._compiled["encode"]
            context, pooled = enc.out_info
            programs = {
                "noise": self._noise_program(size).lower(a["seeds"], a["scalar_f32"]).compile(),
                "denoise": self._denoise_program().lower(
                    self._params["unet"], a["noise"], context, pooled, a["time_ids"], a["guidance"], a["timesteps"],
                    a["sigmas"], a["scalar_i32"]).compile(),
                "decode": self._decode_program().lower(self._params["vae"], a["noise"]).compile(),
            }
            self._compiled[size] = programs
        return {"encode": self._compiled["encode"], **self._compiled[size]}

    def warmup(self) -> dict[str, float]:
        """Compile every size; returns seconds per size."""
        seconds = {}
        for size in self.sizes:
            start = time.perf_counter()
            self.compiled(size)
            seconds[f"{size[0]}x{size[1]}"] = time.perf_counter() - start
        return seconds

    # -- requests -------------------------------------------------------------------------------

    def prepare(self, prompt, negative_prompt="", *, seed=None, guidance_scale=5.0, steps=20,
                size=(1024, 1024)) -> tuple[list[ImageInfo], dict[str, np.ndarray]]:
        """Validate a request and turn it into host arrays for the compiled programs."""
        n = self.images_per_call
        prompts = [str(p) for p in _per_image(prompt, n, "prompt")]
        negatives = [str(p) if p is not None else "" for p in _per_image(negative_prompt, n, "negative_prompt")]
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 1 <= steps <= MAX_STEPS:
            raise ValueError(f"steps must be an integer between 1 and {MAX_STEPS}, got {steps!r}")
        guidance = []
        for g in _per_image(guidance_scale, n, "guidance_scale"):
            if isinstance(g, bool) or not isinstance(g, (int, float, np.floating, np.integer)) or not math.isfinite(g):
                raise ValueError(f"guidance_scale must be a finite number, got {g!r}")
            guidance.append(float(g))
        if seed is None:
            seed = secrets.randbelow(MAX_SEED + 1)
        seeds = _per_image(seed, n, "seed") if isinstance(seed, (list, tuple)) else [seed]
        for s in seeds:
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= s <= MAX_SEED:
                raise ValueError(f"seed must be an integer between 0 and {MAX_SEED}, got {s!r}")
        if len(seeds) == 1 and n > 1:  # a base seed: image i gets base + i
            seeds = [(int(seed) + i) % (MAX_SEED + 1) for i in range(n)]
        width, height = _parse_size(size)
        if (width, height) not in self.sizes:
            raise ValueError(f"size {width}x{height} is not compiled; available: "
                             + ", ".join(f"{w}x{h}" for w, h in self.sizes))

        tok1, tok2 = self.tokenizers
        both = [t for pair in zip(negatives, prompts) for t in pair]  # (negative, prompt) per image
        timesteps, sigmas, init_sigma = self.scheduler.padded_tables(steps)
        arrays = {
            "ids1": tokenize(tok1, both).reshape(n, 2, MAX_TOKENS),
            "ids2": tokenize(tok2, both).reshape(n, 2, MAX_TOKENS),
            "zero_negative": np.array([self.force_zeros_for_empty_prompt and not neg.strip() for neg in negatives]),
            "seeds": np.array(seeds, np.uint32),
            "time_ids": np.tile(np.array([height, width, 0, 0, height, width], np.float32), (n, 1)),
            "guidance": np.array(guidance, np.float32),
            "timesteps": timesteps, "sigmas": sigmas, "init_sigma": init_sigma,
            "num_steps": np.int32(steps),
        }
        infos = [ImageInfo(seed=int(s), prompt=p, negative_prompt=q, guidance_scale=g, steps=steps,
                           size=(width, height)) for s, p, q, g in zip(seeds, prompts, negatives, guidance)]
        return infos, arrays

    def generate(self, prompt: str | Sequence[str], negative_prompt: str | Sequence[str] = "", *,
                 seed: int | Sequence[int] | None = None, guidance_scale: float | Sequence[float] = 5.0,
                 steps: int = 20, size: Any = (1024, 1024), latents: np.ndarray | None = None,
                 progress: Callable[[int, int], None] | None = None) -> GenerationResult:
        """Generate `images_per_call` images.

        prompt / negative_prompt: one string for every image, or one per image.
        seed: an int (image i gets seed + i), one per image, or None (random).
        latents: optional initial noise in diffusers' layout (images, 4, h, w), as diffusers' `latents=`.
        progress: called as progress(step, steps) after each denoising step (in this thread; with
            step_progress=False only once, at the end of the fused loop).
        """
        from PIL import Image

        infos, a = self.prepare(prompt, negative_prompt, seed=seed, guidance_scale=guidance_scale, steps=steps,
                                size=size)
        size = infos[0].size
        programs = self.compiled(size)
        w, h = size
        if latents is not None:
            shape = (self.images_per_call, self.latent_channels, h // self.vae_factor, w // self.vae_factor)
            latents = np.asarray(latents, np.float32)
            if latents.shape != shape:
                raise ValueError(f"latents must have shape {shape}, got {latents.shape}")
        batch = NamedSharding(self.mesh, P(BATCH))
        put = lambda x: jax.device_put(x, batch)

        with self._lock:
            start = time.perf_counter()
            context, pooled = programs["encode"](self._params["text_encoder"], self._params["text_encoder_2"],
                                                 put(a["ids1"]), put(a["ids2"]), put(a["zero_negative"]))
            if latents is None:
                x = programs["noise"](put(a["seeds"]), a["init_sigma"])
            else:
                x = put(latents.transpose(0, 2, 3, 1) * a["init_sigma"])
            jax.block_until_ready((context, pooled, x))
            t_text = time.perf_counter()
            replicated = NamedSharding(self.mesh, P())
            conditioning = (context, pooled, put(a["time_ids"]), put(a["guidance"]),
                            jax.device_put(a["timesteps"], replicated), jax.device_put(a["sigmas"], replicated))
            if self.stepwise:
                # Dispatch every step at once (asynchronously), then report each as it completes.
                states = []
                for i in range(steps):
                    x = programs["denoise"](self._params["unet"], x, *conditioning, self._step_index[i])
                    states.append(x)
                for i, state in enumerate(states):
                    state.block_until_ready()
                    if progress is not None:
                        progress(i + 1, steps)
                del states
            else:
                x = programs["denoise"](self._params["unet"], x, *conditioning, a["num_steps"])
                jax.block_until_ready(x)
                if progress is not None:
                    progress(steps, steps)
            t_denoise = time.perf_counter()
            images, finite = programs["decode"](self._params["vae"], x)
            images, finite = np.asarray(images), np.asarray(finite)
            t_decode = time.perf_counter()
        if not finite.all():
            bad = [infos[i].seed for i in np.flatnonzero(~finite)]
            raise GenerationError(f"the model produced non-finite values (NaN/inf) for seeds {bad}; "
                                  "try float32 or another seed")
        timings = {"text_encoding": t_text - start, "denoising": t_denoise - t_text,
                   "decoding": t_decode - t_denoise, "total": t_decode - start}
        return GenerationResult(images=[Image.fromarray(img) for img in images], infos=infos, timings=timings)


# ---------------------------------------------------------------------------------------------
# Building one
# ---------------------------------------------------------------------------------------------

def tiny_checkpoint_dir() -> Path:
    """The built-in tiny checkpoint, written once to the user cache."""
    from .tiny import write_tiny_checkpoint

    from .tiny import TINY_VERSION

    default = Path.home() / ".cache" / "sdxl_tpu" / f"tiny-v{TINY_VERSION}"
    directory = Path(os.environ.get("SDXL_TPU_TINY_DIR", default))
    if not (directory / "model_index.json").is_file():
        # Write beside it and rename, so concurrent first runs never see half a checkpoint.
        staging = directory.with_name(f"{directory.name}.{os.getpid()}.tmp")
        write_tiny_checkpoint(staging)
        try:
            staging.rename(directory)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not (directory / "model_index.json").is_file():
                raise
    return directory


def compute_dtype_for(dtype: str, compute_dtype: str | None = None) -> str:
    """The activation dtype: as asked, else `dtype`, except float32 on a CPU, which has no
    bfloat16 arithmetic (XLA emulates it there: slower and less precise than float32)."""
    if compute_dtype:
        return compute_dtype
    return "float32" if jax.default_backend() == "cpu" else dtype


def load_pipeline(model: str | os.PathLike, *, dtype: str = "bfloat16", sizes: Sequence[Any] = ((1024, 1024),),
                  images_per_call: int = 4, compile_cache: str | os.PathLike | None = DEFAULT_COMPILE_CACHE,
                  devices: Sequence[jax.Device] | None = None, warmup: bool = True,
                  step_progress: bool = True, compute_dtype: str | None = None) -> Pipeline:
    """Load an SDXL checkpoint (Hub id, local diffusers directory, or "tiny") and compile it.

    With `warmup` every size in `sizes` is compiled before this returns; requests for other
    sizes are refused rather than compiled. `step_progress` compiles one program per step so
    progress can be reported per step (what a UI wants); without it all steps run in one fused
    loop on the device (fastest; what the CLI and the benchmark use). `dtype` is the parameter
    dtype; activations use `compute_dtype`, by default the same except float32 on a CPU.
    """
    enable_compile_cache(compile_cache)
    root = tiny_checkpoint_dir() if str(model) == "tiny" else resolve(model)
    models = load_models(root, dtype=compute_dtype_for(dtype, compute_dtype), param_dtype=dtype)
    index = dict(read_json(root / "model_index.json")) if (root / "model_index.json").is_file() else {}
    scheduler_file = root / "scheduler" / "scheduler_config.json"
    scheduler = EulerDiscrete.from_config(dict(read_json(scheduler_file))) if scheduler_file.is_file() else EulerDiscrete()
    pipe = Pipeline(models, load_tokenizers(root), scheduler, sizes=sizes, images_per_call=images_per_call,
                    devices=devices, model_name=str(model),
                    force_zeros_for_empty_prompt=index.get("force_zeros_for_empty_prompt", True),
                    step_progress=step_progress)
    if warmup:
        pipe.warmup()
    return pipe


def save_png(image, info: ImageInfo, path: str | os.PathLike, *, model: str) -> None:
    """Write a PNG with the generation parameters in AUTOMATIC1111's "parameters" text chunk."""
    from PIL.PngImagePlugin import PngInfo

    meta = PngInfo()
    meta.add_text("parameters", info.parameters_text(model))
    image.save(path, pnginfo=meta)
