"""TAESD, the tiny autoencoder (diffusers AutoencoderTiny; madebyollin/taesdxl for SDXL), channels-last: its
decoder turns the UNet's latents into a rough image in a fraction of the VAE's time (live previews). The module
tree mirrors diffusers' (`encoder.layers.N`, parameterless layers keep their index): weights/tensors.py maps
the names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ..request.configs import check_supported
from .layers import Conv, Precision

_REQUIRED_VALUES: dict[str, tuple] = {"act_fn": ("relu",), "upsample_fn": ("nearest",), "shift_factor": (None, 0, 0.0)}


@dataclass(frozen=True)
class TAESDConfig:
    in_channels: int = 3
    out_channels: int = 3
    encoder_block_out_channels: tuple[int, ...] = (64, 64, 64, 64)
    decoder_block_out_channels: tuple[int, ...] = (64, 64, 64, 64)
    latent_channels: int = 4
    upsampling_scaling_factor: int = 2
    num_encoder_blocks: tuple[int, ...] = (1, 3, 3, 3)
    num_decoder_blocks: tuple[int, ...] = (3, 3, 3, 1)
    scaling_factor: float = 1.0

    @staticmethod
    def from_dict(cfg: dict[str, Any]) -> TAESDConfig:
        """From diffusers' config.json keys (latent_magnitude/shift only matter to its forward's quantisation)."""
        check_supported("taesd", cfg, _REQUIRED_VALUES)
        d = TAESDConfig()
        values: dict[str, Any] = {k: tuple(cfg[k]) if isinstance(cfg.get(k), list) else cfg.get(k, getattr(d, k))
                                  for k in d.__dataclass_fields__}
        c = TAESDConfig(**values)
        for part in ("encoder", "decoder"):
            widths, blocks = getattr(c, f"{part}_block_out_channels"), getattr(c, f"num_{part}_blocks")
            if len(widths) != len(blocks) or not widths:
                raise ValueError(f"taesd config: {part}_block_out_channels and num_{part}_blocks differ in length")
            if len(set(widths)) != 1:  # each stage's convs take its own width: diffusers only runs equal ones
                raise ValueError(f"taesd config: unsupported {part}_block_out_channels={list(widths)} (must be equal)")
        if not (isinstance(c.upsampling_scaling_factor, int) and c.upsampling_scaling_factor >= 1):
            raise ValueError(f"taesd config: unsupported upsampling_scaling_factor={c.upsampling_scaling_factor!r}")
        return c


class BiaslessConv(Conv):
    """nn.Conv2d(..., bias=False)."""

    def __init__(self, in_ch: int, out_ch: int, p: Precision, *, stride: int = 1):
        super().__init__(in_ch, out_ch, p, stride=stride)
        self.bias = None

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x.astype(self.dtype), self.kernel[...].astype(self.dtype),
                                            (self.stride, self.stride), self.padding,
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))


class ReLU(nnx.Module):
    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(x)


class Upsample(nnx.Module):
    """nn.Upsample(scale_factor=factor, mode="nearest") with an integer factor."""
    def __init__(self, factor: int):
        self.factor = factor

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.repeat(jnp.repeat(x, self.factor, axis=1), self.factor, axis=2)


def _run(layers: nnx.List, x: jax.Array) -> jax.Array:  # nn.Sequential
    for layer in layers:
        x = layer(x)
    return x


class AutoencoderTinyBlock(nnx.Module):
    """relu(conv(x) + x), conv = conv3x3 -> relu -> conv3x3 -> relu -> conv3x3 (in == out: skip is Identity)."""

    def __init__(self, ch: int, p: Precision):
        self.conv = nnx.List([Conv(ch, ch, p), ReLU(), Conv(ch, ch, p), ReLU(), Conv(ch, ch, p)])

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(_run(self.conv, x) + x)


class EncoderTiny(nnx.Module):
    def __init__(self, c: TAESDConfig, p: Precision):
        layers: list[nnx.Module] = []
        for i, (ch, n) in enumerate(zip(c.encoder_block_out_channels, c.num_encoder_blocks)):
            layers.append(Conv(c.in_channels, ch, p) if i == 0 else BiaslessConv(ch, ch, p, stride=2))
            layers += [AutoencoderTinyBlock(ch, p) for _ in range(n)]
        layers.append(Conv(c.encoder_block_out_channels[-1], c.latent_channels, p))
        self.layers = nnx.List(layers)

    def __call__(self, x: jax.Array) -> jax.Array:
        return _run(self.layers, (x + 1) / 2)  # [-1, 1] -> TAESD's [0, 1]


class DecoderTiny(nnx.Module):
    def __init__(self, c: TAESDConfig, p: Precision):
        widths = c.decoder_block_out_channels
        layers: list[nnx.Module] = [Conv(c.latent_channels, widths[0], p), ReLU()]
        for i, (ch, n) in enumerate(zip(widths, c.num_decoder_blocks)):
            final = i == len(widths) - 1
            layers += [AutoencoderTinyBlock(ch, p) for _ in range(n)]
            layers += [Conv(ch, c.out_channels, p)] if final else [Upsample(c.upsampling_scaling_factor),
                                                                    BiaslessConv(ch, ch, p)]
        self.layers = nnx.List(layers)

    def __call__(self, z: jax.Array) -> jax.Array:
        x = jnp.tanh(z / 3) * 3  # diffusers' soft clamp of the latents to (-3, 3)
        return _run(self.layers, x) * 2 - 1  # [0, 1] -> [-1, 1]


class AutoencoderTiny(nnx.Module):
    def __init__(self, config: TAESDConfig, precision: Precision | None = None):
        precision = precision or Precision()
        self.config, self.dtype = config, precision.dtype
        self.encoder = EncoderTiny(config, precision)
        self.decoder = DecoderTiny(config, precision)

    @property
    def upscale(self) -> int:
        """Image pixels per latent pixel along each side (8 for taesdxl)."""
        return self.config.upsampling_scaling_factor ** (len(self.config.num_decoder_blocks) - 1)

    def decode(self, latents: jax.Array) -> jax.Array:
        """Latents (B, h, w, C) as the UNet produces them -> images (B, h*upscale, w*upscale, 3)
        in [-1, 1] (unclipped). Divides by scaling_factor (1.0 for taesdxl), as diffusers' pipelines do."""
        return self.decoder((latents / self.config.scaling_factor).astype(self.dtype))

    def encode(self, images: jax.Array) -> jax.Array:
        """Images (B, H, W, 3) in [-1, 1] -> latents (B, H/8, W/8, C) for taesdxl, on the UNet's scale."""
        return self.encoder(images.astype(self.dtype)) * self.config.scaling_factor
