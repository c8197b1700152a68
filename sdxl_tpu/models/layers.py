"""Layers shared by the text encoders, the UNet and the VAE.

Everything is channels-last (NHWC). Parameter names follow flax (`kernel`, `scale`,
`embedding`, `bias`); `weights/tensors.py` maps them onto the PyTorch names mechanically.
Attention goes through `attention.attention()` only: kernels are chosen and swapped there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx
from jax.typing import DTypeLike

from .attention import attention, check_kernel


@dataclass(frozen=True)
class Precision:
    """How one model computes: parameter and activation dtypes, and the attention kernel
    ("auto": the best per platform, "xla": XLA's everywhere; see attention.py)."""

    param_dtype: DTypeLike = jnp.float32
    dtype: DTypeLike = jnp.float32
    attention: str = "auto"

    def __post_init__(self):
        check_kernel(self.attention)

    @staticmethod
    def of(dtype: str | jnp.dtype = "float32", param_dtype: str | jnp.dtype | None = None,
           attention: str = "auto") -> "Precision":
        return Precision(param_dtype=_as_dtype(param_dtype or dtype), dtype=_as_dtype(dtype), attention=attention)


_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _as_dtype(dtype: str | DTypeLike) -> DTypeLike:
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(_DTYPES)}")
        return _DTYPES[dtype]
    return jnp.dtype(dtype).type


# Linear, Conv and Embed are our own rather than nnx's: their parameters start at zero instead
# of drawing from an RNG. Weights always come from a checkpoint (or bench/tiny's own random
# fill), and nnx's per-layer key bookkeeping made building SDXL's UNet abstractly take about a
# minute (each key update looked back over everything traced so far).

class Linear(nnx.Module):
    """torch.nn.Linear with a (in, out) kernel, computed in the activation dtype."""

    def __init__(self, in_features: int, out_features: int, p: Precision, *, bias: bool = True):
        self.dtype = p.dtype
        self.kernel = nnx.Param(jnp.zeros((in_features, out_features), p.param_dtype))
        self.bias = nnx.Param(jnp.zeros((out_features,), p.param_dtype)) if bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        y = jax.lax.dot_general(x, self.kernel[...].astype(self.dtype), (((x.ndim - 1,), (0,)), ((), ())))
        return y if self.bias is None else y + self.bias[...].astype(self.dtype)


