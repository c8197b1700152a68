"""ControlNets from disk: a diffusers-format folder (config.json and its weights), or one
.safetensors file in diffusers' names, as A1111 and ComfyUI users keep them in models/ControlNet
(diffusers' and lllyasviel's SDXL ControlNets are published so), whose config is read off its
tensors' shapes. Weights in the original (LDM) layout and control-LoRAs are refused by name."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from flax import nnx

from ..models.controlnet import ControlNetConfig, ControlNetModel
from ..models.layers import Precision
from .tensors import CheckpointError, TensorSource, load_into, read_json, weight_files

# What shapes cannot say, as SDXL's ControlNets (and SDXL's UNet) have it.
SDXL_HEAD_DIM = 64  # each attention head's width: diffusers' attention_head_dim [5, 10, 20] at 320/640/1280
SDXL_TIME_IDS_DIM = 256  # addition_time_embed_dim: six size numbers, 256 wide each


def _count(keys: list[str], prefix: str) -> int:
    """How many numbered children `prefix` has (prefix.0., prefix.1., ...)."""
    found = {int(m.group(1)) for k in keys if (m := re.match(re.escape(prefix) + r"\.(\d+)\.", k))}
    return max(found) + 1 if found else 0


def config_from_tensors(source: TensorSource) -> dict[str, Any]:
    """A diffusers ControlNetModel config for the tensors of a single file, from their names and shapes."""
    keys = source.keys()
    if "conv_in.weight" not in keys or not any(k.startswith("controlnet_down_blocks.") for k in keys):
        if any(k.startswith(("control_model.", "input_blocks.", "lora_controlnet")) for k in keys):
            raise CheckpointError("this ControlNet file is in the original (LDM) layout or a control-LoRA; "
                                  "only ControlNets in diffusers' names are read (diffusers' and lllyasviel's SDXL "
                                  "ControlNets are published so)")
        raise CheckpointError("not a ControlNet: no conv_in and controlnet_down_blocks tensors")
    blocks = _count(keys, "down_blocks")
    channels = [source.shape(f"down_blocks.{i}.resnets.0.conv1.weight")[0] for i in range(blocks)]
    attention = [_count(keys, f"down_blocks.{i}.attentions") > 0 for i in range(blocks)]
    depth = [_count(keys, f"down_blocks.{i}.attentions.0.transformer_blocks") if attention[i] else 1
             for i in range(blocks)]
    proj = [k for k in keys if k.endswith("proj_in.weight")]
    to_k = [k for k in keys if k.endswith("attn2.to_k.weight")]
    embedding = _count(keys, "controlnet_cond_embedding.blocks")
    add_in = source.shape("add_embedding.linear_1.weight")[1]
    return {
        "_class_name": "ControlNetModel",
        "in_channels": source.shape("conv_in.weight")[1],
        "conditioning_channels": source.shape("controlnet_cond_embedding.conv_in.weight")[1],
        "down_block_types": ["CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attention],
        "block_out_channels": channels,
        "layers_per_block": _count(keys, "down_blocks.0.resnets"),
        "transformer_layers_per_block": depth,
        "attention_head_dim": [max(c // SDXL_HEAD_DIM, 1) for c in channels],
        "cross_attention_dim": source.shape(to_k[0])[1] if to_k else 2048,
        "use_linear_projection": bool(proj) and len(source.shape(proj[0])) == 2,
        "mid_block_type": "UNetMidBlock2DCrossAttn" if _count(keys, "mid_block.attentions") else "UNetMidBlock2D",
        "addition_embed_type": "text_time", "addition_time_embed_dim": SDXL_TIME_IDS_DIM,
        "projection_class_embeddings_input_dim": add_in,
        "conditioning_embedding_out_channels": [source.shape("controlnet_cond_embedding.conv_in.weight")[0]] + [
            source.shape(f"controlnet_cond_embedding.blocks.{j}.weight")[0] for j in range(1, embedding, 2)],
    }


def load_controlnet(path: str | Path, precision: Precision) -> ControlNetModel:
    """A ControlNet: a diffusers-format folder, or one .safetensors file in diffusers' names."""
    path = Path(path)
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise CheckpointError(f"missing {config_file}")
        raw, source = dict(read_json(config_file)), TensorSource(weight_files(path))
    elif path.suffix == ".safetensors" and path.is_file():
        source = TensorSource([path])
        raw = config_from_tensors(source)
    else:
        raise CheckpointError(f"ControlNet {path}: not a diffusers folder or a .safetensors file")
    try:
        config = ControlNetConfig.from_dict(raw)
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"ControlNet {path.name}: {e}") from None
    model = nnx.eval_shape(lambda: ControlNetModel(config, precision))
    return load_into(model, source, component=f"controlnet ({path.name})")
