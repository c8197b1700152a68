"""IP-Adapter for SDXL: an image as a prompt, as diffusers runs it after load_ip_adapter.

The image encoder's features (clip_vision.py) become a few tokens of the text's width: the plain
adapter projects the projected class token (diffusers' ImageProjection), the "plus" one resamples the
penultimate hidden states with a small perceiver (IPAdapterPlusImageProjection). Every cross-attention
of the UNet then also attends to those tokens through its own `to_k_ip` / `to_v_ip` and adds the
result, scaled (unet_blocks.ImagePrompt). Module names follow diffusers' converted names, so
weights/ip_adapter.py maps the published files onto them as diffusers' loader does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from .attention import attention
from .layers import LayerNorm, Linear, Precision, gelu
from .unet_blocks import ImagePrompt

RESAMPLER_HEAD_DIM = 64  # the published resamplers' (diffusers reads the head count off to_q as width // 64)


@dataclass(frozen=True)
class IPAdapterConfig:
    """`blocks`: each UNet cross-attention's (heads, head_dim), in UNet2DConditionModel.transformer_blocks()
    order (unet_attention_shapes). `image_embed_dim`: the image encoder's projection_dim (plain) or
    hidden_size (plus). The resampler's sizes are the plus adapter's alone."""
    plus: bool
    image_embed_dim: int
    cross_attention_dim: int
    num_tokens: int
    blocks: tuple[tuple[int, int], ...]
    hidden_dims: int = 0
    depth: int = 0
    heads: int = 0
    ff_inner: int = 0
    head_dim: int = RESAMPLER_HEAD_DIM


def unet_attention_shapes(unet) -> tuple[tuple[int, int], ...]:
    """(heads, head_dim) of each cross-attention of `unet` (abstract or concrete), in its order."""
    return tuple((block.attn2.heads, block.attn2.head_dim) for block in unet.transformer_blocks())


class ImageProjection(nnx.Module):
    """diffusers ImageProjection: one linear to num_tokens x width, then a LayerNorm per token."""

    def __init__(self, c: IPAdapterConfig, p: Precision):
        self.num_tokens = c.num_tokens
        self.image_embeds = Linear(c.image_embed_dim, c.num_tokens * c.cross_attention_dim, p)
        self.norm = LayerNorm(c.cross_attention_dim, 1e-5, p)

    def __call__(self, embeds: jax.Array) -> jax.Array:
        return self.norm(self.image_embeds(embeds).reshape(embeds.shape[0], self.num_tokens, -1))


class PerceiverAttention(nnx.Module):
    """diffusers Attention as the resampler builds it: no biases, the latents query."""

    def __init__(self, dim: int, heads: int, head_dim: int, p: Precision):
        self.heads, self.head_dim, self.attention_kernel = heads, head_dim, p.attention
        self.to_q = Linear(dim, heads * head_dim, p, bias=False)
        self.to_k = Linear(dim, heads * head_dim, p, bias=False)
        self.to_v = Linear(dim, heads * head_dim, p, bias=False)
        self.to_out = nnx.List([Linear(heads * head_dim, dim, p, bias=False)])

    def __call__(self, x: jax.Array, context: jax.Array) -> jax.Array:
        split = lambda t: t.reshape(t.shape[0], t.shape[1], self.heads, self.head_dim)
        out = attention(split(self.to_q(x)), split(self.to_k(context)), split(self.to_v(context)),
                        kernel=self.attention_kernel)
        return self.to_out[0](out.reshape(out.shape[0], out.shape[1], -1))


class GELUProjection(nnx.Module):
    """diffusers GELU (a linear, then the exact GELU)."""

    def __init__(self, dim: int, inner: int, p: Precision):
        self.proj = Linear(dim, inner, p, bias=False)

    def __call__(self, x: jax.Array) -> jax.Array:
        return gelu(self.proj(x))


class ResamplerFeedForward(nnx.Module):
    def __init__(self, dim: int, inner: int, p: Precision):
        # diffusers' FeedForward net = [GELU, Dropout, Linear]: the indices kept so names map 1:1.
        self.net = nnx.Dict({"0": GELUProjection(dim, inner, p), "2": Linear(inner, dim, p, bias=False)})

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.net["2"](self.net["0"](x))


class ResamplerBlock(nnx.Module):
    """diffusers IPAdapterPlusImageProjectionBlock: the latents attend to the image's tokens and
    to themselves, then a feed-forward, each with its residual."""

    def __init__(self, c: IPAdapterConfig, p: Precision):
        d = c.hidden_dims
        self.ln0, self.ln1 = LayerNorm(d, 1e-5, p), LayerNorm(d, 1e-5, p)
        self.attn = PerceiverAttention(d, c.heads, c.head_dim, p)
        self.ff = nnx.Dict({"0": LayerNorm(d, 1e-5, p), "1": ResamplerFeedForward(d, c.ff_inner, p)})

    def __call__(self, x: jax.Array, latents: jax.Array) -> jax.Array:
        normed = self.ln1(latents)
        latents = self.attn(normed, jnp.concatenate([self.ln0(x), normed], axis=1)) + latents
        return self.ff["1"](self.ff["0"](latents)) + latents


class Resampler(nnx.Module):
    """diffusers IPAdapterPlusImageProjection: learnt latents, refined by `depth` blocks against the
    image's hidden states, become the image tokens."""

    def __init__(self, c: IPAdapterConfig, p: Precision):
        self.latents = nnx.Param(jnp.zeros((1, c.num_tokens, c.hidden_dims), p.param_dtype))
        self.proj_in = Linear(c.image_embed_dim, c.hidden_dims, p)
        self.proj_out = Linear(c.hidden_dims, c.cross_attention_dim, p)
        self.norm_out = LayerNorm(c.cross_attention_dim, 1e-5, p)
        self.layers = nnx.List([ResamplerBlock(c, p) for _ in range(c.depth)])

    def __call__(self, hidden: jax.Array) -> jax.Array:
        x = self.proj_in(hidden)
        latents = jnp.broadcast_to(self.latents[...].astype(x.dtype), (x.shape[0], *self.latents.shape[1:]))
        for block in self.layers:
            latents = block(x, latents)
        return self.norm_out(self.proj_out(latents))


