"""The SDXL refiner from disk or the Hub: a diffusers-format folder as stabilityai/stable-diffusion-xl-refiner-1.0
lays it out (model_index.json, text_encoder_2/, unet/; its tokenizer_2 and VAE are the base's), checked
against the base it finishes: its UNet attends to its text encoder's hidden states and is conditioned on
five numbers (the size, the crop and an aesthetic score: requires_aesthetics_score)."""

from __future__ import annotations

import os
from typing import NamedTuple

from ..models.clip import CLIPTextModel
from ..models.layers import Precision
from ..models.unet import UNet2DConditionModel
from .checkpoint import load_text_encoder, load_unet
from .errors import CheckpointError, RefinerError
from .hub import resolve
from .tensors import read_json

REFINER_TIME_IDS = 5  # (height, width) at first, the crop's (top, left), the aesthetic score


class RefinerModels(NamedTuple):
    """A refiner as a Pipeline takes it; `name`: what the parameters call it (A1111's "Refiner: name")."""
    name: str
    unet: UNet2DConditionModel
    text_encoder_2: CLIPTextModel
    force_zeros_for_empty_prompt: bool  # (SDXL refiner 1.0's: false, its empty negative prompt encoded)


def load_refiner(path: str | os.PathLike, precision: Precision = Precision(), latent_channels: int = 4,
                 text_width: int | None = None) -> RefinerModels:
    """The refiner folder (or Hub id) `path`, its networks with their weights, for a model whose latents have
    `latent_channels` and whose second text encoder is `text_width` wide (the refiner's takes its inputs)."""
    try:  # (a Hub id, e.g. stabilityai/stable-diffusion-xl-refiner-1.0, downloaded as a model is)
        root = resolve(path)
    except CheckpointError as e:
        raise RefinerError(f"refiner: {e}") from None
    if not (root / "model_index.json").is_file():
        raise RefinerError(f"refiner {root}: no model_index.json (a diffusers-format folder of the SDXL refiner, "
                           "as stabilityai/stable-diffusion-xl-refiner-1.0 has it, is needed)")
    index = dict(read_json(root / "model_index.json"))
    if not index.get("requires_aesthetics_score"):
        raise RefinerError(f"refiner {root.name}: its model_index.json does not say requires_aesthetics_score "
                           "(an SDXL base model, not a refiner?)")
    try:
        unet = load_unet(root / "unet", precision)
        text_encoder = load_text_encoder(root / "text_encoder_2", precision, with_projection=True)
    except CheckpointError as e:
        raise RefinerError(f"refiner {root.name}: {e}") from None
    c, width = unet.config, text_encoder.config.hidden_size
    pooled, takes = text_encoder.config.projection_dim or 0, set(c.cross_attention_dim)
    if takes != {width} or c.projection_class_embeddings_input_dim != (
            pooled + REFINER_TIME_IDS * c.addition_time_embed_dim):
        raise RefinerError(f"refiner {root.name}: its UNet takes text {max(takes)} wide and "
                           f"{c.projection_class_embeddings_input_dim} numbers; its text encoder gives {width} and a "
                           f"pooled {pooled} (with five size and aesthetic numbers): not an SDXL refiner")
    if text_width is not None and width != text_width:
        raise RefinerError(f"refiner {root.name}: its text encoder is {width} wide, the model's second {text_width}")
    if c.in_channels != latent_channels:
        raise RefinerError(f"refiner {root.name}: its UNet takes {c.in_channels} channels, the model's latents "
                           f"have {latent_channels}")
    return RefinerModels(root.name, unet, text_encoder, bool(index.get("force_zeros_for_empty_prompt", False)))