class Conv(nnx.Module):
    """torch.nn.Conv2d on NHWC input with an HWIO kernel and explicit (low, high) padding."""

    def __init__(self, in_ch: int, out_ch: int, p: Precision, *, kernel: int = 3, stride: int = 1,
                 padding: int | tuple[tuple[int, int], tuple[int, int]] = 1):
        if isinstance(padding, int):
            padding = ((padding, padding), (padding, padding))
        self.dtype, self.stride, self.padding = p.dtype, stride, padding
        self.kernel = nnx.Param(jnp.zeros((kernel, kernel, in_ch, out_ch), p.param_dtype))
        self.bias = nnx.Param(jnp.zeros((out_ch,), p.param_dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jax.lax.conv_general_dilated(x.astype(self.dtype), self.kernel[...].astype(self.dtype),
                                         (self.stride, self.stride), self.padding,
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y + self.bias[...].astype(self.dtype)


class Embed(nnx.Module):
    """torch.nn.Embedding: rows of `embedding` looked up by integer ids."""

    def __init__(self, num_embeddings: int, features: int, p: Precision):
        self.dtype = p.dtype
        self.embedding = nnx.Param(jnp.zeros((num_embeddings, features), p.param_dtype))

    def __call__(self, ids: jax.Array) -> jax.Array:
        return jnp.take(self.embedding[...].astype(self.dtype), ids, axis=0)


class GroupNorm(nnx.Module):
    """torch.nn.GroupNorm on channels-last input; statistics in float32, two-pass as torch's.

    (Statistics summed per channel and pooled into groups, without the grouped reshape, measured
    the same on a TPU v5e, 2026-12-06: the float32 relayouts at the 128x128 level are the
    convolutions' layout, not the norm's.)"""

    def __init__(self, num_groups: int, num_channels: int, eps: float, p: Precision):
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: {num_channels} channels do not split into {num_groups} groups")
        self.num_groups, self.eps, self.dtype = num_groups, eps, p.dtype
        self.scale = nnx.Param(jnp.ones((num_channels,), p.param_dtype))
        self.bias = nnx.Param(jnp.zeros((num_channels,), p.param_dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        shape = x.shape
        xg = x.astype(jnp.float32).reshape(shape[0], -1, self.num_groups, shape[-1] // self.num_groups)
        mean = xg.mean(axis=(1, 3), keepdims=True)
        var = jnp.square(xg - mean).mean(axis=(1, 3), keepdims=True)
        xg = (xg - mean) * jax.lax.rsqrt(var + self.eps)
        y = xg.reshape(shape) * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y.astype(self.dtype)


class LayerNorm(nnx.Module):
    """torch.nn.LayerNorm over the last axis; statistics in float32."""

    def __init__(self, dim: int, eps: float, p: Precision):
        self.eps, self.dtype = eps, p.dtype
        self.scale = nnx.Param(jnp.ones((dim,), p.param_dtype))
        self.bias = nnx.Param(jnp.zeros((dim,), p.param_dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = x32.mean(axis=-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(axis=-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        y = y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y.astype(self.dtype)


# erf(x) = 1 - t (a1 + a2 t + ... + a5 t^4) exp(-x^2), t = 1 / (1 + p x), x >= 0: Abramowitz & Stegun 7.1.26
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def gelu(x: jax.Array) -> jax.Array:
    """The exact (erf) GELU, as torch's F.gelu, computed in float32 and returned in x's dtype.

    erf is Abramowitz & Stegun's 7.1.26 (|error| <= 1.5e-7): over [-12, 12] this GELU is within
    6.4e-7 of float64's, as jax.nn.gelu's own erf is (6.1e-7). XLA lowers erf to some 65 vector
    operations an element; fused into the UNet's feed-forward gate projection on a TPU v5e they made
    that matmul run at 110 TFLOP/s against its twin's 175 (2026-12-06). This form is one division,
    one exp and about 15 multiply-adds, and the tail Phi(-|x|) is computed directly, not as 1 - erf."""
    x32 = x.astype(jnp.float32)
    z = jnp.abs(x32) * (1 / math.sqrt(2))
    t = 1 / (1 + _ERF_P * z)
    a1, a2, a3, a4, a5 = _ERF_A
    below = 0.5 * t * (a1 + t * (a2 + t * (a3 + t * (a4 + t * a5)))) * jnp.exp(-z * z)  # Phi(-|x|)
    return (x32 * jnp.where(x32 >= 0, 1 - below, below)).astype(x.dtype)


ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu": gelu,
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
}


def timestep_embedding(t: jax.Array, dim: int, *, flip_sin_to_cos: bool, freq_shift: float,
                       max_period: float = 10000.0) -> jax.Array:
    """Sinusoidal embedding of (fractional) timesteps, as diffusers' get_timestep_embedding."""
    half = dim // 2
    exponent = -math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / (half - freq_shift)
    args = t.astype(jnp.float32)[:, None] * jnp.exp(exponent)[None, :]
    sin, cos = jnp.sin(args), jnp.cos(args)
    emb = jnp.concatenate([cos, sin] if flip_sin_to_cos else [sin, cos], axis=-1)
    if dim % 2:
        emb = jnp.pad(emb, ((0, 0), (0, 1)))
    return emb


class TimestepEmbedding(nnx.Module):
    """diffusers TimestepEmbedding: linear_1 -> act -> linear_2."""

    def __init__(self, in_dim: int, dim: int, p: Precision, act: str = "silu"):
        self.linear_1 = Linear(in_dim, dim, p)
        self.linear_2 = Linear(dim, dim, p)
        self.act = ACTIVATIONS[act]

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear_2(self.act(self.linear_1(x)))


class ResnetBlock2D(nnx.Module):
    """diffusers ResnetBlock2D (time_scale_shift 'default', output scale 1)."""

    def __init__(self, in_ch: int, out_ch: int, temb_ch: int | None, groups: int, eps: float, p: Precision):
        self.norm1 = GroupNorm(groups, in_ch, eps, p)
        self.conv1 = Conv(in_ch, out_ch, p)
        self.time_emb_proj = Linear(temb_ch, out_ch, p) if temb_ch else None
        self.norm2 = GroupNorm(groups, out_ch, eps, p)
        self.conv2 = Conv(out_ch, out_ch, p)
        self.conv_shortcut = Conv(in_ch, out_ch, p, kernel=1, padding=0) if in_ch != out_ch else None

    def __call__(self, x: jax.Array, temb: jax.Array | None = None) -> jax.Array:
        h = self.conv1(jax.nn.silu(self.norm1(x)))
        if self.time_emb_proj is not None:
            if temb is None:
                raise ValueError("this ResnetBlock2D projects a time embedding: give it one (temb)")
            h = h + self.time_emb_proj(jax.nn.silu(temb))[:, None, None, :]
        h = self.conv2(jax.nn.silu(self.norm2(h)))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return x + h


class Downsample2D(nnx.Module):
    """Strided 3x3 conv. `padding=0` is the VAE encoder's asymmetric (0, 1) padding."""

    def __init__(self, ch: int, p: Precision, padding: int = 1):
        pad = ((0, 1), (0, 1)) if padding == 0 else padding
        self.conv = Conv(ch, ch, p, stride=2, padding=pad)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv(x)


def upsample_nearest(x: jax.Array, size: tuple[int, int] | None = None) -> jax.Array:
    """Nearest-neighbour upsampling as torch's F.interpolate(mode='nearest')."""
    h, w = x.shape[1:3]
    if size is None or size == (2 * h, 2 * w):
        return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
    rows = (jnp.arange(size[0]) * h) // size[0]
    cols = (jnp.arange(size[1]) * w) // size[1]
    return x[:, rows][:, :, cols]


class Upsample2D(nnx.Module):
    def __init__(self, ch: int, p: Precision):
        self.conv = Conv(ch, ch, p)

    def __call__(self, x: jax.Array, size: tuple[int, int] | None = None) -> jax.Array:
        return self.conv(upsample_nearest(x, size))


class Attention(nnx.Module):
    """diffusers Attention: to_q / to_k / to_v / to_out.0, optional group_norm and residual (VAE)."""

    def __init__(self, query_dim: int, heads: int, head_dim: int, p: Precision, *,
                 context_dim: int | None = None, qkv_bias: bool = False,
                 group_norm: tuple[int, float] | None = None, residual: bool = False,
                 upcast: bool = False):
        inner = heads * head_dim
        self.heads, self.head_dim, self.residual, self.upcast = heads, head_dim, residual, upcast
        self.attention_kernel = p.attention
        self.group_norm = GroupNorm(group_norm[0], query_dim, group_norm[1], p) if group_norm else None
        self.to_q = Linear(query_dim, inner, p, bias=qkv_bias)
        self.to_k = Linear(context_dim or query_dim, inner, p, bias=qkv_bias)
        self.to_v = Linear(context_dim or query_dim, inner, p, bias=qkv_bias)
        self.to_out = nnx.List([Linear(inner, query_dim, p)])

    def _heads(self, t: jax.Array) -> jax.Array:
        return t.reshape(t.shape[0], t.shape[1], self.heads, self.head_dim)

    def project_context(self, context: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The keys and values (B, L', H, D) of `context` (B, L', D)."""
        return self._heads(self.to_k(context)), self._heads(self.to_v(context))

    def __call__(self, x: jax.Array, context: jax.Array | None = None,
                 context_lengths: jax.Array | None = None, context_block: int | None = None,
                 kv: tuple[jax.Array, jax.Array] | None = None,
                 image_kv: tuple[jax.Array, jax.Array, jax.Array] | None = None) -> jax.Array:
        """x: (B, L, C) tokens, or (B, H, W, C) when the block owns a group norm (VAE); context
        (B, L', D) to attend to (default x), or its keys and values `kv` projected beforehand
        (project_context), of which the first `context_lengths` (B,) count, in whole blocks of
        `context_block` (see attention()). `image_kv`: an IP-Adapter's keys and values (B, T, H, D)
        and scale (B,): the same queries attend to them too, unmasked, and the result, times the
        scale, joins the text's before to_out, as diffusers' IPAdapterAttnProcessor2_0 adds it."""
        spatial_shape = x.shape if x.ndim == 4 else None
        h = self.group_norm(x) if self.group_norm is not None else x
        if spatial_shape is not None:
            h = h.reshape(x.shape[0], -1, x.shape[-1])
        q = self._heads(self.to_q(h))
        k, v = kv if kv is not None else self.project_context(h if context is None else context)
        out = self._attend(q, k, v, context_lengths, context_block)
        if image_kv is not None:
            k_image, v_image, scale = image_kv
            out = out + scale.astype(out.dtype)[:, None, None, None] * self._attend(q, k_image, v_image, None, None)
        out = self.to_out[0](out.reshape(out.shape[0], out.shape[1], -1))
        if spatial_shape is not None:
            out = out.reshape(spatial_shape)
        return x + out if self.residual else out

    def _attend(self, q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array | None,
                block: int | None) -> jax.Array:
        if not self.upcast:
            return attention(q, k, v, kernel=self.attention_kernel, kv_lengths=lengths, kv_block=block)
        return attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                         kernel=self.attention_kernel, kv_lengths=lengths, kv_block=block).astype(q.dtype)
