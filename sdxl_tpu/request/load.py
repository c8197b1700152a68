"""What to load: one object for the model, its weights, the sizes to compile and how, built once by
each entry point (the app, `serve`, `generate`, `bench`) from the options table (each option that
loads something names its field, and its default is the field's: options.py) and given to the
generator as it is."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .names import SDXL_BASE
from ..cli.options import default_of
from .recipes import Recipe
from .values import parse_size

Size = tuple[int, int]
LoraSpec = str | os.PathLike | tuple[str | os.PathLike, float]


def parse_lora_spec(spec: str) -> tuple[str, float]:
    """"file.safetensors[:scale]" -> (file, scale); the scale defaults to 1."""
    path, sep, scale = str(spec).rpartition(":")
    if sep and path and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)", scale):
        return path, float(scale)
    return str(spec), 1.0


def lora_spec(spec: LoraSpec) -> tuple[str, float]:
    """(file, scale) from "file[:scale]", a path (scale 1) or a (file, scale) pair."""
    if isinstance(spec, tuple):
        return str(spec[0]), float(spec[1])
    return parse_lora_spec(str(spec)) if isinstance(spec, str) else (str(spec), 1.0)


def lora_name(path: str) -> str:
    """A LoRA's name as A1111 writes it (`<lora:name:scale>`, "Lora hashes"): its file's stem."""
    return Path(path).stem


def controlnet_name(path: str | os.PathLike) -> str:
    """The name a call picks a loaded ControlNet by: its file's name without .safetensors, or its folder's."""
    path = Path(path)
    return path.stem if path.suffix == ".safetensors" else path.name


@dataclass(frozen=True)
class LoadOptions:
    """An SDXL checkpoint and how it is loaded and compiled.

    model: a Hub id, a local diffusers directory, "tiny", or a single-file .safetensors (A1111 and
        ComfyUI's layout, local or owner/repo/file.safetensors), whose configs and tokenizers come
        from `config` (default SDXL base 1.0's).
    sizes: (width, height) pairs (or "WxH") compiled ahead of time; no other size is served.
    network_sizes: the sizes at which the ControlNets', the IP-Adapter's and the refiner's programs
        are compiled ahead of time too (None: every size); at the others a call that first asks
        for one compiles it.
    images_per_call: images per call (the compiled batch is rounded up to the device count).
    dtype: the parameters' dtype; compute_dtype: the activations' (default: dtype, but float32 on a
        CPU, which has no bfloat16 arithmetic).
    attention: "auto" (the best kernel per platform) or "xla".
    unet: a UNet weights file instead of the checkpoint's (e.g. SDXL-Lightning's).
    loras: LoRA files fused into the weights, "file[:scale]" or (file, scale) (kohya or diffusers).
    embeddings: a folder of textual inversion embeddings (SDXL's .safetensors: clip_l and clip_g) the
        prompts may name by file name, as A1111's embeddings folder.
    upscalers: a folder of upscaler models (ESRGAN, Real-ESRGAN) the hires fix may name, as A1111's.
    controlnets: ControlNets a call may use (diffusers-format folders, or .safetensors files in diffusers'
        names), each by its folder's or file's name (weights/controlnets.py).
    refiner: an SDXL refiner (a diffusers-format folder) a call may hand its last steps to.
    ip_adapter: an IP-Adapter file a call's ControlNet units may name (by its file's name, as
        sd-webui-controlnet names one), with `image_encoder`, the CLIP image encoder's folder it takes.
    timestep_spacing, prediction_type: instead of the scheduler config's ("trailing"; "sample").
    preview: how live previews are decoded: "approx", "taesd" or a TAESD checkpoint.
    max_prompt_chunks: room for the longest prompt, in chunks of 75 tokens.
    step_progress: one compiled program per denoising step (progress, previews, stop between steps),
        else every step in one fused loop on the device.
    """

    model: str = SDXL_BASE
    sizes: tuple[Size, ...] = ((1024, 1024),)
    network_sizes: tuple[Size, ...] | None = None
    images_per_call: int = default_of("--images", "generate")
    dtype: str = default_of("--dtype")
    compute_dtype: str | None = None
    attention: str = default_of("--attention")
    unet: str | None = None
    config: str | None = None
    loras: tuple[Any, ...] = ()
    controlnets: tuple[str, ...] = ()
    refiner: str | None = None
    ip_adapter: str | None = None
    image_encoder: str | None = None
    embeddings: str | None = None
    upscalers: str | None = None
    timestep_spacing: str | None = None
    prediction_type: str | None = None
    preview: str = default_of("--preview")
    max_prompt_chunks: int = default_of("--max-prompt-chunks")
    step_progress: bool = True

    def __post_init__(self) -> None:  # (paths, "WxH" and lists, as callers have them, in one form)
        set_ = lambda name, value: object.__setattr__(self, name, value)
        set_("model", str(self.model))
        set_("sizes", tuple(parse_size(s) for s in self.sizes))
        if self.network_sizes is not None:
            set_("network_sizes", tuple(parse_size(s) for s in self.network_sizes))
        set_("loras", tuple(self.loras or ()))
        set_("controlnets", tuple(str(c) for c in self.controlnets or ()))
        for name in ("unet", "config", "embeddings", "upscalers", "ip_adapter", "image_encoder", "refiner"):
            if getattr(self, name) is not None:
                set_(name, str(getattr(self, name)))

    @property
    def fused_loras(self) -> tuple[tuple[str, float], ...]:
        """Each LoRA fused at load: (name, scale)."""
        return tuple((lora_name(path), scale) for path, scale in map(lora_spec, self.loras))

    @property
    def controlnet_names(self) -> tuple[str, ...]:
        """The ControlNets a call may name."""
        return tuple(map(controlnet_name, self.controlnets))

    @property
    def ip_adapter_names(self) -> tuple[str, ...]:
        """The IP-Adapter a call's units may name (none, or one)."""
        return () if self.ip_adapter is None else (controlnet_name(self.ip_adapter),)

    @property
    def unit_models(self) -> tuple[str, ...]:
        """What a ControlNet unit may name: the ControlNets and the IP-Adapter."""
        return self.controlnet_names + self.ip_adapter_names

    def replace(self, **changes: Any) -> LoadOptions:
        return dataclasses.replace(self, **changes)

    @staticmethod
    def of(values: Mapping[str, Any], recipe: Recipe | None = None) -> LoadOptions:
        """From option values (field -> value; None: not given), the preset's weights and settings
        (`recipe`: model, unet, spacing, prediction type, LoRA) where none is given."""
        given = {k: v for k, v in values.items() if v is not None and v != []}
        if recipe is not None:
            taken = {"model": recipe.model, "unet": recipe.unet, "timestep_spacing": recipe.spacing,
                     "prediction_type": recipe.prediction_type, "loras": [recipe.lora] if recipe.lora else None}
            given = {**{k: v for k, v in taken.items() if v is not None}, **given}
        return LoadOptions(**given)

