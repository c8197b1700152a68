"""LoRA files fused into the weights at load: W <- W + scale * alpha / rank * (up @ down).

Two formats, as people publish them:

    kohya (sd-scripts, A1111, ComfyUI)  lora_unet_<module>.lora_down.weight / .lora_up.weight / .alpha
                                        lora_te1_<module>..., lora_te2_<module>...  (module path with
                                        "_" for ".", UNet modules in SGM or diffusers naming)
    diffusers / PEFT                    unet.<module>.lora_A.weight / .lora_B.weight (optional .alpha),
                                        text_encoder.<module>..., text_encoder_2.<module>...

A LoRA names modules; we match them against the model's own parameter names (and, for kohya's
SGM-named UNet modules, the single-file names of those parameters), so every key either lands
on exactly one weight or is an error naming it: a LoRA for another model (SD 1.5) fails clearly
instead of silently doing nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..request.load import LoraSpec, lora_spec
from .errors import CheckpointError
from .single_file import PREFIXES, place
from .tensors import TensorSource, normalize_clip_name

_KOHYA = {"lora_unet_": "unet", "lora_te1_": "text_encoder", "lora_te2_": "text_encoder_2", "lora_te_": "text_encoder"}
_PEFT = {"unet.": "unet", "text_encoder.": "text_encoder", "text_encoder_2.": "text_encoder_2"}
_KEY = re.compile(r"^(?P<module>.+?)\.(?P<part>lora_down\.weight|lora_up\.weight|lora_A\.weight|lora_B\.weight|alpha)$")
_DOWN, _UP = ("lora_down.weight", "lora_A.weight"), ("lora_up.weight", "lora_B.weight")


@dataclass
class Adapter:
    """One module's low-rank update as the file has it."""
    down: np.ndarray
    up: np.ndarray
    alpha: float | None = None

    def delta(self, shape: tuple[int, ...]) -> np.ndarray:
        rank = self.down.shape[0]
        update = self.up.reshape(self.up.shape[0], rank).astype(np.float32) @ \
            self.down.reshape(rank, -1).astype(np.float32)
        factor = 1.0 if self.alpha is None else self.alpha / rank
        return (factor * update).reshape(shape)


