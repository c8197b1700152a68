"""The per-platform attention kernels against XLA's attention.

Splash attention is a TPU (Mosaic) kernel; here it runs in Pallas interpret mode on the CPU,
which executes the same kernel code, block by block, with ordinary JAX operations.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdxl_tpu.models import attention as attn


def _qkv(batch, length, heads, head_dim, dtype=jnp.float32, kv_length=None):
    keys = jax.random.split(jax.random.PRNGKey(length * heads + head_dim), 3)
    q = jax.random.normal(keys[0], (batch, length, heads, head_dim), dtype)
    k = jax.random.normal(keys[1], (batch, kv_length or length, heads, head_dim), dtype)
    v = jax.random.normal(keys[2], (batch, kv_length or length, heads, head_dim), dtype)
    return q, k, v


def _reference(q, k, v, is_causal=False):
    """Plain softmax(q k^T / sqrt(d)) v in float64 numpy."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if is_causal:
        logits = np.where(np.tril(np.ones(logits.shape[-2:], bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


@pytest.mark.parametrize("shape", [
    (2, 300, 2, 64),   # length padded to 384, masked with segment ids; head dim padded to 128
    (1, 256, 1, 512),  # the VAE's single 512-wide head
    (1, 512, 2, 128),  # no padding at all, one 512 block
])
def test_splash_attention_matches_reference_in_interpret_mode(shape):
    q, k, v = _qkv(*shape)
    out = jax.jit(lambda q, k, v: attn.splash_attention(q, k, v, interpret=True))(q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype
    np.testing.assert_allclose(np.asarray(out), _reference(q, k, v), atol=2e-5, rtol=1e-4)


def test_splash_attention_in_bfloat16():
    q, k, v = _qkv(2, 384, 3, 40, jnp.bfloat16)
    out = jax.jit(lambda q, k, v: attn.splash_attention(q, k, v, interpret=True))(q, k, v)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), _reference(q, k, v), atol=2e-2)


def _primitives(fn, *args) -> set[str]:
    names = set()

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            names.add(eqn.primitive.name)
            for value in eqn.params.values():
                for sub in value if isinstance(value, (list, tuple)) else [value]:
                    if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                        walk(sub.jaxpr)
                    elif hasattr(sub, "eqns"):
                        walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return names


@pytest.mark.parametrize("case, expect_splash", [
    (dict(length=1024), True),                     # long self-attention: splash
    (dict(length=960), True),                      # (1536x640's 32x-level: padded to 1024)
    (dict(length=512), False),                     # short: XLA
    (dict(length=1024, kv_length=77), False),      # cross-attention to the text: XLA
    (dict(length=1024, is_causal=True), False),    # causal (text encoders): XLA
    (dict(length=1024, head_dim=512), False),      # a head wider than 128 (the VAE's mid block): XLA
])
def test_tpu_branch_uses_splash_only_for_long_self_attention(case, expect_splash):
    q, k, v = _qkv(1, case["length"], 2, case.get("head_dim", 64), kv_length=case.get("kv_length"))
    fn = lambda q, k, v: attn.tpu_attention(q, k, v, is_causal=case.get("is_causal", False), interpret=True)
    assert ("pallas_call" in _primitives(fn, q, k, v)) == expect_splash


def test_compiler_picks_the_kernel_per_platform():
    q, k, v = _qkv(1, 2048, 2, 64, jnp.bfloat16)
    traced = jax.jit(attn.attention).trace(q, k, v)
    assert "tpu_custom_call" in traced.lower(lowering_platforms=("tpu",)).as_text()
    assert "tpu_custom_call" not in traced.lower(lowering_platforms=("cpu",)).as_text()
    # On this CPU the default branch runs: XLA's attention, exactly.
    np.testing.assert_array_equal(np.asarray(jax.jit(attn.attention)(q, k, v), np.float32),
                                  np.asarray(jax.jit(attn.xla_attention)(q, k, v), np.float32))
    # The escape hatch, a model setting: no per-platform branches at all.
    assert "platform_index" in _primitives(lambda q, k, v: attn.attention(q, k, v), q, k, v)
    assert "platform_index" not in _primitives(lambda q, k, v: attn.attention(q, k, v, kernel="xla"), q, k, v)


def test_attention_kernel_is_a_model_setting(tiny_checkpoint):
    """load_models(attention="xla") reaches every attention call of every network; the
    environment variable is only the entry points' default."""
    from sdxl_tpu import load_models
    from sdxl_tpu.generate.pipeline import Pipeline
    from sdxl_tpu.sampler.from_config import load_samplers

    for kernel, branches in (("auto", True), ("xla", False)):
        models = load_models(tiny_checkpoint, dtype="float32", attention=kernel)
        pipe = Pipeline(models, (None, None), load_samplers(tiny_checkpoint)[0], sizes=["256x256"])
        for program in ("encode", "denoise", "decode"):
            jaxpr = str(pipe.trace(program, "256x256").jaxpr)
            assert ("platform_index" in jaxpr) == branches, (kernel, program)


def test_gpu_branch_falls_back_to_xla_where_cudnn_cannot_run():
    # Traced on a machine without cuDNN (as every branch is, everywhere): XLA's attention.
    q, k, v = _qkv(1, 77, 2, 64, jnp.bfloat16)
    out = attn.gpu_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(np.asarray(out, np.float32), _reference(q, k, v, is_causal=True), atol=2e-2)
    q32, k32, v32 = _qkv(1, 64, 1, 512)  # float32 / 512-wide heads: cuDNN is not even tried
    np.testing.assert_allclose(np.asarray(attn.gpu_attention(q32, k32, v32)), _reference(q32, k32, v32),
                               atol=2e-5, rtol=1e-4)


def test_unknown_attention_setting_is_named(monkeypatch):
    from sdxl_tpu import Precision

    q, k, v = _qkv(1, 8, 1, 8)
    with pytest.raises(ValueError, match="attention kernel 'flash'"):
        attn.attention(q, k, v, kernel="flash")
    with pytest.raises(ValueError, match="attention kernel 'flash'"):
        Precision.of("float32", attention="flash")
    monkeypatch.setenv("SDXL_TPU_ATTENTION", "flash")
    with pytest.raises(ValueError, match="SDXL_TPU_ATTENTION='flash'"):
        attn.default_kernel()


def test_pipeline_programs_carry_splash_attention_when_compiled_for_tpu(tiny_checkpoint):
    """At 512x512 the tiny model's VAE attends over 64x64 = 4096 latent pixels: long enough for
    splash. Tracing it inside the pipeline's shard_map and lowering for a TPU must work here."""
    from sdxl_tpu import load_pipeline

    pipe = load_pipeline(tiny_checkpoint, dtype="bfloat16", sizes=["512x512"], warmup=False)
    traced = pipe.trace("decode", (512, 512))
    assert "tpu_custom_call" in traced.lower(lowering_platforms=("tpu",)).as_text()
    assert "tpu_custom_call" not in traced.lower(lowering_platforms=("cpu",)).as_text()


def test_vae_decode_through_the_tpu_branch_matches_xla(tiny_checkpoint, monkeypatch):
    """The real model's attention (the tiny VAE's mid block over 32x32 = 1024 latent pixels)
    computed by the TPU branch, splash in interpret mode, against XLA's attention."""
    from pathlib import Path

    from sdxl_tpu import Precision, load_vae
    from sdxl_tpu.models import layers

    vae = load_vae(Path(tiny_checkpoint) / "vae", Precision())
    latents = jax.random.normal(jax.random.PRNGKey(0), (1, 32, 32, 4))
    with_xla = np.asarray(vae.decode(latents))
    used = []

    def tpu_branch(q, k, v, *, is_causal=False, kernel="auto", kv_lengths=None, kv_block=None):
        used.append(q.shape[1])
        return attn.tpu_attention(q, k, v, kv_lengths, is_causal=is_causal, interpret=True)

    monkeypatch.setattr(layers, "attention", tpu_branch)
    with_splash = np.asarray(vae.decode(latents))
    assert used == [1024]
    np.testing.assert_allclose(with_splash, with_xla, atol=1e-4)


def test_splash_kernel_traces_into_several_programs():
    """A server traces several programs whose attention maps to the same splash kernel (e.g.
    1024x1024 and 1152x896 both pad to 4096 tokens): nothing built while tracing one may leak
    into the next."""
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:1]), ("batch",))
    q = jax.random.normal(jax.random.PRNGKey(0), (1, 3000, 1, 64), jnp.bfloat16)
    sharded = jax.shard_map(lambda q: attn.attention(q, q, q), mesh=mesh, in_specs=P("batch"),
                            out_specs=P("batch"), check_vma=False)
    assert "tpu_custom_call" in jax.jit(sharded).trace(q).lower(lowering_platforms=("tpu",)).as_text()
    q2 = jax.random.normal(jax.random.PRNGKey(1), (1, 2100, 1, 64), jnp.bfloat16)  # also padded to 3072
    assert "tpu_custom_call" in jax.jit(attn.attention).trace(q2, q2, q2).lower(lowering_platforms=("tpu",)).as_text()
    q32 = q.astype(jnp.float32)
    np.testing.assert_allclose(np.asarray(attn.attention(q32, q32, q32)), _reference(q32, q32, q32), atol=2e-5)


