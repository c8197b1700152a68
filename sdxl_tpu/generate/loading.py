"""Building a Pipeline from what to load (request/load.py's LoadOptions): its weights, tokenizers,
samplers and the names its images' parameters will carry, then compiled for its sizes."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from ..request.errors import DeviceMemoryError
from ..sampler.from_config import load_samplers
from ..a1111.infotext import Stamp, file_hash
from ..request.load import LoadOptions, lora_name, lora_spec
from ..models.layers import Precision
from ..weights.checkpoint import Checkpoint, Models, config_root, is_single_file
from ..weights.controlnets import load_controlnet
from ..weights.embeddings import load_embeddings
from ..weights.errors import IPAdapterError
from ..weights.ip_adapter import ImagePromptModels, load_image_prompt
from ..weights.refiner import load_refiner
from ..weights.upscalers import find_upscalers
from .upscaling import ModelUpscalers
from ..weights.hub import load_tokenizers, resolve_file
from ..weights.tensors import read_json
from .compiling.compilation import enable_compile_cache
from .compiling.layout import Device
from .control import checked_names
from .compiling.stored_programs import ProgramStore
from .pipeline import Pipeline

log = logging.getLogger("sdxl_tpu")


def compute_dtype_for(dtype: str, compute_dtype: str | None = None) -> str:
    """The activation dtype: as asked, else `dtype`, except float32 on a CPU, which has no
    bfloat16 arithmetic (XLA emulates it there: slower and less precise than float32)."""
    if compute_dtype:
        return compute_dtype
    return "float32" if jax.default_backend() == "cpu" else dtype


def load_pipeline(model: str | os.PathLike, *, warmup: bool = True, devices: Sequence[Device] | None = None,
                  compile_cache: str | os.PathLike | None = None, **options: Any) -> Pipeline:
    """Load an SDXL checkpoint and compile it: `model` and `options` are LoadOptions' fields (what
    to load: the model, sizes, dtype, LoRAs, ...; see request/load.py). With `warmup` every size is
    compiled before this returns; requests for other sizes are refused rather than compiled.
    `devices`: those the pipeline is replicated on (default: all). `compile_cache`, if given, is set
    as the process-wide JAX persistent compilation cache (entry points usually set it once themselves)
    and holds the pipeline's compiled programs (stored_programs.py)."""
    if compile_cache is not None:
        enable_compile_cache(compile_cache)
    return load(LoadOptions(model=os.fspath(model), **options), warmup=warmup, devices=devices,
                compile_cache=compile_cache)


def load(options: LoadOptions, *, warmup: bool = True, devices: Sequence[Device] | None = None,
         compile_cache: str | os.PathLike | None = None, first: Callable[[Pipeline], object] | None = None) -> Pipeline:
    """The Pipeline `options` describe: its weights (a preview decoder first: one that cannot be
    had is refused before minutes of loading), tokenizers, samplers and the names its images'
    parameters carry; compiled for every size with `warmup`, its programs kept in (and loaded
    from) `compile_cache`'s directory when given. `first(pipeline)` runs while the weights are read
    (see with_weights): a server compiles what its first call runs then."""
    o = options
    taesd = None
    if o.preview != "approx":
        from ..weights.taesd import load_taesd

        taesd = load_taesd(o.preview, Precision.of(compute_dtype_for(o.dtype, o.compute_dtype), o.dtype,
                                                   attention=o.attention))
    root = config_root(o.model, o.config)
    single = is_single_file(o.model)
    checkpoint = Checkpoint.open(o.model if single else root, dtype=compute_dtype_for(o.dtype, o.compute_dtype),
                                 param_dtype=o.dtype, attention=o.attention, unet=o.unet, config=root, loras=o.loras)
    models = checkpoint.abstract()
    checkpoint.check(models)  # (a mismatch said at once, not after minutes of compiling beside it)
    index = dict(read_json(root / "model_index.json")) if (root / "model_index.json").is_file() else {}
    samplers, default_sampler = load_samplers(root, o.timestep_spacing, o.prediction_type)
    name = Path(o.model).stem if single else o.model
    if o.unet is not None:
        name += f" + {Path(o.unet).stem}"
    loras = [(lora_name(path), scale, path) for path, scale in map(lora_spec, o.loras)]
    model_name = name  # (what A1111's "Model:" says: the LoRAs are named in their own field)
    name += "".join(f" + {lora}" + (f":{scale:g}" if scale != 1 else "") for lora, scale, _ in loras)
    precision = Precision.of(compute_dtype_for(o.dtype, o.compute_dtype), o.dtype, attention=o.attention)
    controlnets = {named: load_controlnet(path, precision) for named, path in zip(o.controlnet_names, o.controlnets)}
    image_prompt = _image_prompt(o, models, precision)
    refiner = None if o.refiner is None else load_refiner(o.refiner, precision, models.vae.config.latent_channels,
                                                          models.text_encoder_2.config.hidden_size)
    parts = {"the model": weight_bytes(models.text_encoder, models.text_encoder_2, models.unet, models.vae),
             **{f"ControlNet {named}": weight_bytes(c) for named, c in controlnets.items()},
             **({"the IP-Adapter and its image encoder": weight_bytes(*image_prompt[1:])} if image_prompt else {}),
             **({"the refiner": weight_bytes(refiner.unet, refiner.text_encoder_2)} if refiner else {})}
    device = (devices or jax.devices())[0]
    check_fits(parts, device)
    tokenizers = load_tokenizers(root)
    embeddings = load_embeddings(o.embeddings, tokenizers, models)
    upscalers = find_upscalers(o.upscalers) if o.upscalers else None
    pipe = Pipeline(models, tokenizers, samplers, default_sampler=default_sampler, sizes=o.sizes,
                    network_sizes=o.network_sizes,
                    images_per_call=o.images_per_call, devices=devices, model_name=name,
                    force_zeros_for_empty_prompt=index.get("force_zeros_for_empty_prompt", True),
                    step_progress=o.step_progress, preview_decoder=taesd, max_prompt_chunks=o.max_prompt_chunks,
                    program_store=ProgramStore.beside(compile_cache), controlnets=controlnets,
                    embeddings=embeddings, upscalers=upscalers and ModelUpscalers(upscalers.found, upscalers.skipped,
                                                                                  precision),
                    image_prompt=image_prompt, refiner=refiner)
    try:
        with_weights(pipe, lambda: checkpoint.fill(models), first)
    except Exception as e:  # (the device's memory ran out reading the weights or loading the first programs)
        if not out_of_device_memory(e):
            raise
        raise DeviceMemoryError(memory_message(parts, device, "did not fit beside what a call needs") + (
            " Load fewer of them (--refiner, --ip-adapter, --controlnet) or make fewer images a call (--images).")
        ) from e
    # A1111's names for what made the images, LoRAs apart (the files were read whole just now:
    # hashing them is quick).
    pipe.stamp = Stamp(model_name, file_hash(resolve_file(o.model), 10) if single else None,
                       loras=tuple((lora, scale, file_hash(resolve_file(path), 12)) for lora, scale, path in loras),
                       refiner=refiner.name if refiner else None)
    if warmup:
        pipe.warmup()
    return pipe


