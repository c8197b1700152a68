"""The SDXL VAE (diffusers AutoencoderKL), channels-last: the decoder for images, the encoder for
images to start from (img2img), each also in overlapping tiles of the sample size, blended as
diffusers' tiled_decode / tiled_encode blend them (the generator tiles large images)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ..request.configs import check_supported
from .layers import Attention, Conv, Downsample2D, GroupNorm, Precision, ResnetBlock2D, Upsample2D

# Config keys whose value must be one of these; down/up_block_types are checked per entry in from_dict.
_REQUIRED_VALUES: dict[str, tuple] = {
    "act_fn": ("silu",),
    "use_quant_conv": (True,),
    "use_post_quant_conv": (True,),
    "mid_block_add_attention": (True,),
    "shift_factor": (None, 0, 0.0),
    "latents_mean": (None,),
    "latents_std": (None,),
}


@dataclass(frozen=True)
class VAEConfig:
    in_channels: int
    out_channels: int
    latent_channels: int
    block_out_channels: tuple[int, ...]
    layers_per_block: int
    norm_num_groups: int
    scaling_factor: float
    # The side of a tile in tiled_decode / tiled_encode (diffusers' tile_sample_min_size); a config
    # without one is taken as SDXL's (1024), not diffusers' class default (32).
    sample_size: int = 1024

    @staticmethod
    def from_dict(cfg: dict[str, Any]) -> "VAEConfig":
        check_supported("vae", cfg, _REQUIRED_VALUES)
        channels = tuple(cfg["block_out_channels"])
        for key, block in (("down_block_types", "DownEncoderBlock2D"), ("up_block_types", "UpDecoderBlock2D")):
            types = cfg.get(key, [block] * len(channels))
            bad = [t for t in types if t != block]
            if bad or len(types) != len(channels):
                raise ValueError(f"vae config: unsupported {key}={types!r} "
                                 f"(needs {block} per block_out_channels entry)")
        return VAEConfig(in_channels=cfg.get("in_channels", 3), out_channels=cfg.get("out_channels", 3),
                         latent_channels=cfg.get("latent_channels", 4), block_out_channels=channels,
                         layers_per_block=cfg.get("layers_per_block", 2),
                         norm_num_groups=cfg.get("norm_num_groups", 32),
                         scaling_factor=cfg.get("scaling_factor", 0.18215),
                         sample_size=_side(cfg.get("sample_size", 1024)))


def _side(sample_size: Any) -> int:
    """diffusers' sample_size: an int, or (height, width) of which it takes the first."""
    return int(sample_size[0] if isinstance(sample_size, (list, tuple)) else sample_size)


TILE_OVERLAP = 0.25  # diffusers' tile_overlap_factor


def _blend(a: jax.Array, b: jax.Array, extent: int, axis: int) -> jax.Array:
    """b's first `extent` rows (axis 1) or columns (axis 2) faded in from a's last ones, linearly
    (diffusers' blend_v / blend_h)."""
    extent = min(a.shape[axis], b.shape[axis], extent)
    if extent <= 0:
        return b
    shape = [1, 1, 1, 1]
    shape[axis] = extent
    w = (jnp.arange(extent, dtype=jnp.float32) / extent).reshape(shape).astype(b.dtype)
    head = jax.lax.slice_in_dim(a, a.shape[axis] - extent, a.shape[axis], axis=axis) * (1 - w) + \
        jax.lax.slice_in_dim(b, 0, extent, axis=axis) * w
    return jnp.concatenate([head, jax.lax.slice_in_dim(b, extent, b.shape[axis], axis=axis)], axis=axis)


def tiled(fn, x: jax.Array, tile_in: int, tile_out: int) -> jax.Array:
    """fn over x (B, H, W, C) in overlapping tiles of tile_in, each giving tile_out, blended with
    the tile above and the one to the left (those already blended, as diffusers' loop leaves them)
    and cut to their stride: diffusers' tiled_decode / tiled_encode, channels-last."""
    stride, blend = int(tile_in * (1 - TILE_OVERLAP)), int(tile_out * TILE_OVERLAP)
    keep = tile_out - blend
    rows = [[fn(x[:, i:i + tile_in, j:j + tile_in]) for j in range(0, x.shape[2], stride)]
            for i in range(0, x.shape[1], stride)]
    out = []
    for i, row in enumerate(rows):
        for j, tile in enumerate(row):
            if i > 0:
                tile = _blend(rows[i - 1][j], tile, blend, axis=1)
            if j > 0:
                tile = _blend(row[j - 1], tile, blend, axis=2)
            row[j] = tile
        out.append(jnp.concatenate([t[:, :keep, :keep] for t in row], axis=2))
    return jnp.concatenate(out, axis=1)


class MidBlock(nnx.Module):
    """UNetMidBlock2D with one single-head self-attention, as in AutoencoderKL."""

    def __init__(self, ch: int, c: VAEConfig, p: Precision):
        g = c.norm_num_groups
        self.resnets = nnx.List([ResnetBlock2D(ch, ch, None, g, 1e-6, p) for _ in range(2)])
        # diffusers' VAE attention keeps softmax in float32 (upcast_softmax).
        self.attentions = nnx.List([Attention(ch, 1, ch, p, qkv_bias=True, group_norm=(g, 1e-6), residual=True,
                                              upcast=True)])

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.resnets[1](self.attentions[0](self.resnets[0](x)))


