"""The SDXL UNet's blocks (diffusers' unet_2d_blocks.py and transformer_2d.py): down, up and mid
blocks of ResNets and Transformer2DModels, channels-last. Module and attribute names mirror
diffusers' module tree, so weight names map mechanically."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from .layers import (Attention, Conv, Downsample2D, GroupNorm, LayerNorm, Linear, Precision, ResnetBlock2D, Upsample2D,
                     gelu)


class ImagePrompt(NamedTuple):
    """An IP-Adapter's image tokens as each transformer block's cross-attention sees them: keys and
    values (B, T, H, D) by BasicTransformerBlock.cross_index (ip_adapter.IPAdapter), and each row's
    scale (B,): an array, so that a new scale (0: off) is a new value, not a new program."""
    kv: tuple[tuple[jax.Array, jax.Array], ...]
    scale: jax.Array


class TextContext(NamedTuple):
    """What cross-attention attends to: the text embeddings (B, L, D) and, for prompts in chunks
    of `chunk` tokens padded to a fixed length, how many of each row's L tokens count (B,); and
    where a call projected them once for all its steps, each transformer block's keys and values
    (`kv`, by BasicTransformerBlock.cross_index: UNet2DConditionModel.cross_kv); and an
    IP-Adapter's image prompt (`image`), if any."""
    states: jax.Array
    lengths: jax.Array | None = None
    chunk: int = 77
    kv: tuple[tuple[jax.Array, jax.Array], ...] | None = None
    image: ImagePrompt | None = None


class FeedForwardGEGLU(nnx.Module):
    """diffusers GEGLU: proj -> split into (hidden, gate) -> hidden * gelu(gate).

    The two halves are projected as two matmuls on the kernel's halves: one UNet evaluation at
    1024x1024 on a TPU v5e took 130.3 ms against 132.7 with one matmul split afterwards (2026-12-06),
    where XLA fused the GEGLU into the down projection as a slow prologue."""

    def __init__(self, dim: int, inner: int, p: Precision):
        self.proj = Linear(dim, inner * 2, p)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.proj.dtype)
        kernel, half = self.proj.kernel[...].astype(x.dtype), self.proj.kernel.shape[1] // 2
        hidden, gate = x @ kernel[:, :half], x @ kernel[:, half:]
        if self.proj.bias is not None:
            bias = self.proj.bias[...].astype(x.dtype)
            hidden, gate = hidden + bias[:half], gate + bias[half:]
        return hidden * gelu(gate)


class FeedForward(nnx.Module):
    def __init__(self, dim: int, p: Precision):
        # diffusers' net = [GEGLU, Dropout, Linear]: keep the indices so names map 1:1.
        self.net = nnx.Dict({"0": FeedForwardGEGLU(dim, dim * 4, p), "2": Linear(dim * 4, dim, p)})

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.net["2"](self.net["0"](x))