def weight_bytes(*networks: nnx.Module) -> int:
    """Bytes of the networks' parameters (abstract or read) as a device holds them."""
    return sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
               for network in networks for leaf in jax.tree.leaves(nnx.state(network, nnx.Param)))


def device_memory(device: Device) -> int | None:
    """What `device` can hold, in bytes (None where it does not say: a CPU)."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return (stats or {}).get("bytes_limit")


def out_of_device_memory(error: BaseException) -> bool:
    """Whether `error` is XLA's of a device's memory exhausted (HBM, an allocation), not of a kernel's
    scratch memory (VMEM: a program that does not compile, whatever is loaded)."""
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text and "vmem" not in text.lower() and (
        "HBM" in text or "allocate" in text.lower())


def memory_message(parts: dict[str, int], device: Device, what: str) -> str:
    """What the networks (`parts`: bytes by what they are) take against what `device` holds."""
    limit, taken = device_memory(device), ", ".join(f"{name} {size / 1e9:.1f} GB" for name, size in parts.items())
    holds = f"one {device.device_kind} holds {limit / 1e9:.1f} GB" if limit else f"on {device.device_kind}"
    return f"The networks to load take {sum(parts.values()) / 1e9:.1f} GB ({taken}) and {what}: {holds}."


def check_fits(parts: dict[str, int], device: Device) -> None:
    """Refuse networks (`parts`: bytes by what they are) that cannot fit one device's memory, since each
    device holds them all: before the model's weights are read (the ControlNets, IP-Adapter and refiner
    are read first, to be checked against it). A call needs more again: on one TPU v5e 13.2 GB of
    weights peaked at 15.1 GB, and 14.3 GB did not run (2026-12-07)."""
    limit = device_memory(device)
    if limit is None or sum(parts.values()) <= limit:
        return
    raise DeviceMemoryError(memory_message(parts, device, "each device holds them all") + (
        " Load fewer of them (--refiner, --ip-adapter, --controlnet) or use devices with more memory."))


def _image_prompt(o: LoadOptions, models: Models, precision: Precision) -> ImagePromptModels | None:
    """The IP-Adapter and its image encoder `o` names, if any, checked against the UNet and each other."""
    if o.ip_adapter is None:
        if o.image_encoder is not None:
            raise IPAdapterError("an image encoder serves an IP-Adapter: give the IP-Adapter too (--ip-adapter)")
        return None
    name = o.ip_adapter_names[0]
    if name in o.controlnet_names:
        raise IPAdapterError(f"IP-Adapter {name!r}: a ControlNet has that name too; rename one of the files")
    checked_names({name: None})
    return load_image_prompt(name, o.ip_adapter, o.image_encoder, models.unet, precision)


def with_weights(pipe: Pipeline, weights: Callable[[], Models], first: Callable[[Pipeline], object] | None = None
                 ) -> Pipeline:
    """`pipe`, built from abstract networks, given the networks `weights()` reads; `first(pipe)`
    meanwhile in a thread of its own (compiling needs the networks' shapes alone: on a new TPU
    replica the weights' seconds hide behind the first programs' minutes). A failure of either is
    raised, the weights' first (once `first` has ended: a compile cannot be stopped, and no thread
    may be inside XLA when the process ends; Checkpoint.check refuses a mismatch before)."""
    compiling: Future = Future()

    def run() -> None:
        try:
            compiling.set_result(first(pipe) if first is not None else None)
        except BaseException as e:  # noqa: BLE001 (raised below, in the caller's thread)
            compiling.set_exception(e)

    threading.Thread(target=run, name="compile-while-loading", daemon=True).start()
    start = time.perf_counter()
    try:
        pipe.take_weights(weights())
        log.info("weights read in %.1f s", time.perf_counter() - start)
    finally:  # (a failure too waits: no thread may be inside XLA when the process ends)
        wait([compiling])
    compiling.result()
    return pipe
