"""ControlNet for SDXL (diffusers' ControlNetModel with text_time conditioning), channels-last: a copy
of the UNet's down blocks and mid block that also reads a control image (edges, depth, a pose...) and
returns, through zero-initialised 1x1 convolutions, a residual for each of the UNet's skips and one
for its mid block (unet.ControlResiduals). The smaller published variants ("mid", "small") differ
only in sizes: fewer transformer layers (none at all in a block), a mid block without attention.

Module and attribute names mirror diffusers' module tree, so weight names map mechanically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from .layers import Conv, Precision, TimestepEmbedding
from .unet import ControlResiduals, UNetConfig, conditioning, down_and_mid, down_blocks, mid_block
from .unet_blocks import TextContext

# diffusers' ControlNetModel keys a UNet's config does not have.
_CONTROLNET_KEYS = ("conditioning_channels", "conditioning_embedding_out_channels",
                    "controlnet_conditioning_channel_order", "global_pool_conditions", "mid_block_type")
MID_BLOCKS = ("UNetMidBlock2DCrossAttn", "UNetMidBlock2D")


@dataclass(frozen=True)
class ControlNetConfig:
    unet: UNetConfig                # the UNet whose down half and mid block it copies (as ControlNetModel.from_unet)
    conditioning_channels: int
    conditioning_embedding_out_channels: tuple[int, ...]
    bgr: bool                       # the control image's channels reversed first
    global_pool_conditions: bool    # each residual its spatial mean
    mid_attention: bool             # UNetMidBlock2DCrossAttn, or UNetMidBlock2D's one resnet

    @staticmethod
    def from_dict(cfg: dict[str, Any]) -> ControlNetConfig:
        order = cfg.get("controlnet_conditioning_channel_order", "rgb")
        if order not in ("rgb", "bgr"):
            raise ValueError(f"controlnet config: unsupported controlnet_conditioning_channel_order={order!r} "
                             "(supported: 'rgb', 'bgr')")
        mid = cfg.get("mid_block_type") or "UNetMidBlock2DCrossAttn"
        if mid not in MID_BLOCKS:
            raise ValueError(f"controlnet config: unsupported mid_block_type={mid!r} (supported: {MID_BLOCKS})")
        if "down_block_types" not in cfg:
            raise ValueError("controlnet config: down_block_types is required")
        down = list(cfg["down_block_types"])
        # The UNet it copies, whose up half mirrors the down half (never built: a ControlNet has none).
        unet = {k: v for k, v in cfg.items() if k not in _CONTROLNET_KEYS}
        unet.update(up_block_types=[kind.replace("Down", "Up") for kind in reversed(down)],
                    out_channels=cfg.get("in_channels", 4))
        embedding = cfg.get("conditioning_embedding_out_channels") or (16, 32, 96, 256)
        return ControlNetConfig(
            unet=UNetConfig.from_dict(unet), conditioning_channels=int(cfg.get("conditioning_channels", 3)),
            conditioning_embedding_out_channels=tuple(embedding), bgr=order == "bgr",
            global_pool_conditions=bool(cfg.get("global_pool_conditions", False)),
            mid_attention=mid == "UNetMidBlock2DCrossAttn")

    @property
    def residuals(self) -> int:
        """How many residuals a call returns: one per skip of the UNet, and the mid block's."""
        c = self.unet
        return 1 + sum(c.layers_per_block) + len(c.block_out_channels) - 1 + 1


class ControlNetConditioningEmbedding(nnx.Module):
    """The control image (B, 8H, 8W, C) to the latents' size and conv_in's channels: 3x3 convolutions,
    every other one of stride 2, with SiLU between."""

    def __init__(self, embedding_channels: int, conditioning_channels: int, block_out_channels: tuple[int, ...],
                 p: Precision):
        ch = block_out_channels
        self.conv_in = Conv(conditioning_channels, ch[0], p)
        blocks = []
        for channel_in, channel_out in zip(ch[:-1], ch[1:], strict=True):
            blocks += [Conv(channel_in, channel_in, p), Conv(channel_in, channel_out, p, stride=2)]
        self.blocks = nnx.List(blocks)
        self.conv_out = Conv(ch[-1], embedding_channels, p)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jax.nn.silu(self.conv_in(x))
        for block in self.blocks:
            x = jax.nn.silu(block(x))
        return self.conv_out(x)