class IPAdapter(nnx.Module):
    """An IP-Adapter: the image projection (`image_proj`) and each cross-attention's `to_k_ip` and
    `to_v_ip`, by UNet2DConditionModel.transformer_blocks() index."""

    def __init__(self, config: IPAdapterConfig, precision: Precision = Precision()):
        c, p = config, precision
        self.config = c
        self.image_proj = Resampler(c, p) if c.plus else ImageProjection(c, p)
        self.to_k_ip = nnx.List([Linear(c.cross_attention_dim, h * d, p, bias=False) for h, d in c.blocks])
        self.to_v_ip = nnx.List([Linear(c.cross_attention_dim, h * d, p, bias=False) for h, d in c.blocks])

    def tokens(self, features: jax.Array) -> jax.Array:
        """The image encoder's features -> image tokens (B, N * T, D). Plain: image_embeds (B, E);
        plus: penultimate hidden states (B, S, E); either with N images a row on axis 1 (B, N, ...),
        whose tokens the cross-attentions see side by side, as diffusers' do."""
        one_image = 3 if self.config.plus else 2
        if features.ndim == one_image:
            features = features[:, None]
        b, n = features.shape[:2]
        tokens = self.image_proj(features.reshape(b * n, *features.shape[2:]))
        return tokens.reshape(b, n * tokens.shape[1], tokens.shape[2])

    def block_kv(self, tokens: jax.Array) -> tuple[tuple[jax.Array, jax.Array], ...]:
        """Each cross-attention's keys and values (B, T, H, D) of the image tokens (B, T, D): they
        depend on the image alone, so a call projects them once for all its steps (as UNet.cross_kv)."""
        b, t = tokens.shape[:2]
        return tuple((k(tokens).reshape(b, t, h, d), v(tokens).reshape(b, t, h, d))
                     for (h, d), k, v in zip(self.config.blocks, self.to_k_ip, self.to_v_ip, strict=True))

    def __call__(self, features: jax.Array, scale: jax.Array | float | Sequence[float]) -> ImagePrompt:
        """The UNet's `image_prompt` for `features` (see tokens) at `scale`, one per row (B,) or one
        for all (0: as if there were no adapter)."""
        kv = self.block_kv(self.tokens(features))
        rows = features.shape[0]
        return ImagePrompt(kv, jnp.broadcast_to(jnp.asarray(scale, jnp.float32), (rows,)))
