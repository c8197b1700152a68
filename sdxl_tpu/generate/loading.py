"""Building a Pipeline from a checkpoint: its weights, tokenizers, samplers and the names its
images' parameters will carry, then compiled for its sizes (`load_pipeline`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from .compilation import enable_compile_cache
from ..spec.infotext import Stamp, file_hash
from .pipeline import Pipeline
from ..spec.prompts import DEFAULT_MAX_CHUNKS
from ..sampler.from_config import load_samplers
from ..weights.checkpoint import config_root, is_single_file, load_models
from ..weights.hub import load_tokenizers
from ..weights.hub import resolve_file
from ..weights.lora import lora_spec
from ..weights.tensors import read_json


def compute_dtype_for(dtype: str, compute_dtype: str | None = None) -> str:
    """The activation dtype: as asked, else `dtype`, except float32 on a CPU, which has no
    bfloat16 arithmetic (XLA emulates it there: slower and less precise than float32)."""
    if compute_dtype:
        return compute_dtype
    return "float32" if jax.default_backend() == "cpu" else dtype


def load_pipeline(model: str | os.PathLike, *, dtype: str = "bfloat16", sizes: Sequence[Any] = ((1024, 1024),),
                  images_per_call: int = 4, devices: Sequence[jax.Device] | None = None, warmup: bool = True,
                  step_progress: bool = True, compute_dtype: str | None = None, attention: str = "auto",
                  compile_cache: str | os.PathLike | None = None, unet: str | os.PathLike | None = None,
                  timestep_spacing: str | None = None, prediction_type: str | None = None,
                  config: str | os.PathLike | None = None, loras: Sequence[str | tuple] | None = None,
                  preview: str = "approx", max_prompt_chunks: int = DEFAULT_MAX_CHUNKS) -> Pipeline:
    """Load an SDXL checkpoint (Hub id, local diffusers directory, "tiny", or a single-file
    .safetensors with `config`: where its configs and tokenizers come from, default SDXL base
    1.0's) and compile it.

    With `warmup` every size in `sizes` is compiled before this returns; requests for other
    sizes are refused rather than compiled. `dtype` is the parameter dtype; activations use
    `compute_dtype`, by default the same except float32 on a CPU. `attention`: "auto" (the best
    kernel per platform) or "xla". `compile_cache`, if given, is set as the process-wide JAX
    persistent compilation cache (entry points usually set it once themselves). `unet`: a UNet
    weights file instead of the checkpoint's (e.g. SDXL-Lightning's; local or
    owner/repo/file.safetensors); `timestep_spacing` and `prediction_type` ("epsilon" or "sample")
    override the scheduler config's. `loras`: LoRA files fused into the weights, as "file[:scale]"
    or (file, scale) (kohya or diffusers format; see `sdxl_tpu.weights.lora`). `preview`: how live previews
    are decoded, "approx" (no weights) or "taesd" / a TAESD checkpoint directory or repo (see preview.py).
    `max_prompt_chunks`: the longest prompt, in chunks of 75 tokens (see prompts.py).
    """
    if compile_cache is not None:
        enable_compile_cache(compile_cache)
    taesd = None
    if preview != "approx":  # first: a preview decoder that cannot be had is refused before minutes of loading
        from ..models.layers import Precision
        from ..weights.taesd import load_taesd

        taesd = load_taesd(preview, Precision.of(compute_dtype_for(dtype, compute_dtype), dtype, attention=attention))
    root = config_root(model, config)
    models = load_models(model if is_single_file(model) else root, dtype=compute_dtype_for(dtype, compute_dtype),
                         param_dtype=dtype, attention=attention, unet=unet, config=root, loras=loras)
    index = dict(read_json(root / "model_index.json")) if (root / "model_index.json").is_file() else {}
    samplers, default_sampler = load_samplers(root, timestep_spacing, prediction_type)
    name = Path(str(model)).stem if is_single_file(model) else str(model)
    if unet is not None:
        name += f" + {Path(str(unet)).stem}"
    # A1111's names for what made the images, LoRAs apart (the files were read whole just now:
    # hashing them is quick).
    stamp = Stamp(name, file_hash(resolve_file(model), 10) if is_single_file(model) else None)
    for spec in loras or []:
        path, scale = lora_spec(spec)
        name += f" + {Path(str(path)).stem}" + (f":{scale:g}" if scale != 1 else "")
        stamp = dataclasses.replace(stamp, loras=stamp.loras + ((Path(str(path)).stem, scale,
                                                                 file_hash(resolve_file(path), 12)),))
    pipe = Pipeline(models, load_tokenizers(root), samplers, default_sampler=default_sampler, sizes=sizes,
                    images_per_call=images_per_call, devices=devices, model_name=name,
                    force_zeros_for_empty_prompt=index.get("force_zeros_for_empty_prompt", True),
                    step_progress=step_progress, preview_decoder=taesd, max_prompt_chunks=max_prompt_chunks,
                    stamp=stamp)
    if warmup:
        pipe.warmup()
    return pipe
