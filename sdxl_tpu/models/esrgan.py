"""The upscaler networks A1111 runs for hires fix and Extras (ESRGAN's, Real-ESRGAN's), channels-last, on
images in [0, 1].

    RRDBNet          ESRGAN and Real-ESRGAN's RRDB models (RealESRGAN_x4plus: 23 blocks, x4plus_anime_6B: 6;
                     x2plus and x1 take the image pixel-unshuffled by 2 or 4)
    SRVGGNetCompact  Real-ESRGAN's compact models (realesr-general-x4v3: 32 convs, realesr-animevideov3: 16)

Module trees mirror BasicSR's key layout (`conv_first`, `body.N.rdb1.conv1`, ..., `conv_last`; `body.N` for the
compact one); weights/upscalers.py renames older layouts to it. A network's sizes are read off its checkpoint's
tensor shapes (config_from_shapes), as spandrel reads them: an upscaler file carries no config.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from .layers import Conv, Precision, upsample_nearest

Shapes = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class RRDBConfig:
    in_channels: int = 3  # conv_first's: the image's channels times unshuffle**2
    out_channels: int = 3
    num_feat: int = 64
    num_blocks: int = 23
    num_grow: int = 32
    num_upsamples: int = 2  # each a nearest 2x then a conv (conv_up1, conv_up2, ...)
    unshuffle: int = 1  # the input is pixel-unshuffled by this first (Real-ESRGAN's x2: 2, x1: 4)

    @property
    def scale(self) -> int:
        return 2 ** self.num_upsamples // self.unshuffle


@dataclass(frozen=True)
class SRVGGConfig:
    in_channels: int = 3
    out_channels: int = 3
    num_feat: int = 64
    num_conv: int = 16
    scale: int = 4
    prelu_channels: int = 64  # a PReLU's weights: one a channel (Real-ESRGAN's), or one shared


UpscalerConfig = RRDBConfig | SRVGGConfig


def _indices(shapes: Shapes, pattern: str) -> list[int]:
    return sorted({int(m.group(1)) for k in shapes if (m := re.fullmatch(pattern, k))})


def _shape(shapes: Shapes, key: str, ndim: int) -> tuple[int, ...]:
    shape = shapes.get(key)
    if shape is None or len(shape) != ndim:
        raise ValueError(f"{key} is missing or not {ndim}-dimensional")
    return tuple(shape)


def config_from_shapes(shapes: Shapes) -> UpscalerConfig:
    """The network a state dict (BasicSR's key layout) is for, and its sizes: blocks counted, widths read
    off the tensors, the scale from the upsampling convs (RRDBNet) or the last conv's width (compact).
    Raises ValueError saying what does not fit."""
    if "conv_first.weight" in shapes:
        return _rrdb_config(shapes)
    if "body.0.weight" in shapes and "body.1.weight" in shapes:
        return _srvgg_config(shapes)
    raise ValueError("neither an ESRGAN (RRDBNet: conv_first, body.N.rdbM) nor a Real-ESRGAN compact (SRVGGNet: "
                     "body.N) state dict")


def _rrdb_config(shapes: Shapes) -> RRDBConfig:
    num_feat, in_channels = _shape(shapes, "conv_first.weight", 4)[:2]
    blocks = _indices(shapes, r"body\.(\d+)\.rdb1\.conv1\.weight")
    ups = _indices(shapes, r"conv_up(\d+)\.weight")
    if not blocks or blocks != list(range(len(blocks))):
        raise ValueError(f"RRDBNet blocks body.N are not numbered 0, 1, ...: {blocks[:8]}")
    if ups != list(range(1, len(ups) + 1)) or len(ups) > 3:
        raise ValueError(f"RRDBNet upsampling convs conv_upN are not 1 to 3 of them: {ups}")
    num_grow = _shape(shapes, "body.0.rdb1.conv1.weight", 4)[0]
    out_channels = _shape(shapes, "conv_last.weight", 4)[0]
    unshuffle = {out_channels * 4: 2, out_channels * 16: 4}.get(in_channels, 1)  # (spandrel's rule)
    if (unshuffle == 1 and in_channels != out_channels) or 2 ** len(ups) < unshuffle:
        raise ValueError(f"RRDBNet takes {in_channels} channels and gives {out_channels}: not an image upscaler")
    return RRDBConfig(in_channels, out_channels, num_feat, len(blocks), num_grow, len(ups), unshuffle)


def _srvgg_config(shapes: Shapes) -> SRVGGConfig:
    num_feat, in_channels = _shape(shapes, "body.0.weight", 4)[:2]
    prelu = _shape(shapes, "body.1.weight", 1)[0]
    last = max(_indices(shapes, r"body\.(\d+)\.weight"))
    if last < 2 or last % 2:
        raise ValueError(f"SRVGGNetCompact's last conv is body.{last}: not an even index from 2")
    out = _shape(shapes, f"body.{last}.weight", 4)[0]
    for channels in (in_channels, 3, 4, 1):  # out = channels * scale**2 (spandrel's guess, in its order)
        scale = math.isqrt(out // channels)
        if scale >= 1 and scale * scale * channels == out:
            break
    else:
        raise ValueError(f"SRVGGNetCompact's last conv gives {out} channels: no channels * scale**2")
    if channels != in_channels:
        raise ValueError(f"SRVGGNetCompact takes {in_channels} channels and gives {channels}: not an image upscaler")
    return SRVGGConfig(in_channels, channels, num_feat, (last - 2) // 2, scale, prelu)


def pixel_unshuffle(x: jax.Array, r: int) -> jax.Array:
    """torch's pixel_unshuffle on NHWC: (N, H, W, C) -> (N, H/r, W/r, C*r*r), channel c*r*r + i*r + j."""
    n, h, w, c = x.shape
    x = x.reshape(n, h // r, r, w // r, r, c).transpose(0, 1, 3, 5, 2, 4)
    return x.reshape(n, h // r, w // r, c * r * r)


def pixel_shuffle(x: jax.Array, r: int) -> jax.Array:
    """torch's PixelShuffle on NHWC: (N, H, W, C*r*r) -> (N, H*r, W*r, C)."""
    n, h, w, c = x.shape
    x = x.reshape(n, h, w, c // (r * r), r, r).transpose(0, 1, 4, 2, 5, 3)
    return x.reshape(n, h * r, w * r, c // (r * r))


def _lrelu(x: jax.Array) -> jax.Array:
    return jax.nn.leaky_relu(x, 0.2)


class ResidualDenseBlock(nnx.Module):
    """Five 3x3 convs, each fed everything before it; conv5(...) * 0.2 + x."""

    def __init__(self, nf: int, gc: int, p: Precision):
        self.conv1 = Conv(nf, gc, p)
        self.conv2 = Conv(nf + gc, gc, p)
        self.conv3 = Conv(nf + 2 * gc, gc, p)
        self.conv4 = Conv(nf + 3 * gc, gc, p)
        self.conv5 = Conv(nf + 4 * gc, nf, p)

    def __call__(self, x: jax.Array) -> jax.Array:
        features = [x]
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4):
            features.append(_lrelu(conv(jnp.concatenate(features, axis=-1))))
        return self.conv5(jnp.concatenate(features, axis=-1)) * 0.2 + x


class RRDB(nnx.Module):
    """Residual in residual: three dense blocks, * 0.2 + x."""

    def __init__(self, nf: int, gc: int, p: Precision):
        self.rdb1 = ResidualDenseBlock(nf, gc, p)
        self.rdb2 = ResidualDenseBlock(nf, gc, p)
        self.rdb3 = ResidualDenseBlock(nf, gc, p)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.rdb3(self.rdb2(self.rdb1(x))) * 0.2 + x


class RRDBNet(nnx.Module):
    """ESRGAN's generator: conv_first, the RRDB blocks and conv_body (a residual around them), a nearest 2x
    and a conv for each upsampling, conv_hr, conv_last; LeakyReLU 0.2 throughout."""

    def __init__(self, config: RRDBConfig, precision: Precision | None = None):
        p = precision or Precision()
        c, nf = config, config.num_feat
        self.config, self.dtype = config, p.dtype
        self.conv_first = Conv(c.in_channels, nf, p)
        self.body = nnx.List([RRDB(nf, c.num_grow, p) for _ in range(c.num_blocks)])
        self.conv_body = Conv(nf, nf, p)
        for i in range(1, c.num_upsamples + 1):
            setattr(self, f"conv_up{i}", Conv(nf, nf, p))
        self.conv_hr = Conv(nf, nf, p)
        self.conv_last = Conv(nf, c.out_channels, p)

    @property
    def scale(self) -> int:
        return self.config.scale

    @property
    def multiple(self) -> int:
        """What the side of a tile must be a multiple of (the pixel-unshuffle's factor)."""
        return self.config.unshuffle

    def __call__(self, x: jax.Array) -> jax.Array:
        """(N, H, W, C) in [0, 1] -> (N, H*scale, W*scale, C) (unclipped). A pixel-unshuffled network pads
        the image (reflected) to a multiple of its factor and crops the result, as spandrel does."""
        r, (h, w) = self.config.unshuffle, x.shape[1:3]
        x = x.astype(self.dtype)
        if r > 1:
            x = jnp.pad(x, ((0, 0), (0, -h % r), (0, -w % r), (0, 0)), mode="reflect")
            x = pixel_unshuffle(x, r)
        feat = self.conv_first(x)
        trunk = feat
        for block in self.body:
            trunk = block(trunk)
        feat = feat + self.conv_body(trunk)
        for i in range(1, self.config.num_upsamples + 1):
            feat = _lrelu(getattr(self, f"conv_up{i}")(upsample_nearest(feat)))
        out = self.conv_last(_lrelu(self.conv_hr(feat)))
        return out[:, :h * self.scale, :w * self.scale]


class PReLU(nnx.Module):
    """torch.nn.PReLU: x where x >= 0, else weight * x (per channel, or one weight shared)."""

    def __init__(self, channels: int, p: Precision):
        self.weight = nnx.Param(jnp.zeros((channels,), p.param_dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.where(x >= 0, x, self.weight[...].astype(x.dtype) * x)


class SRVGGNetCompact(nnx.Module):
    """Conv and PReLU pairs at the input's size, a last conv to channels * scale**2, a pixel shuffle, and the
    input (nearest-upsampled) added: the network learns the residual."""

    def __init__(self, config: SRVGGConfig, precision: Precision | None = None):
        p = precision or Precision()
        c, nf = config, config.num_feat
        self.config, self.dtype = config, p.dtype
        layers: list[nnx.Module] = [Conv(c.in_channels, nf, p), PReLU(c.prelu_channels, p)]
        for _ in range(c.num_conv):
            layers += [Conv(nf, nf, p), PReLU(c.prelu_channels, p)]
        layers.append(Conv(nf, c.out_channels * c.scale ** 2, p))
        self.body = nnx.List(layers)

    @property
    def scale(self) -> int:
        return self.config.scale

    @property
    def multiple(self) -> int:
        return 1

    def __call__(self, x: jax.Array) -> jax.Array:
        """(N, H, W, C) in [0, 1] -> (N, H*scale, W*scale, C) (unclipped)."""
        x = x.astype(self.dtype)
        out = x
        for layer in self.body:
            out = layer(out)
        s = self.config.scale
        return pixel_shuffle(out, s) + jnp.repeat(jnp.repeat(x, s, axis=1), s, axis=2)


UpscalerNet = RRDBNet | SRVGGNetCompact


def build_upscaler(config: UpscalerConfig, precision: Precision | None = None) -> UpscalerNet:
    """The network a config describes (parameters zero: weights come from its file)."""
    if isinstance(config, RRDBConfig):
        return RRDBNet(config, precision)
    return SRVGGNetCompact(config, precision)
