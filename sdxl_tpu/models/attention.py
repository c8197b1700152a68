"""Attention: the one function that computes it, with the best kernel per platform.

The compiler picks the branch (`jax.lax.platform_dependent`), not Python at trace time, so a
traced program is right wherever it is compiled:
- TPU: Pallas splash attention for long self-attention with heads of up to 128 (SDXL's 64x64 and
  32x32 UNet levels), which never materialises the length x length logits;
- NVIDIA GPU: cuDNN's fused flash attention where cuDNN supports the shape (bf16/fp16, head
  dim <= 128, so not the VAE's single 512-wide head);
- everything else: XLA's attention (`jax.nn.dot_product_attention`), also the fallback of both.

The kernel is a model setting (`Precision.attention`, `load_pipeline(attention=...)`): "xla"
forces XLA's attention everywhere, the "before" of a benchmark and a way out should a kernel
misbehave on some machine. Entry points (app, CLI, bench) default it to $SDXL_TPU_ATTENTION.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import cast

import jax
import jax.numpy as jnp

# Splash pays off on long self-attention (SDXL at 1024x1024: 1024 and 4096 tokens in the UNet, 16384
# in the VAE). Measured on one TPU v5e (2026-12-05, ms a call, bf16): 1024 tokens x 20 heads splash
# 0.203, XLA's attention 0.492; as einsums with bfloat16 logits 0.14, yet the whole UNet evaluation
# 135.0 ms against splash's 132.9 (so not used). From 960: the other SDXL sizes' 32x-level (960 to
# 1008 tokens), padded to 1024.
SPLASH_MIN_LENGTH = 960
# The VAE's mid block (16384 tokens, one float32 head of 512) goes to XLA's attention: on one v5e
# (2026-12-05) splash's kernel for it took 75 s of the decoder's cold compile (100.5 s, against 24.9 s
# with XLA's), which a new replica's first image waits for, to save 1.6 ms a decoded image (4.55 ->
# 2.94 ms; 0.06 % of an image's 2.6 s); XLA's float32 logits, 1 GiB an image, fit beside the UNet.
SPLASH_MAX_HEAD_DIM = 128
_LANES = 128  # TPU vector lane width: splash wants sequence blocks and head dims in multiples of it


KERNELS = ("auto", "xla")


def check_kernel(kernel: str) -> str:
    if kernel not in KERNELS:
        raise ValueError(f"attention kernel {kernel!r}: use 'auto' (best kernel per platform) or 'xla'")
    return kernel


def default_kernel() -> str:
    """The entry points' default: SDXL_TPU_ATTENTION, else "auto"."""
    choice = os.environ.get("SDXL_TPU_ATTENTION", "auto")
    if choice not in KERNELS:
        raise ValueError(f"SDXL_TPU_ATTENTION={choice!r}: use 'auto' (best kernel per platform) or 'xla'")
    return choice


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, is_causal: bool = False, kernel: str = "auto",
              kv_lengths: jax.Array | None = None, kv_block: int | None = None) -> jax.Array:
    """Scaled dot-product attention on (batch, length, heads, head_dim) arrays.

    kv_lengths (batch,): how many keys of each row count (the rest is padding, masked out).
    kv_block: the keys come in blocks of this many (a prompt's chunks) and rows use whole blocks;
    only as many blocks as the longest row uses are computed, by a switch with one branch per
    count in the compiled program. A call whose rows all use one block computes exactly what
    unpadded keys would give (no mask: masking changes XLA's reductions in the last bit).
    """
    check_kernel(kernel)
    if kv_lengths is None or kv_block is None or k.shape[1] <= kv_block:
        return _attention(q, k, v, kv_lengths, is_causal, kernel)
    blocks = k.shape[1] // kv_block

    def using(n: int) -> Callable:
        return lambda q, k, v, lengths: _attention(q, k[:, :n * kv_block], v[:, :n * kv_block],
                                                   lengths if n > 1 else None, is_causal, kernel)

    used = jnp.clip(-(-jnp.max(kv_lengths) // kv_block), 1, blocks)
    return jax.lax.switch(used - 1, [using(n) for n in range(1, blocks + 1)], q, k, v, kv_lengths)


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, kv_lengths: jax.Array | None, is_causal: bool,
               kernel: str) -> jax.Array:
    if kernel == "xla":
        return xla_attention(q, k, v, kv_lengths, is_causal=is_causal)
    return _per_platform(q, k, v, kv_lengths, is_causal=is_causal)


# jit: the three branches are traced once per shape, not once per layer (SDXL's UNet has 140
# attention calls of a handful of shapes; tracing each anew added 2 s to every compile).
@functools.partial(jax.jit, static_argnames="is_causal")
def _per_platform(q: jax.Array, k: jax.Array, v: jax.Array, kv_lengths: jax.Array | None, *,
                  is_causal: bool) -> jax.Array:
    return jax.lax.platform_dependent(
        q, k, v, kv_lengths,
        tpu=functools.partial(tpu_attention, is_causal=is_causal),
        cuda=functools.partial(gpu_attention, is_causal=is_causal),
        default=functools.partial(xla_attention, is_causal=is_causal),
    )


def xla_attention(q: jax.Array, k: jax.Array, v: jax.Array, kv_lengths: jax.Array | None = None, *,
                  is_causal: bool = False) -> jax.Array:
    return jax.nn.dot_product_attention(q, k, v, is_causal=is_causal, key_value_seq_lengths=kv_lengths,
                                        implementation="xla")


def gpu_attention(q: jax.Array, k: jax.Array, v: jax.Array, kv_lengths: jax.Array | None = None, *,
                  is_causal: bool = False) -> jax.Array:
    head_dim = q.shape[-1]
    if q.dtype in (jnp.bfloat16, jnp.float16) and head_dim <= 128 and head_dim % 8 == 0:
        try:
            return jax.nn.dot_product_attention(q, k, v, is_causal=is_causal, key_value_seq_lengths=kv_lengths,
                                                implementation="cudnn")
        except (RuntimeError, NotImplementedError, ValueError):
            # No cuDNN where this is traced (every branch is traced, also on a CPU-only
            # machine), or a shape cuDNN refuses: XLA computes the same thing.
            pass
    return xla_attention(q, k, v, kv_lengths, is_causal=is_causal)


def tpu_attention(q: jax.Array, k: jax.Array, v: jax.Array, kv_lengths: jax.Array | None = None, *,
                  is_causal: bool = False, interpret: bool = False) -> jax.Array:
    if (is_causal or kv_lengths is not None or q.shape[1] != k.shape[1] or q.shape[1] < SPLASH_MIN_LENGTH
            or q.shape[-1] > SPLASH_MAX_HEAD_DIM):
        return xla_attention(q, k, v, kv_lengths, is_causal=is_causal)
    return splash_attention(q, k, v, interpret=interpret)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def splash_length(length: int) -> int:
    """The length splash runs a sequence at: a multiple of 128, and past 1024 a multiple of 1024,
    so that the tuned tiles (SPLASH_BLOCKS) divide it: SDXL's 64x-level at its other sizes (3840 to
    4032 tokens) runs at 4096 with 1024 x 2048 tiles, not at 3968 = 31 x 128 with 128 x 128 ones,
    for at most 7 % more tokens."""
    return round_up(length, 1024 if length > 1024 else _LANES)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, interpret: bool = False,
                     block_q: int | None = None, block_kv: int | None = None, pad_to: int | None = None) -> jax.Array:
    """Non-causal self-attention with the Pallas splash kernel (TPU; `interpret=True` runs it anywhere).

    Lengths are zero-padded as splash_length says and head dims to multiples of 128 (the kernel
    pads a 64-wide head to 128 itself: measured no faster unpadded); padded keys are masked out
    with segment ids, and the softmax scale is applied to q up front (the kernel applies none).
    block_q / block_kv: the kernel's tiles (default: SPLASH_BLOCKS of the padded length);
    pad_to: pad the length to a multiple of this instead (benchmarks).
    """
    batch, length, heads, head_dim = q.shape
    padded_len, padded_dim = round_up(length, pad_to) if pad_to else splash_length(length), round_up(head_dim, _LANES)
    scale = 1.0 / math.sqrt(head_dim)

    def to_kernel_layout(t: jax.Array) -> jax.Array:  # (B, L, H, D) -> (B, H, Lp, Dp)
        t = t.transpose(0, 2, 1, 3)
        return jnp.pad(t, ((0, 0), (0, 0), (0, padded_len - length), (0, padded_dim - head_dim)))

    segment_ids = None
    if padded_len != length:
        from jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel import SegmentIds

        ids = (jnp.arange(padded_len) >= length).astype(jnp.int32)  # 0 = real token, 1 = padding
        segment_ids = SegmentIds(q=ids, kv=ids)
    if padded_dim * q.dtype.itemsize > 1024 and not (block_q or block_kv):
        # float32 with a 512-wide head (the VAE's, upcast): the tuned tiles' buffers (25 MB) overflow
        # the kernel's 16 MiB of VMEM on a v5e; a quarter of them fits.
        tuned_q, tuned_kv = SPLASH_BLOCKS(padded_len)
        block_q, block_kv = min(tuned_q, 512), min(tuned_kv, 1024)
    kernel = _splash_kernel(heads, padded_len, interpret, block_q, block_kv)
    qs = to_kernel_layout((q.astype(jnp.float32) * scale).astype(q.dtype))
    out = cast(jax.Array, jax.vmap(lambda a, b, c: kernel(a, b, c, segment_ids=segment_ids))(
        qs, to_kernel_layout(k), to_kernel_layout(v)))  # (one array: no residuals asked)
    return out[:, :, :length, :head_dim].transpose(0, 2, 1, 3)


