"""CLIP's image tower, mirroring transformers' CLIPVisionModelWithProjection: the image encoder an
IP-Adapter reads an image prompt with (ViT-H/14 for the "plus" SDXL adapters, ViT-bigG/14 for the
plain one: sizes in the config, nothing else differs).

Its encoder layers are the text tower's (clip.py), without the causal mask. Pixels come in
channels-last, preprocessed as CLIPImageProcessor does (imaging/clip_image.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from .clip import CLIPEncoderLayer
from .layers import Embed, LayerNorm, Linear, Precision


@dataclass(frozen=True)
class CLIPVisionConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    projection_dim: int
    num_channels: int = 3
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5

    @property
    def num_positions(self) -> int:
        """The class token and one token a patch."""
        return (self.image_size // self.patch_size) ** 2 + 1

    @staticmethod
    def from_dict(cfg: dict[str, Any]) -> "CLIPVisionConfig":
        """transformers' CLIPVisionConfig (config.json of a CLIPVisionModelWithProjection)."""
        act = cfg.get("hidden_act", "quick_gelu")
        if act not in ("quick_gelu", "gelu"):
            raise ValueError(f"image encoder config: unsupported hidden_act={act!r} (supported: quick_gelu, gelu)")
        try:
            c = CLIPVisionConfig(
                hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
                num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
                image_size=cfg.get("image_size", 224), patch_size=cfg.get("patch_size", 32),
                projection_dim=cfg.get("projection_dim", 512), num_channels=cfg.get("num_channels", 3),
                hidden_act=act, layer_norm_eps=cfg.get("layer_norm_eps", 1e-5))
        except KeyError as e:
            raise ValueError(f"image encoder config: missing key {e.args[0]!r}") from None
        if c.image_size % c.patch_size or c.hidden_size % c.num_attention_heads or c.num_hidden_layers < 2:
            raise ValueError(f"image encoder config: image_size {c.image_size} must be a multiple of patch_size "
                             f"{c.patch_size}, hidden_size {c.hidden_size} of num_attention_heads "
                             f"{c.num_attention_heads}, and there must be 2 layers or more")
        return c


class PatchEmbedding(nnx.Module):
    """torch.nn.Conv2d(kernel = stride = patch, no bias): an image's patches, each to a token."""

    def __init__(self, c: CLIPVisionConfig, p: Precision):
        self.dtype, self.patch = p.dtype, c.patch_size
        self.kernel = nnx.Param(jnp.zeros((c.patch_size, c.patch_size, c.num_channels, c.hidden_size),
                                          p.param_dtype))

    def __call__(self, pixels: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(pixels.astype(self.dtype), self.kernel[...].astype(self.dtype),
                                            (self.patch, self.patch), "VALID",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))


class CLIPVisionEmbeddings(nnx.Module):
    def __init__(self, c: CLIPVisionConfig, p: Precision):
        self.class_embedding = nnx.Param(jnp.zeros((c.hidden_size,), p.param_dtype))
        self.patch_embedding = PatchEmbedding(c, p)
        self.position_embedding = Embed(c.num_positions, c.hidden_size, p)

    def __call__(self, pixels: jax.Array) -> jax.Array:
        patches = self.patch_embedding(pixels)
        b, d = patches.shape[0], patches.shape[-1]
        cls = jnp.broadcast_to(self.class_embedding[...].astype(patches.dtype), (b, 1, d))
        tokens = jnp.concatenate([cls, patches.reshape(b, -1, d)], axis=1)
        return tokens + self.position_embedding(jnp.arange(tokens.shape[1]))[None]


class CLIPVisionEncoder(nnx.Module):
    def __init__(self, c: CLIPVisionConfig, p: Precision):
        self.layers = nnx.List([CLIPEncoderLayer(c, p, causal=False) for _ in range(c.num_hidden_layers)])


class CLIPVisionTransformer(nnx.Module):
    def __init__(self, c: CLIPVisionConfig, p: Precision):
        self.embeddings = CLIPVisionEmbeddings(c, p)
        self.pre_layrnorm = LayerNorm(c.hidden_size, c.layer_norm_eps, p)  # (sic: transformers' name)
        self.encoder = CLIPVisionEncoder(c, p)
        self.post_layernorm = LayerNorm(c.hidden_size, c.layer_norm_eps, p)


class ImageFeatures(NamedTuple):
    """What IP-Adapters take of an image (diffusers' encode_image): the projected class token
    (`image_embeds`, B x projection_dim: the plain adapter's) and the penultimate layer's hidden
    states (`penultimate`, B x tokens x hidden_size: transformers' hidden_states[-2], the plus's)."""
    image_embeds: jax.Array
    penultimate: jax.Array


class CLIPVisionModelWithProjection(nnx.Module):
    def __init__(self, config: CLIPVisionConfig, precision: Precision = Precision()):
        self.config = config
        self.vision_model = CLIPVisionTransformer(config, precision)
        self.visual_projection = Linear(config.hidden_size, config.projection_dim, precision, bias=False)

    def __call__(self, pixels: jax.Array) -> ImageFeatures:
        """pixels: (B, image_size, image_size, C), normalized (imaging/clip_image.py)."""
        vm = self.vision_model
        x = vm.pre_layrnorm(vm.embeddings(pixels))
        for layer in vm.encoder.layers[:-1]:
            x = layer(x)
        penultimate = x
        pooled = vm.post_layernorm(vm.encoder.layers[-1](x)[:, 0])
        return ImageFeatures(self.visual_projection(pooled), penultimate)
