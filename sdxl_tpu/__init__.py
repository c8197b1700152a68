"""sdxl-tpu: Stable Diffusion XL in JAX/Flax, served from one compiled, replicated pipeline.

The public API is below, each name imported from its module on first use: a part that runs no
model (a front end, request checking) imports this package without JAX.

    request/   what a generation is, JAX-free: the form's fields, a request and its checks, errors,
               names, what to load, presets and styles
    a1111/     A1111's formats, JAX-free: prompts, parameters texts, images carrying them, its API's bodies
    imaging/   image work, JAX-free: decoding what a client gives, masks, resizing, the hires fix's sizes
    cli/       the command line's options, one table
    sampler/   the samplers' host tables (numpy), by name
    generate/  the generator (JAX): prompt to images, compiled and sharded
    models/    the networks (text encoders, UNet, VAE, TAESD, layers, attention)
    weights/   where weights come from and how they load (Hub, safetensors, single files, LoRA),
               and the architectures
    server/    the server: its core, the engines, the batcher, the back end, the guard
    bench/     the benchmark
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {  # name -> the module (under sdxl_tpu) that defines it
    "AutoencoderKL": "models.vae", "VAEConfig": "models.vae",
    "CLIPTextConfig": "models.clip", "CLIPTextModel": "models.clip",
    "UNet2DConditionModel": "models.unet", "UNetConfig": "models.unet",
    "Precision": "models.layers",
    "CheckpointError": "weights.errors", "resolve": "weights.hub",
    "Models": "weights.checkpoint", "load_models": "weights.checkpoint",
    "load_text_encoder": "weights.checkpoint", "load_tokenizers": "weights.hub",
    "load_unet": "weights.checkpoint", "load_vae": "weights.checkpoint",
    "CompileCounter": "generate.compiling.compilation", "enable_compile_cache": "generate.compiling.compilation",
    "GenerationError": "request.errors", "GenerationResult": "request.request", "Pipeline": "generate.pipeline",
    "load_pipeline": "generate.loading",
    "ImageInfo": "request.request", "Request": "request.request", "RequestError": "request.errors",
    "EulerDiscrete": "sampler.diffusers", "Sampler": "sampler.tables", "sampler_named": "sampler.from_config",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sdxl_tpu' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = sorted(_EXPORTS)
