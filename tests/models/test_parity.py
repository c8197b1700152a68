"""sdxl_tpu's Flax models compute what diffusers / transformers (PyTorch) compute.

Random PyTorch weights are saved in diffusers / transformers format, loaded with sdxl_tpu,
and both run on the same inputs in float32: relative L2 error <= 1e-4.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from reference import nchw_to_nhwc, perturb_norms, rel_l2
from sdxl_tpu import Precision, load_text_encoder, load_unet, load_vae

TOL = 1e-4
F32 = Precision()

TEXT_ENCODERS = {
    # CLIP ViT-L/14 style (SDXL text_encoder): quick_gelu, legacy eos_token_id=2 (pool at argmax id).
    "clip-l-like": dict(cls="CLIPTextModel", hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                        num_attention_heads=4, hidden_act="quick_gelu", eos_token_id=2),
    # OpenCLIP bigG style (SDXL text_encoder_2): gelu, projection, pool at first eos_token_id.
    "bigg-like": dict(cls="CLIPTextModelWithProjection", hidden_size=48, intermediate_size=96,
                      num_hidden_layers=4, num_attention_heads=3, hidden_act="gelu", eos_token_id=999,
                      projection_dim=40),
}


def _token_ids(batch: int, eos: int, pad: int, lengths: list[int]) -> np.ndarray:
    rng = np.random.default_rng(0)
    ids = np.full((batch, 77), pad, np.int64)
    for i, n in enumerate(lengths):
        ids[i, 0] = 997  # bos
        ids[i, 1:n] = rng.integers(3, 990, n - 1)
        ids[i, n] = eos
    return ids


@pytest.mark.parametrize("name", list(TEXT_ENCODERS))
def test_text_encoder_parity(name, tmp_path):
    import transformers

    spec = dict(TEXT_ENCODERS[name])
    cls = getattr(transformers, spec.pop("cls"))
    torch.manual_seed(0)
    config = transformers.CLIPTextConfig(vocab_size=1000, max_position_embeddings=77, bos_token_id=997,
                                         pad_token_id=1, **spec)
    ref_model = perturb_norms(cls(config))
    ref_model.save_pretrained(tmp_path)
    with_projection = "projection_dim" in spec
    ours = load_text_encoder(tmp_path, F32, with_projection=with_projection)

    # Pad with EOS (tokenizer 1) for the first-occurrence rule, with a low id for the argmax rule.
    eos = 999
    ids = _token_ids(3, eos, pad=eos if spec["eos_token_id"] == eos else 5, lengths=[4, 20, 76])
    with torch.no_grad():
        out = ref_model(torch.from_numpy(ids), output_hidden_states=True)
    hidden, pooled = ours(jnp.asarray(ids))
    err = rel_l2(hidden, out.hidden_states[-2].numpy())
    print(f"{name}: penultimate hidden states rel L2 {err:.2e}")
    assert err <= TOL
    if with_projection:
        err = rel_l2(pooled, out.text_embeds.numpy())
        print(f"{name}: projected pooled output rel L2 {err:.2e}")
        assert err <= TOL
    else:
        assert pooled is None


UNETS = {
    # SDXL's block structure at small width.
    "sdxl-like": dict(
        down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
        up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
        block_out_channels=[32, 64, 64], layers_per_block=2, transformer_layers_per_block=[1, 1, 2],
        attention_head_dim=[2, 4, 4], cross_attention_dim=48, norm_num_groups=16, use_linear_projection=True,
        addition_time_embed_dim=8, projection_class_embeddings_input_dim=32 + 6 * 8, latent=(16, 16), pooled=32),
    # Other channels, depth, head counts, conv projections, timestep embedding flags and an odd
    # latent size that needs explicit upsample sizes.
    "other-shape": dict(
        down_block_types=["CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
        up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
        block_out_channels=[24, 48], layers_per_block=1, transformer_layers_per_block=[2, 3],
        attention_head_dim=[3, 6], cross_attention_dim=40, norm_num_groups=8, use_linear_projection=False,
        upcast_attention=True, flip_sin_to_cos=False, freq_shift=1, addition_time_embed_dim=16,
        projection_class_embeddings_input_dim=20 + 6 * 16, latent=(9, 14), pooled=20),
}


@pytest.mark.parametrize("name", list(UNETS))
def test_unet_parity(name, tmp_path):
    from diffusers import UNet2DConditionModel

    spec = dict(UNETS[name])
    (h, w), pooled_dim = spec.pop("latent"), spec.pop("pooled")
    torch.manual_seed(0)
    ref_model = perturb_norms(UNet2DConditionModel(addition_embed_type="text_time", **spec))
    ref_model.save_pretrained(tmp_path)
    ours = load_unet(tmp_path, F32)

    batch = 3
    gen = torch.Generator().manual_seed(0)
    sample = torch.randn(batch, 4, h, w, generator=gen)
    context = torch.randn(batch, 7, spec["cross_attention_dim"], generator=gen)
    text_embeds = torch.randn(batch, pooled_dim, generator=gen)
    time_ids = torch.tensor([[1024, 1024, 0, 0, 1024, 1024], [768, 1344, 16, 32, 1024, 1024],
                             [512, 512, 0, 0, 896, 1152]], dtype=torch.float32)
    timesteps = torch.tensor([999.0, 500.5, 1.0])
    with torch.no_grad():
        ref = ref_model(sample, timesteps, context,
                        added_cond_kwargs=dict(text_embeds=text_embeds, time_ids=time_ids)).sample
    out = ours(jnp.asarray(nchw_to_nhwc(sample)), jnp.asarray(timesteps.numpy()), jnp.asarray(context.numpy()),
               jnp.asarray(text_embeds.numpy()), jnp.asarray(time_ids.numpy()))
    for i, t in enumerate(timesteps.tolist()):
        err = rel_l2(out[i], nchw_to_nhwc(ref)[i])
        print(f"unet {name}: timestep {t}: rel L2 {err:.2e}")
        assert err <= TOL


def _reference_vae(tmp_path):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    model = perturb_norms(AutoencoderKL(
        block_out_channels=[16, 32, 32], down_block_types=["DownEncoderBlock2D"] * 3,
        up_block_types=["UpDecoderBlock2D"] * 3, layers_per_block=2, norm_num_groups=8, latent_channels=4,
        scaling_factor=0.13025))
    model.save_pretrained(tmp_path)
    return model


def test_vae_decoder_parity(tmp_path):
    ref_model = _reference_vae(tmp_path)
    ours = load_vae(tmp_path, F32)
    latents = torch.randn(2, 4, 12, 10, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = ref_model.decode(latents / ref_model.config.scaling_factor).sample
    out = ours.decode(jnp.asarray(nchw_to_nhwc(latents)))
    err = rel_l2(out, nchw_to_nhwc(ref))
    print(f"vae decoder: rel L2 {err:.2e}")
    assert err <= TOL


def test_vae_encoder_parity(tmp_path):
    ref_model = _reference_vae(tmp_path)
    ours = load_vae(tmp_path, F32)
    images = torch.rand(2, 3, 48, 40, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        dist = ref_model.encode(images).latent_dist
    mean, logvar = ours.encode(jnp.asarray(nchw_to_nhwc(images)))
    err_mean, err_logvar = rel_l2(mean, nchw_to_nhwc(dist.mean)), rel_l2(logvar, nchw_to_nhwc(dist.logvar))
    print(f"vae encoder: mean rel L2 {err_mean:.2e}, logvar rel L2 {err_logvar:.2e}")
    assert err_mean <= TOL and err_logvar <= TOL


def test_tiled_vae_equals_diffusers_tiling(tmp_path):
    """Above a tile (the config's sample_size, here 32 px, 8 latents), decode and encode work in
    overlapping tiles blended as diffusers' enable_tiling blends them: 2 x 3 tiles, partial ones
    at the edges; and it stays near the untiled result (the seams are blended, not visible)."""
    ref_model = _reference_vae(tmp_path)
    ours = load_vae(tmp_path, F32)
    assert ours.tile_sizes == (32, 8)
    ref_model.enable_tiling()
    latents = torch.randn(1, 4, 12, 14, generator=torch.Generator().manual_seed(0))  # 2 x 3 tiles, partial ones
    with torch.no_grad():
        ref = ref_model.decode(latents / ref_model.config.scaling_factor).sample
    out = jax.jit(ours.tiled_decode)(jnp.asarray(nchw_to_nhwc(latents)))  # (one compile, not one per tile's op)
    err = rel_l2(out, nchw_to_nhwc(ref))
    print(f"tiled vae decoder: rel L2 {err:.2e}")
    assert out.shape == (1, 48, 56, 3) and err <= TOL
    assert rel_l2(out, ours.decode(jnp.asarray(nchw_to_nhwc(latents)))) < 0.5  # (random weights: loosely)
    images = torch.rand(1, 3, 48, 56, generator=torch.Generator().manual_seed(1)) * 2 - 1  # 2 x 3 tiles
    with torch.no_grad():
        dist = ref_model.encode(images).latent_dist
    mean, logvar = jax.jit(ours.tiled_encode)(jnp.asarray(nchw_to_nhwc(images)))
    err_mean, err_logvar = rel_l2(mean, nchw_to_nhwc(dist.mean)), rel_l2(logvar, nchw_to_nhwc(dist.logvar))
    print(f"tiled vae encoder: mean rel L2 {err_mean:.2e}, logvar rel L2 {err_logvar:.2e}")
    assert mean.shape == (1, 12, 14, 4) and err_mean <= TOL and err_logvar <= TOL


def test_bfloat16_params_and_activations_stay_close(tmp_path):
    """bfloat16 is selectable for params and activations and still tracks the float32 reference."""
    ref_model = _reference_vae(tmp_path)
    ours = load_vae(tmp_path, Precision.of("bfloat16"))
    assert all(leaf.dtype == jnp.bfloat16 for leaf in __import__("jax").tree.leaves(
        __import__("flax").nnx.state(ours, __import__("flax").nnx.Param)))
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = ref_model.decode(latents / ref_model.config.scaling_factor).sample
    out = ours.decode(jnp.asarray(nchw_to_nhwc(latents)))
    assert out.dtype == jnp.bfloat16
    err = rel_l2(np.asarray(out, np.float32), nchw_to_nhwc(ref))
    print(f"vae decoder bfloat16: rel L2 {err:.2e}")
    assert err <= 3e-2


@pytest.mark.parametrize("shape", [(2, 6, 5, 64), (2, 7, 96)])
def test_group_norm_matches_torch_on_activations_far_from_zero(shape):
    """GroupNorm's statistics stay two-pass: activations whose mean is 1e4 times their spread (a
    one-pass E[x^2] - E[x]^2 in float32 loses the variance entirely) normalize as torch's do,
    on images (B, H, W, C) and on tokens (B, L, C)."""
    from flax import nnx

    from sdxl_tpu.models.layers import GroupNorm

    rng = np.random.default_rng(1)
    channels = shape[-1]
    x = (1e3 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    x += rng.standard_normal(channels).astype(np.float32)  # each channel its own offset
    scale, bias = rng.standard_normal(channels).astype(np.float32), rng.standard_normal(channels).astype(np.float32)
    ours = GroupNorm(32, channels, 1e-6, F32)
    ours.scale = nnx.Param(jnp.asarray(scale))
    ours.bias = nnx.Param(jnp.asarray(bias))
    norm = torch.nn.GroupNorm(32, channels, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(scale))
        norm.bias.copy_(torch.from_numpy(bias))
        channels_first = torch.from_numpy(np.moveaxis(x, -1, 1).copy())
        ref = np.moveaxis(norm(channels_first).numpy(), 1, -1)
    out = np.asarray(ours(jnp.asarray(x)))
    err = rel_l2(out, ref)
    print(f"group norm {shape}: rel L2 {err:.2e}")
    assert err <= 1e-3


def test_gelu_is_torchs_exact_gelu():
    """layers.gelu (erf as Abramowitz & Stegun 7.1.26, cheaper on a TPU than XLA's erf) is torch's exact
    F.gelu: within 1e-6 of it in float64 over [-12, 12] when computed in float32, as XLA's own erf is;
    and in bfloat16, for every bfloat16 input, within one bfloat16 step of the exact value rounded to
    bfloat16 wherever that is 1e-6 or more (below, both are within 1e-7 of it: torch's own bfloat16
    GELU, which subtracts erf from 1, gives -1.49e-6 for gelu(-5) = -1.43e-6 and 0 from -6)."""
    from sdxl_tpu.models.layers import gelu

    x = np.linspace(-12, 12, 400_001, dtype=np.float32)
    exact = torch.nn.functional.gelu(torch.from_numpy(x).double()).numpy()
    assert np.abs(np.asarray(gelu(jnp.asarray(x)), np.float64) - exact).max() <= 1e-6

    bits = np.arange(1 << 16, dtype=np.uint16)
    values = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    values = values[values.float().abs() < 1e30]  # (and finite)
    exact = torch.nn.functional.gelu(values.double())
    ours = gelu(jnp.asarray(values.float().numpy(), jnp.bfloat16)).astype(jnp.float32)
    ours = torch.from_numpy(np.array(ours)).double()
    assert float((ours - exact).abs().max()) <= 1e-7 * max(1.0, float(values.float().abs().max()))
    large = exact.abs() >= 1e-6
    steps = (ours.to(torch.bfloat16).view(torch.int16).int() - exact.to(torch.bfloat16).view(torch.int16).int()).abs()
    assert int(steps[large].max()) <= 1, values[large][steps[large] > 1][:5]
