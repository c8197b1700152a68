"""sdxl-tpu: Stable Diffusion XL in JAX/Flax, served from one compiled, replicated pipeline.

The public API is below, each name imported from its module on first use: a part that runs no
model (a front end, request checking) imports this package without JAX.

    models/    the networks (text encoders, UNet, VAE, TAESD, layers, attention)
    weights/   where weights come from and how they load (Hub, safetensors, single files, LoRA)
    request, names, prompts, sampling, scheduler, samplers, kdiffusion, pipeline, compilation:
               the generator, prompt to images
    server/    the server core, the batcher, the back end, the front end's client, the guard
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
    "CompileCounter": "compilation", "enable_compile_cache": "compilation",
    "GenerationError": "request", "GenerationResult": "request", "Pipeline": "pipeline",
    "load_pipeline": "loading",
    "ImageInfo": "request", "Request": "request", "RequestError": "request",
    "EulerDiscrete": "samplers", "Sampler": "scheduler",
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