def _zero_conv(ch: int, p: Precision) -> Conv:
    return Conv(ch, ch, p, kernel=1, padding=0)


class ControlNetModel(nnx.Module):
    def __init__(self, config: ControlNetConfig, precision: Precision = Precision()):
        c, p = config.unet, precision
        self.config = config
        ch = c.block_out_channels
        self.conv_in = Conv(c.in_channels, ch[0], p)
        self.time_embedding = TimestepEmbedding(ch[0], c.time_embed_dim, p)
        self.add_embedding = TimestepEmbedding(c.projection_class_embeddings_input_dim, c.time_embed_dim, p)
        self.controlnet_cond_embedding = ControlNetConditioningEmbedding(
            ch[0], config.conditioning_channels, config.conditioning_embedding_out_channels, p)
        self.down_blocks = down_blocks(c, p)
        # One zero convolution per skip, in the skips' order: conv_in's, each resnet's, each downsampler's.
        zero = [_zero_conv(ch[0], p)]
        for i, layers in enumerate(c.layers_per_block):
            zero += [_zero_conv(ch[i], p) for _ in range(layers + (i < len(ch) - 1))]
        self.controlnet_down_blocks = nnx.List(zero)
        self.mid_block = mid_block(c, p, has_attention=config.mid_attention)
        self.controlnet_mid_block = _zero_conv(ch[-1], p)

    def __call__(self, sample: jax.Array, timesteps: jax.Array, encoder_hidden_states: jax.Array,
                 text_embeds: jax.Array, time_ids: jax.Array, control_image: jax.Array, scales: jax.Array,
                 context_lengths: jax.Array | None = None) -> ControlResiduals:
        """The residuals for one UNet evaluation on the same inputs (unet.UNet2DConditionModel's),
        given `control_image` (B, 8H, 8W, conditioning_channels) in [0, 1] and `scales` (B, residuals):
        each residual's factor per row (the control weight; 0 outside the steps it acts on; guess mode's
        ramp from 0.1 to 1, as diffusers' logspace(-1, 0)), so that none of them recompiles."""
        c = self.config
        dtype = self.conv_in.dtype or sample.dtype
        emb = conditioning(c.unet, self.time_embedding, self.add_embedding, dtype, timesteps, text_embeds, time_ids)
        context = TextContext(encoder_hidden_states.astype(dtype), context_lengths)
        image = control_image.astype(dtype)
        if c.bgr:
            image = image[..., ::-1]
        x = self.conv_in(sample.astype(dtype)) + self.controlnet_cond_embedding(image)
        x, skips = down_and_mid(self.down_blocks, self.mid_block, x, emb, context)
        residuals = [zero(skip) for zero, skip in zip(self.controlnet_down_blocks, skips, strict=True)]
        residuals.append(self.controlnet_mid_block(x))
        if c.global_pool_conditions:
            residuals = [jnp.mean(r, axis=(1, 2), keepdims=True) for r in residuals]
        scaled = [r * scales[:, i, None, None, None].astype(r.dtype) for i, r in enumerate(residuals)]
        return ControlResiduals(tuple(scaled[:-1]), scaled[-1])


def guess_mode_ramp(residuals: int) -> list[float]:
    """diffusers' guess-mode factors, torch.logspace(-1, 0, residuals): 0.1 for the first skip up to
    1 for the mid block (a plain call: all 1)."""
    return [10.0 ** (-1 + i / (residuals - 1)) for i in range(residuals)]