@dataclass
class LoRA:
    """A LoRA file, read: its adapters by component and by module as the file names them."""
    path: Path
    scale: float = 1.0
    kohya: bool = False
    adapters: dict[str, dict[str, Adapter]] = field(default_factory=dict)

    @classmethod
    def read(cls, path: str | os.PathLike, scale: float = 1.0) -> "LoRA":
        source = TensorSource([path])
        keys = source.keys()
        if any("dora_scale" in k or "lora_magnitude_vector" in k for k in keys):
            raise CheckpointError(f"{path} is a DoRA (dora_scale / magnitude vectors), which is not supported")
        lora = cls(Path(path), scale, kohya=any(k.startswith(tuple(_KOHYA)) for k in keys))
        prefixes = _KOHYA if lora.kohya else _PEFT
        longest_first = sorted(prefixes, key=len, reverse=True)  # text_encoder_2. before text_encoder.
        parts: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        unknown = []
        for key in keys:
            prefix = next((p for p in longest_first if key.startswith(p)), None)
            m = _KEY.match(key[len(prefix):]) if prefix else None
            if m is None or prefix is None:
                unknown.append(key)
                continue
            component, module = prefixes[prefix], m["module"]
            if component.startswith("text_encoder") and not lora.kohya:  # transformers 5 saves CLIPTextModel flat
                module = normalize_clip_name(module)
            parts.setdefault((component, module), {})[m["part"]] = source.get(key)
        if unknown:
            raise CheckpointError(f"{path}: not LoRA weights in a format this loader reads (kohya lora_unet_/lora_te1_/"
                                  f"lora_te2_ ... .lora_down/.lora_up/.alpha, or diffusers unet./text_encoder./"
                                  f"text_encoder_2. ... .lora_A/.lora_B): {_shown(unknown)}")
        for (component, module), tensors in parts.items():
            down = next((tensors[k] for k in _DOWN if k in tensors), None)
            up = next((tensors[k] for k in _UP if k in tensors), None)
            if down is None or up is None:
                raise CheckpointError(f"{path}: {component} module {module} lacks its "
                                      f"{'down (A)' if down is None else 'up (B)'} weight")
            if up.shape[1] != down.shape[0]:
                raise CheckpointError(f"{path}: {module}: up {up.shape} and down {down.shape} differ in rank")
            alpha = float(np.asarray(tensors["alpha"]).reshape(())) if "alpha" in tensors else None
            lora.adapters.setdefault(component, {})[module] = Adapter(down, up, alpha)
        if not lora.adapters:
            raise CheckpointError(f"{path} holds no LoRA weights")
        return lora

    def deltas(self, component: str, shapes: Mapping[str, tuple[int, ...]],
               config: Mapping[str, Any]) -> dict[str, Callable[[], np.ndarray]]:
        """This file's updates of `component`, by the model's parameter name (each computed when
        called). Raises CheckpointError naming the modules that match no weight, or misfit one."""
        modules = self._module_names(component, shapes, config)
        out, unmatched, misfit = {}, [], []
        for module, adapter in self.adapters.get(component, {}).items():
            name = modules.get(module)
            if name is None:
                unmatched.append(module)
                continue
            shape = shapes[name]
            if adapter.up.shape[0] != shape[0] or int(np.prod(adapter.down.shape[1:])) != int(np.prod(shape[1:])):
                misfit.append(f"{module} (lora {adapter.up.shape[0]}x{tuple(adapter.down.shape[1:])}, weight {shape})")
                continue
            out[name] = lambda adapter=adapter, shape=shape: self.scale * adapter.delta(shape)
        if unmatched or misfit:
            problems = ([f"modules that match no {component} weight (a LoRA for another model, e.g. SD 1.5?): "
                         f"{_shown(unmatched)}"] if unmatched else []) + \
                       ([f"modules whose shape does not fit: {_shown(misfit)}"] if misfit else [])
            raise CheckpointError(f"LoRA {self.path.name}: " + "; ".join(problems))
        return out

    def _module_names(self, component: str, shapes: Mapping[str, tuple[int, ...]],
                      config: Mapping[str, Any]) -> dict[str, str]:
        """How this file's format names each weight's module -> the weight's parameter name."""
        names: dict[str, str] = {}
        for name in shapes:
            if not name.endswith(".weight"):
                continue
            module = name[:-len(".weight")]
            forms = [module.replace(".", "_")] if self.kohya else [module]
            if self.kohya and component == "unet":  # kohya names SDXL UNet modules as the single file does
                forms.append(place("unet", name, config).key[len(PREFIXES["unet"]):-len(".weight")].replace(".", "_"))
            for form in forms:
                if names.setdefault(form, name) != name:
                    raise CheckpointError(f"LoRA module name {form} is ambiguous ({names[form]} or {name})")
        return names


def _shown(items: list[str], limit: int = 10) -> str:
    items = sorted(items)
    return ", ".join(items[:limit]) + (f", ... ({len(items)} in all)" if len(items) > limit else "")


def read_loras(specs: Sequence[LoraSpec] | None) -> list[LoRA]:
    """LoRA files (see `lora_spec`), each local or on the Hub (owner/repo/file.safetensors)."""
    from .hub import resolve_file

    loras = []
    for spec in specs or []:
        path, scale = lora_spec(spec)
        loras.append(LoRA.read(resolve_file(path), scale))
    return loras


def combined_deltas(loras: list[LoRA], component: str, shapes: Mapping[str, tuple[int, ...]],
                    config: Mapping[str, Any]) -> dict[str, Callable[[], np.ndarray]]:
    """Every LoRA's update of `component`, summed per weight."""
    parts: dict[str, list[Callable[[], np.ndarray]]] = {}
    for lora in loras:
        for name, delta in lora.deltas(component, shapes, config).items():
            parts.setdefault(name, []).append(delta)
    return {name: _summed(fs) for name, fs in parts.items()}


def _summed(deltas: list[Callable[[], np.ndarray]]) -> Callable[[], np.ndarray]:
    """The deltas' sum, computed when asked."""
    def total() -> np.ndarray:
        out = deltas[0]()
        for delta in deltas[1:]:
            out = out + delta()
        return out
    return total