class DecoderUpBlock(nnx.Module):
    def __init__(self, in_ch: int, out_ch: int, c: VAEConfig, p: Precision, add_upsample: bool):
        self.resnets = nnx.List([ResnetBlock2D(in_ch if j == 0 else out_ch, out_ch, None, c.norm_num_groups, 1e-6, p)
                                 for j in range(c.layers_per_block + 1)])
        self.upsamplers = nnx.List([Upsample2D(out_ch, p)]) if add_upsample else None

    def __call__(self, x: jax.Array) -> jax.Array:
        for resnet in self.resnets:
            x = resnet(x)
        return self.upsamplers[0](x) if self.upsamplers is not None else x


class EncoderDownBlock(nnx.Module):
    def __init__(self, in_ch: int, out_ch: int, c: VAEConfig, p: Precision, add_downsample: bool):
        self.resnets = nnx.List([ResnetBlock2D(in_ch if j == 0 else out_ch, out_ch, None, c.norm_num_groups, 1e-6, p)
                                 for j in range(c.layers_per_block)])
        self.downsamplers = nnx.List([Downsample2D(out_ch, p, padding=0)]) if add_downsample else None

    def __call__(self, x: jax.Array) -> jax.Array:
        for resnet in self.resnets:
            x = resnet(x)
        return self.downsamplers[0](x) if self.downsamplers is not None else x


class Decoder(nnx.Module):
    def __init__(self, c: VAEConfig, p: Precision):
        ch = list(reversed(c.block_out_channels))
        self.conv_in = Conv(c.latent_channels, ch[0], p)
        self.mid_block = MidBlock(ch[0], c, p)
        self.up_blocks = nnx.List([DecoderUpBlock(ch[max(i - 1, 0)], ch[i], c, p, add_upsample=i < len(ch) - 1)
                                   for i in range(len(ch))])
        self.conv_norm_out = GroupNorm(c.norm_num_groups, ch[-1], 1e-6, p)
        self.conv_out = Conv(ch[-1], c.out_channels, p)

    def __call__(self, z: jax.Array) -> jax.Array:
        x = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(jax.nn.silu(self.conv_norm_out(x)))


class Encoder(nnx.Module):
    def __init__(self, c: VAEConfig, p: Precision):
        ch = c.block_out_channels
        self.conv_in = Conv(c.in_channels, ch[0], p)
        self.down_blocks = nnx.List([EncoderDownBlock(ch[max(i - 1, 0)], ch[i], c, p, add_downsample=i < len(ch) - 1)
                                     for i in range(len(ch))])
        self.mid_block = MidBlock(ch[-1], c, p)
        self.conv_norm_out = GroupNorm(c.norm_num_groups, ch[-1], 1e-6, p)
        self.conv_out = Conv(ch[-1], 2 * c.latent_channels, p)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        return self.conv_out(jax.nn.silu(self.conv_norm_out(self.mid_block(x))))


class AutoencoderKL(nnx.Module):
    def __init__(self, config: VAEConfig, precision: Precision = Precision()):
        c, p = config, precision
        self.config = c
        self.encoder = Encoder(c, p)
        self.quant_conv = Conv(2 * c.latent_channels, 2 * c.latent_channels, p, kernel=1, padding=0)
        self.decoder = Decoder(c, p)
        self.post_quant_conv = Conv(c.latent_channels, c.latent_channels, p, kernel=1, padding=0)

    @property
    def tile_sizes(self) -> tuple[int, int]:
        """(pixels, latents) of a tile: diffusers' tile_sample_min_size and tile_latent_min_size."""
        pixels = self.config.sample_size
        return pixels, int(pixels / 2 ** (len(self.config.block_out_channels) - 1))

    def decode(self, latents: jax.Array) -> jax.Array:
        """Latents (B, h, w, C) as the UNet produces them -> images (B, H, W, 3) in [-1, 1] (unclipped).

        Divides by scaling_factor itself, so callers pass the denoised latents unchanged.
        """
        z = latents / self.config.scaling_factor
        return self.decoder(self.post_quant_conv(z.astype(self.post_quant_conv.dtype or z.dtype)))

    def tiled_decode(self, latents: jax.Array) -> jax.Array:
        """decode in overlapping tiles (diffusers' tiled_decode, what its enable_tiling does to
        latents larger than a tile): memory bounded by the tile, whatever the size."""
        pixels, tile = self.tile_sizes
        return tiled(self.decode, latents, tile, pixels)

    def encode(self, images: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Images (B, H, W, 3) in [-1, 1] -> (mean, logvar) of the latent distribution (unscaled)."""
        return self._distribution(self._moments(images))

    def tiled_encode(self, images: jax.Array) -> tuple[jax.Array, jax.Array]:
        """encode in overlapping tiles (diffusers' tiled_encode): their moments blended, then split."""
        pixels, tile = self.tile_sizes
        return self._distribution(tiled(self._moments, images, pixels, tile))

    def _moments(self, images: jax.Array) -> jax.Array:
        return self.quant_conv(self.encoder(images.astype(self.quant_conv.dtype or images.dtype)))

    @staticmethod
    def _distribution(moments: jax.Array) -> tuple[jax.Array, jax.Array]:
        mean, logvar = jnp.split(moments, 2, axis=-1)
        return mean, jnp.clip(logvar, -30.0, 20.0)