def _default_splash_blocks(length: int) -> tuple[int, int]:
    """The splash kernel's (block_q, block_kv) for a padded length: the largest tiles up to 1024
    queries and 2048 keys that divide it. Measured on one TPU v5e (2026-12-05, benchmarks/tpu_quick.py
    attention, ms a call against 512 x 512): SDXL's 4096-token level 1.19 against 1.45, its
    1024-token level 0.203 against 0.218, the VAE's 16384 tokens of one 512-wide head 2.94 against
    3.17; 2048 queries ran out of the kernel's VMEM with a 512-wide head."""
    fits = lambda limit: next(b for b in (2048, 1024, 512, 256, _LANES) if b <= limit and length % b == 0)
    return fits(1024), fits(2048)


# Replaceable for tuning (benchmarks/tpu_quick.py --splash-blocks), before the first trace: kernels
# are made once per shape and keep their tiles.
SPLASH_BLOCKS = _default_splash_blocks


@functools.lru_cache(maxsize=None)
def _splash_kernel(heads: int, length: int, interpret: bool, block_q: int | None = None,
                   block_kv: int | None = None):
    # Imported here: Pallas' TPU ops are only needed where this branch is traced.
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    tuned_q, tuned_kv = SPLASH_BLOCKS(length)
    block_q, block_kv = min(block_q or tuned_q, length), min(block_kv or tuned_kv, length)
    mask = masks.MultiHeadMask([masks.FullMask((length, length)) for _ in range(heads)])
    sizes = splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=min(block_kv, 512))
    # Built while some program is being traced, yet cached for all: its mask tables must be
    # concrete arrays, not tracers of that first program (they leaked into the next one).
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)