def test_splash_blocks_divide_the_length_within_the_tuned_tiles():
    """Tiles measured on a TPU v5e (attention.py): up to 1024 queries and 2048 keys, each dividing
    the padded length (a length of 31 x 128 falls back to 128)."""
    for length in range(128, 20000, 128):
        block_q, block_kv = attn.SPLASH_BLOCKS(length)
        assert length % block_q == 0 and length % block_kv == 0 and block_q <= 1024 and block_kv <= 2048
    assert attn.SPLASH_BLOCKS(4096) == (1024, 2048) and attn.SPLASH_BLOCKS(16384) == (1024, 2048)
    assert attn.SPLASH_BLOCKS(1024) == (1024, 1024) and attn.SPLASH_BLOCKS(3968) == (128, 128)


def test_every_sdxl_size_runs_splash_at_4096_tokens_with_the_tuned_tiles():
    """SDXL's sizes put 3840 to 4096 tokens on the UNet's 64x-level (latents halved once): all run
    at 4096 with 1024 x 2048 tiles (at 3968 = 31 x 128 the tiles were 128 x 128: 10.8 ms a call
    against 1.21 on a v5e); their 32x-level (960 to 1024 tokens) at 1024, and the VAE's 128x-level
    with tiles of 1024 queries."""
    from sdxl_tpu.server.settings import SDXL_SIZES

    for size in SDXL_SIZES:
        width, height = (int(n) for n in size.split("x"))
        level = (height // 16) * (width // 16)
        assert 3840 <= level <= 4096 and attn.splash_length(level) == 4096, size
        assert attn.SPLASH_BLOCKS(attn.splash_length(level)) == (1024, 2048)
        assert attn.SPLASH_MIN_LENGTH <= level // 4 and attn.splash_length(level // 4) == 1024
        assert attn.SPLASH_BLOCKS(attn.splash_length(4 * level))[0] == 1024
    assert attn.splash_length(300) == 384 and attn.splash_length(1030) == 2048


def test_splash_attention_with_unequal_tiles_matches_reference_in_interpret_mode():
    q, k, v = _qkv(1, 2048, 1, 64)  # tiles of 1024 queries and 2048 keys: two query blocks, one key block
    out = jax.jit(lambda q, k, v: attn.splash_attention(q, k, v, interpret=True))(q, k, v)
    np.testing.assert_allclose(np.asarray(out), _reference(q, k, v), atol=2e-5, rtol=1e-4)


def test_wide_float32_heads_run_smaller_tiles(monkeypatch):
    """The VAE's attention in float32 (one 512-wide head): the tuned 1024 x 2048 tiles' buffers
    (25 MB) overflowed the kernel's 16 MiB of VMEM when a v5e compiled the decoder; it asks for
    512 x 1024. bfloat16 heads keep the tuned tiles."""
    asked = []
    real = attn._splash_kernel
    monkeypatch.setattr(attn, "_splash_kernel", lambda *a: asked.append(a[3:]) or real(*a))
    for dtype in (jnp.float32, jnp.bfloat16):
        q = jnp.zeros((1, 4096, 1, 512), dtype)
        jax.eval_shape(lambda q: attn.splash_attention(q, q, q, interpret=True), q)
    assert asked == [(512, 1024), (None, None)]
