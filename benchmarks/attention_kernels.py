"""Attention kernels under trial for SDXL's self-attention on a TPU (issue 50), beside the
generator's splash kernel in `tpu_quick.py attention`; none is used by the generator until it wins
there and in a whole UNet evaluation.

Why these: on a v5e (2026-12-05 profiles) the UNet's self-attention costs about 4 ps a logit at both
levels (5.9 G logits an evaluation, some 24 ms of ~113), with head dim 64. At that width a logit's two
matmuls are 256 MXU flops against five or so vector operations for the softmax (max, subtract, exp,
sum, cast), so the vector unit, not the MXU, is the likely bound. Each variant here removes some of
that per-logit vector work:

- `one_pass`: every key of a head in one tile (4096 keys x 64 is 512 kB in bfloat16), so the softmax
  is computed once, without flash attention's running maximum and the rescaling of what was summed;
  `exp2` with log2(e) folded into the queries' scale (one multiply a logit fewer, if the chip's exp
  is an exp2 behind a multiply).
- `flash`: jax's older Pallas flash-attention kernel (`pallas.ops.tpu.flash_attention`), another
  tiling of the same online softmax, as splash's baseline.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _heads_major(t: jax.Array) -> jax.Array:  # (B, L, H, D) <-> (B, H, L, D)
    return jnp.swapaxes(t, 1, 2)


def one_pass(q: jax.Array, k: jax.Array, v: jax.Array, *, block_q: int = 512, base2: bool = True,
             interpret: bool = False) -> jax.Array:
    """Softmax attention of (B, L, H, D) queries over all of (B, S, H, D) keys, a grid step per
    (batch, head, `block_q` queries) holding that head's keys and values whole (S x D each; S up to a
    few thousand fits the chip's vector memory). `base2`: exp2 with log2(e) in the queries' scale,
    else exp. `interpret`: Pallas's interpreter (a CPU check)."""
    batch, length, heads, dim = q.shape
    keys = k.shape[1]
    block_q = min(block_q, length)
    if length % block_q:
        raise ValueError(f"{length} queries do not divide into blocks of {block_q}")
    scale = (math.log2(math.e) if base2 else 1.0) / math.sqrt(dim)
    exp = jnp.exp2 if base2 else jnp.exp

    def kernel(q_ref, k_ref, v_ref, o_ref):
        logits = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32)  # (block_q, S)
        weights = exp(logits - logits.max(axis=-1, keepdims=True))
        total = weights.sum(axis=-1, keepdims=True)
        out = jnp.dot(weights.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)
        o_ref[...] = (out / total).astype(o_ref.dtype)  # (the division: block_q x D, not a logit each)

    queries = pl.BlockSpec((None, None, block_q, dim), lambda b, h, i: (b, h, i, 0))
    whole = pl.BlockSpec((None, None, keys, dim), lambda b, h, i: (b, h, 0, 0))
    out = pl.pallas_call(kernel, grid=(batch, heads, length // block_q), in_specs=[queries, whole, whole],
                         out_specs=queries, out_shape=jax.ShapeDtypeStruct((batch, heads, length, dim), q.dtype),
                         interpret=interpret)(
        _heads_major(q * jnp.asarray(scale, q.dtype)), _heads_major(k), _heads_major(v))
    return _heads_major(out)


def flash(q: jax.Array, k: jax.Array, v: jax.Array, *, block_q: int = 1024, block_kv: int = 1024) -> jax.Array:
    """jax's Pallas flash-attention kernel for the TPU on (B, L, H, D) inputs, tiles of `block_q`
    queries by `block_kv` keys (each at most the length)."""
    from jax.experimental.pallas.ops.tpu.flash_attention import BlockSizes, flash_attention

    block_q, block_kv = min(block_q, q.shape[1]), min(block_kv, k.shape[1])
    sizes = BlockSizes(block_q=block_q, block_k_major=block_kv, block_k=block_kv, block_b=1)
    out = flash_attention(_heads_major(q), _heads_major(k), _heads_major(v), sm_scale=1.0 / math.sqrt(q.shape[-1]),
                          block_sizes=sizes)
    return _heads_major(out)


def variants() -> dict:
    """Name -> (q, k, v) -> attention, for `tpu_quick.py attention`."""
    found = {f"one pass, exp2, q{b}": partial(one_pass, block_q=b) for b in (256, 512)}
    found["one pass, exp, q512"] = partial(one_pass, block_q=512, base2=False)
    found.update({f"pallas flash q{bq} kv{bkv}": partial(flash, block_q=bq, block_kv=bkv)
                  for bq, bkv in ((512, 1024), (1024, 1024), (1024, 2048))})
    return found