class BasicTransformerBlock(nnx.Module):
    def __init__(self, dim: int, heads: int, context_dim: int, upcast: bool, p: Precision):
        self.norm1 = LayerNorm(dim, 1e-5, p)
        self.attn1 = Attention(dim, heads, dim // heads, p, upcast=upcast)
        self.norm2 = LayerNorm(dim, 1e-5, p)
        self.attn2 = Attention(dim, heads, dim // heads, p, context_dim=context_dim, upcast=upcast)
        self.norm3 = LayerNorm(dim, 1e-5, p)
        self.ff = FeedForward(dim, p)
        self.cross_index: int | None = None  # its keys and values in TextContext.kv (set by the UNet)

    def __call__(self, x: jax.Array, context: TextContext) -> jax.Array:
        x = x + self.attn1(self.norm1(x))
        kv = None if context.kv is None or self.cross_index is None else context.kv[self.cross_index]
        image = (None if context.image is None or self.cross_index is None
                 else (*context.image.kv[self.cross_index], context.image.scale))
        x = x + self.attn2(self.norm2(x), context.states, context.lengths, context.chunk, kv=kv, image_kv=image)
        return x + self.ff(self.norm3(x))


class Transformer2DModel(nnx.Module):
    def __init__(self, ch: int, heads: int, depth: int, context_dim: int, groups: int, p: Precision, *,
                 use_linear_projection: bool, upcast_attention: bool):
        self.norm = GroupNorm(groups, ch, 1e-6, p)
        self.linear = use_linear_projection
        # Older checkpoints (SD 1.x style) project with 1x1 convs instead of linears.
        self.proj_in = Linear(ch, ch, p) if self.linear else Conv(ch, ch, p, kernel=1, padding=0)
        self.transformer_blocks = nnx.List(
            [BasicTransformerBlock(ch, heads, context_dim, upcast_attention, p) for _ in range(depth)])
        self.proj_out = Linear(ch, ch, p) if self.linear else Conv(ch, ch, p, kernel=1, padding=0)

    def __call__(self, x: jax.Array, context: TextContext) -> jax.Array:
        b, h, w, ch = x.shape
        y = self.norm(x)
        if not self.linear:
            y = self.proj_in(y)
        y = y.reshape(b, h * w, ch)
        if self.linear:
            y = self.proj_in(y)
        for block in self.transformer_blocks:
            y = block(y, context)
        if self.linear:
            y = self.proj_out(y)
        y = y.reshape(b, h, w, ch)
        if not self.linear:
            y = self.proj_out(y)
        return x + y


def _transformers(ch: int, depths: Sequence[int], n: int, heads: int, context_dim: int, groups: int,
                  linear: bool, upcast: bool, p: Precision) -> nnx.List:
    """A block's `attentions`: one Transformer2DModel after each of its n resnets, of depths[j] layers."""
    return nnx.List([Transformer2DModel(ch, heads, depths[j], context_dim, groups, p, use_linear_projection=linear,
                                        upcast_attention=upcast) for j in range(n)])


class DownBlock(nnx.Module):
    """DownBlock2D, or CrossAttnDownBlock2D when `has_attention`."""

    def __init__(self, in_channels: int, out_channels: int, temb_channels: int, num_layers: int, *,
                 has_attention: bool, transformer_layers_per_block: Sequence[int], num_attention_heads: int,
                 cross_attention_dim: int, resnet_groups: int, resnet_eps: float, use_linear_projection: bool,
                 upcast_attention: bool, add_downsample: bool, p: Precision):
        self.resnets = nnx.List([ResnetBlock2D(in_channels if j == 0 else out_channels, out_channels, temb_channels,
                                               resnet_groups, resnet_eps, p) for j in range(num_layers)])
        self.attentions = _transformers(out_channels, transformer_layers_per_block, num_layers, num_attention_heads,
                                        cross_attention_dim, resnet_groups, use_linear_projection, upcast_attention,
                                        p) if has_attention else None
        self.downsamplers = nnx.List([Downsample2D(out_channels, p)]) if add_downsample else None

    def __call__(self, x, temb, context):
        skips = []
        for j, resnet in enumerate(self.resnets):
            x = resnet(x, temb)
            if self.attentions is not None:
                x = self.attentions[j](x, context)
            skips.append(x)
        if self.downsamplers is not None:
            x = self.downsamplers[0](x)
            skips.append(x)
        return x, skips


class UpBlock(nnx.Module):
    """UpBlock2D, or CrossAttnUpBlock2D when `has_attention`.

    Resnet j takes the previous output (prev_output_channel for j == 0, else out_channels) concatenated with a
    skip; the last skip is the matching down block's input (in_channels).
    """

    def __init__(self, in_channels: int, out_channels: int, prev_output_channel: int, temb_channels: int,
                 num_layers: int, *, has_attention: bool, transformer_layers_per_block: Sequence[int],
                 num_attention_heads: int, cross_attention_dim: int, resnet_groups: int, resnet_eps: float,
                 use_linear_projection: bool, upcast_attention: bool, add_upsample: bool, p: Precision):
        n = num_layers
        res_in = [prev_output_channel] + [out_channels] * (n - 1)
        skip = [out_channels] * (n - 1) + [in_channels]
        self.resnets = nnx.List([ResnetBlock2D(res_in[j] + skip[j], out_channels, temb_channels, resnet_groups,
                                               resnet_eps, p) for j in range(n)])
        self.attentions = _transformers(out_channels, transformer_layers_per_block, n, num_attention_heads,
                                        cross_attention_dim, resnet_groups, use_linear_projection, upcast_attention,
                                        p) if has_attention else None
        self.upsamplers = nnx.List([Upsample2D(out_channels, p)]) if add_upsample else None

    def __call__(self, x, skips, temb, context, upsample_size):
        for j, resnet in enumerate(self.resnets):
            x = resnet(jnp.concatenate([x, skips.pop()], axis=-1), temb)
            if self.attentions is not None:
                x = self.attentions[j](x, context)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x, upsample_size)
        return x


class MidBlock(nnx.Module):
    """UNetMidBlock2DCrossAttn: resnet, then (attention, resnet) pairs; without attention (a
    ControlNet's UNetMidBlock2D with no layers) its one resnet."""

    def __init__(self, in_channels: int, temb_channels: int, *, transformer_layers_per_block: Sequence[int],
                 num_attention_heads: int, cross_attention_dim: int, resnet_groups: int, resnet_eps: float,
                 use_linear_projection: bool, upcast_attention: bool, p: Precision, has_attention: bool = True):
        ch = in_channels
        self.resnets = nnx.List([ResnetBlock2D(ch, ch, temb_channels, resnet_groups, resnet_eps, p)
                                 for _ in range(2 if has_attention else 1)])
        self.attentions = _transformers(ch, transformer_layers_per_block, 1, num_attention_heads, cross_attention_dim,
                                        resnet_groups, use_linear_projection, upcast_attention,
                                        p) if has_attention else None

    def __call__(self, x, temb, context):
        x = self.resnets[0](x, temb)
        if self.attentions is None:
            return x
        return self.resnets[1](self.attentions[0](x, context), temb)
