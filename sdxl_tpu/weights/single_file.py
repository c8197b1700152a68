"""Single-file SDXL checkpoints: the original (SGM / AUTOMATIC1111 / ComfyUI) layout that most
fine-tunes are published in, read directly, without torch or a conversion step.

One .safetensors holds all four networks under these prefixes:

    model.diffusion_model.               UNet (SGM module names: input_blocks, middle_block, output_blocks)
    first_stage_model.                   VAE (LDM names: down.N.block.M, mid.attn_1, 1x1-conv attention)
    conditioner.embedders.0.transformer. CLIP ViT-L text encoder (transformers names)
    conditioner.embedders.1.model.       OpenCLIP ViT-bigG text encoder (fused in_proj q/k/v, text_projection)

Our models carry diffusers names; `place` says where each of those tensors lives in such a file
(and how it is stored there), so one table serves reading (`SingleFileView`) and writing
(`write_single_file`). The architecture comes from a diffusers config directory (SDXL base 1.0's
unless told otherwise), as diffusers' `from_single_file` does: a single file has no configs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CheckpointError
from .tensors import TensorSource, normalize_clip_name, normalize_vae_name, read_json, weight_files

PREFIXES = {
    "unet": "model.diffusion_model.",
    "vae": "first_stage_model.",
    "text_encoder": "conditioner.embedders.0.transformer.",
    "text_encoder_2": "conditioner.embedders.1.model.",
}

# Tensors single files carry that are not weights of the four networks: the training noise
# schedule (LDM / SGM buffers), EMA copies, CLIP's position ids and OpenCLIP's logit scale.
_NOT_WEIGHTS = re.compile(
    r"^(denoiser\.|model_ema\.|betas$|alphas_cumprod|sqrt_|log_one_minus_alphas_cumprod$|posterior_|logvar$"
    r"|lvlb_weights$)|(^|\.)position_ids$|^conditioner\.embedders\.1\.model\.logit_scale$")

_RESNET_NAMES = {"unet": {"norm1": "in_layers.0", "conv1": "in_layers.2", "time_emb_proj": "emb_layers.1",
                          "norm2": "out_layers.0", "conv2": "out_layers.3", "conv_shortcut": "skip_connection"},
                 "vae": {"conv_shortcut": "nin_shortcut"}}
_UNET_FIXED = {"time_embedding.linear_1": "time_embed.0", "time_embedding.linear_2": "time_embed.2",
               "add_embedding.linear_1": "label_emb.0.0", "add_embedding.linear_2": "label_emb.0.2",
               "conv_in": "input_blocks.0.0", "conv_norm_out": "out.0", "conv_out": "out.2"}
_VAE_ATTENTION = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
_OPENCLIP_FIXED = {"text_model.embeddings.token_embedding.weight": "token_embedding.weight",
                   "text_model.embeddings.position_embedding.weight": "positional_embedding",
                   "text_model.final_layer_norm.weight": "ln_final.weight",
                   "text_model.final_layer_norm.bias": "ln_final.bias"}
_OPENCLIP_LAYER = {"layer_norm1": "ln_1", "layer_norm2": "ln_2", "self_attn.out_proj": "attn.out_proj",
                   "mlp.fc1": "mlp.c_fc", "mlp.fc2": "mlp.c_proj"}
_QKV = ("q_proj", "k_proj", "v_proj")


@dataclass(frozen=True)
class Place:
    """Where one of our (diffusers-named) tensors is in a single file."""
    key: str
    part: int | None = None  # which third (q, k, v) of a fused in_proj tensor
    layout: str = ""  # "transposed" (OpenCLIP's text_projection) or "conv1x1" (the LDM VAE's attention)


def _resnet(kind: str, rest: str) -> str:
    module, leaf = rest.rsplit(".", 1)
    return f"{_RESNET_NAMES[kind].get(module, module)}.{leaf}"


def _unet_key(name: str, config: Mapping[str, Any]) -> str:
    module, leaf = name.rsplit(".", 1)
    if module in _UNET_FIXED:
        return f"{_UNET_FIXED[module]}.{leaf}"
    per_block = int(config["layers_per_block"]) + 1  # SGM numbers every layer of a level, downsampler included
    parts = name.split(".")
    if parts[0] == "down_blocks":
        level, kind, index, rest = int(parts[1]), parts[2], int(parts[3]), ".".join(parts[4:])
        if kind == "downsamplers":  # the level's last input block; "conv." becomes "op."
            return f"input_blocks.{(level + 1) * per_block}.0.op.{rest.removeprefix('conv.')}"
        block = 1 + level * per_block + index
        return (f"input_blocks.{block}.0.{_resnet('unet', rest)}" if kind == "resnets"
                else f"input_blocks.{block}.1.{rest}")
    if parts[0] == "mid_block":
        kind, index, rest = parts[1], int(parts[2]), ".".join(parts[3:])
        if kind == "attentions":
            return f"middle_block.1.{rest}"
        return f"middle_block.{2 * index}.{_resnet('unet', rest)}"
    if parts[0] == "up_blocks":
        level, kind, index, rest = int(parts[1]), parts[2], int(parts[3]), ".".join(parts[4:])
        if kind == "upsamplers":  # after the resnet, and the attention when the level has one
            has_attention = "CrossAttn" in config["up_block_types"][level]
            return f"output_blocks.{level * per_block + per_block - 1}.{2 if has_attention else 1}.{rest}"
        block = level * per_block + index
        return (f"output_blocks.{block}.0.{_resnet('unet', rest)}" if kind == "resnets"
                else f"output_blocks.{block}.1.{rest}")
    raise CheckpointError(f"no single-file name for UNet tensor {name}")


def _vae_key(name: str, config: Mapping[str, Any]) -> tuple[str, str]:
    levels = len(config["block_out_channels"])
    parts = name.split(".")
    coder, rest = parts[0], ".".join(parts[1:])
    if rest.startswith("conv_norm_out."):
        return f"{coder}.norm_out.{rest.split('.', 1)[1]}", ""
    m = re.fullmatch(r"(down|up)_blocks\.(\d+)\.(resnets|downsamplers|upsamplers)\.(\d+)\.(.+)", rest)
    if m:
        direction, level, kind, index, tail = m.groups()
        level = int(level) if direction == "down" else levels - 1 - int(level)  # LDM counts up levels upwards
        if kind == "resnets":
            return f"{coder}.{direction}.{level}.block.{index}.{_resnet('vae', tail)}", ""
        return f"{coder}.{direction}.{level}.{kind[:-2]}.{tail}", ""  # downsample.conv / upsample.conv
    m = re.fullmatch(r"mid_block\.resnets\.(\d+)\.(.+)", rest)
    if m:
        return f"{coder}.mid.block_{int(m[1]) + 1}.{_resnet('vae', m[2])}", ""
    m = re.fullmatch(r"mid_block\.attentions\.0\.(.+)\.(weight|bias)", rest)
    if m:
        layout = "conv1x1" if m[1] != "group_norm" and m[2] == "weight" else ""
        return f"{coder}.mid.attn_1.{_VAE_ATTENTION[m[1]]}.{m[2]}", layout
    return name, ""  # encoder/decoder conv_in, conv_out, quant_conv, post_quant_conv: same names


def _openclip_place(name: str) -> Place:
    if name in _OPENCLIP_FIXED:
        return Place(_OPENCLIP_FIXED[name])
    if name == "text_projection.weight":
        return Place("text_projection", layout="transposed")
    m = re.fullmatch(r"text_model\.encoder\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
    if not m:
        raise CheckpointError(f"no single-file name for text_encoder_2 tensor {name}")
    layer, module, leaf = m.groups()
    block = f"transformer.resblocks.{layer}"
    if module.startswith("self_attn.") and module.split(".")[1] in _QKV:
        return Place(f"{block}.attn.in_proj_{leaf}", part=_QKV.index(module.split(".")[1]))
    return Place(f"{block}.{_OPENCLIP_LAYER[module]}.{leaf}")


def place(component: str, name: str, config: Mapping[str, Any]) -> Place:
    """Where the tensor `name` (diffusers name) of `component` is stored in a single file."""
    prefix = PREFIXES[component]
    if component == "unet":
        return Place(prefix + _unet_key(name, config))
    if component == "vae":
        key, layout = _vae_key(name, config)
        return Place(prefix + key, layout=layout)
    if component == "text_encoder":
        return Place(prefix + name)
    at = _openclip_place(name)
    return Place(prefix + at.key, at.part, at.layout)


class SingleFileView:
    """One component's tensors of a single-file checkpoint, under the model's own (diffusers)
    names: what `weights.load_into` reads. Tensors of the component's prefix that no model
    tensor claims are listed under their file names, so they are reported as unexpected."""

    def __init__(self, source: TensorSource, component: str, names: Iterable[str], config: Mapping[str, Any]):
        self.source = source
        self.places = {name: place(component, name, config) for name in names}
        present = set(source.keys())
        claimed = {at.key for at in self.places.values()}
        self._keys = [name for name, at in self.places.items() if at.key in present]
        self._keys += sorted(k for k in present - claimed
                             if k.startswith(PREFIXES[component]) and not _NOT_WEIGHTS.search(k))

    def keys(self) -> list[str]:
        return self._keys

    def label(self, name: str) -> str:
        at = self.places.get(name)
        return name if at is None else at.key + (f"[{'qkv'[at.part]}]" if at.part is not None else "")

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self.places:
            return self.source.shape(name)
        at = self.places[name]
        shape = self.source.shape(at.key)
        if at.part is not None:
            return (shape[0] // 3, *shape[1:])
        if at.layout == "transposed":
            return shape[::-1]
        if at.layout == "conv1x1" and shape[2:] == (1, 1):
            return shape[:2]
        return shape

    def get(self, name: str) -> np.ndarray:
        at = self.places[name]
        array = self.source.get(at.key)
        if at.part is not None:
            rows = array.shape[0] // 3
            return array[at.part * rows:(at.part + 1) * rows]
        if at.layout == "transposed":
            return array.T
        if at.layout == "conv1x1":
            return array.reshape(array.shape[:2])
        return array


def check_single_file(source: TensorSource, path: os.PathLike | str, components: Iterable[str]) -> None:
    """Refuse, by name, files that are not SDXL single-file checkpoints (an SD 1.x/2.x file, the
    refiner, a LoRA, a diffusers-format file) before any tensor is matched."""
    keys = source.keys()
    if any(k.startswith("cond_stage_model.") for k in keys):
        raise CheckpointError(f"{path} is a Stable Diffusion 1.x/2.x checkpoint (cond_stage_model.*), not SDXL")
    wanted = [PREFIXES[c] for c in components]
    for prefix in wanted:
        if not any(k.startswith(prefix) for k in keys):
            hint = " (an SDXL refiner?)" if prefix == PREFIXES["text_encoder"] and any(
                k.startswith("conditioner.embedders.0.model.") for k in keys) else ""
            raise CheckpointError(f"{path} has no tensors under {prefix}: not an SDXL single-file checkpoint{hint}; "
                                  f"its first keys: {', '.join(sorted(keys)[:3])}")
    stray = sorted(k for k in keys if not k.startswith(tuple(PREFIXES.values())) and not _NOT_WEIGHTS.search(k))
    if stray:
        shown = ", ".join(stray[:10]) + (f", ... ({len(stray)} in all)" if len(stray) > 10 else "")
        raise CheckpointError(f"{path}: unexpected tensors outside the four SDXL networks: {shown}")


def in_single_file_layout(source: TensorSource, component: str) -> bool:
    """Whether `source` holds `component` in the single-file layout (else: in diffusers names)."""
    return any(k.startswith(PREFIXES[component]) for k in source.keys())


def write_single_file(root: os.PathLike | str, path: os.PathLike | str) -> Path:
    """Write a diffusers-format SDXL directory as one single-file checkpoint (the layout above),
    e.g. to test loaders against each other. Returns `path`."""
    from safetensors.numpy import save_file

    root = Path(root)
    out: dict[str, np.ndarray] = {}
    fused: dict[str, list[np.ndarray | None]] = {}
    renames = {"text_encoder": normalize_clip_name, "text_encoder_2": normalize_clip_name, "vae": normalize_vae_name}
    for component in PREFIXES:
        config = dict(read_json(root / component / "config.json"))
        source = TensorSource(weight_files(root / component))
        for key in source.keys():
            if _NOT_WEIGHTS.search(key):
                continue
            name = renames.get(component, lambda k: k)(key)
            at, array = place(component, name, config), np.asarray(source.get(key))
            if at.part is not None:
                fused.setdefault(at.key, [None, None, None])[at.part] = array
                continue
            if at.layout == "transposed":
                array = array.T
            elif at.layout == "conv1x1":
                array = array.reshape(*array.shape, 1, 1)
            out[at.key] = np.ascontiguousarray(array)
    for key, parts in fused.items():
        present = [p for p in parts if p is not None]
        if len(present) != len(parts):
            raise CheckpointError(f"{root}: q, k and v are not all present for {key}")
        out[key] = np.concatenate(present)
    out[PREFIXES["text_encoder_2"] + "logit_scale"] = np.array(np.log(100.0), np.float32)  # as OpenCLIP keeps it
    save_file(out, str(path))
    return Path(path)
