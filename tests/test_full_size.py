"""The real SDXL base 1.0 architecture (random weights): its tensor names and shapes load, and
the outputs still equal diffusers / transformers. Each component is checked alone to stay
within a 24 GiB machine: reference forward, save as the fp16 variant, free, load ours, compare.
"""

from __future__ import annotations

import gc

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from reference import nchw_to_nhwc, random_model, rel_l2
from sdxl_tpu import Precision, load_text_encoder, load_unet, load_vae

pytestmark = pytest.mark.full_size
F32 = Precision()

SDXL_UNET = dict(
    act_fn="silu", addition_embed_type="text_time", addition_embed_type_num_heads=64, addition_time_embed_dim=256,
    attention_head_dim=[5, 10, 20], block_out_channels=[320, 640, 1280], center_input_sample=False,
    cross_attention_dim=2048, down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    downsample_padding=1, flip_sin_to_cos=True, freq_shift=0, in_channels=4, layers_per_block=2,
    mid_block_scale_factor=1, norm_eps=1e-05, norm_num_groups=32, out_channels=4,
    projection_class_embeddings_input_dim=2816, sample_size=128, transformer_layers_per_block=[1, 2, 10],
    up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"], use_linear_projection=True)
SDXL_VAE = dict(
    act_fn="silu", block_out_channels=[128, 256, 512, 512], down_block_types=["DownEncoderBlock2D"] * 4,
    in_channels=3, latent_channels=4, layers_per_block=2, norm_num_groups=32, out_channels=3, sample_size=1024,
    scaling_factor=0.13025, up_block_types=["UpDecoderBlock2D"] * 4)
CLIP_L = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
              num_attention_heads=12, hidden_act="quick_gelu", projection_dim=768, eos_token_id=2)
CLIP_BIGG = dict(vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                 num_attention_heads=20, hidden_act="gelu", projection_dim=1280, eos_token_id=2)


def _save_fp16_and_free(model: torch.nn.Module, directory) -> None:
    model.half().save_pretrained(directory, variant="fp16")
    del model
    gc.collect()


def test_sdxl_base_unet(tmp_path):
    from diffusers import UNet2DConditionModel

    model = random_model(lambda: UNet2DConditionModel(**SDXL_UNET))
    assert sum(p.numel() for p in model.parameters()) == 2_567_463_684
    gen = torch.Generator().manual_seed(0)
    sample, context = torch.randn(1, 4, 16, 16, generator=gen), torch.randn(1, 77, 2048, generator=gen)
    text_embeds = torch.randn(1, 1280, generator=gen)
    time_ids = torch.tensor([[1024.0, 1024.0, 0.0, 0.0, 1024.0, 1024.0]])
    with torch.no_grad():
        ref = model(sample, torch.tensor([999.0]), context,
                    added_cond_kwargs=dict(text_embeds=text_embeds, time_ids=time_ids)).sample
    _save_fp16_and_free(model, tmp_path)
    ours = load_unet(tmp_path, F32)
    out = ours(jnp.asarray(nchw_to_nhwc(sample)), jnp.asarray([999.0]), jnp.asarray(context.numpy()),
               jnp.asarray(text_embeds.numpy()), jnp.asarray(time_ids.numpy()))
    err = rel_l2(out, nchw_to_nhwc(ref))
    print(f"full-size unet: rel L2 {err:.2e}")
    assert err <= 1e-4


def test_sdxl_base_vae_decoder(tmp_path):
    from diffusers import AutoencoderKL

    model = random_model(lambda: AutoencoderKL(**SDXL_VAE))
    latents = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model.decode(latents / SDXL_VAE["scaling_factor"]).sample
    _save_fp16_and_free(model, tmp_path)
    out = load_vae(tmp_path, F32).decode(jnp.asarray(nchw_to_nhwc(latents)))
    err = rel_l2(out, nchw_to_nhwc(ref))
    print(f"full-size vae decoder: rel L2 {err:.2e}")
    assert err <= 1e-4


@pytest.mark.parametrize("name", ["text_encoder", "text_encoder_2"])
def test_sdxl_base_text_encoders(name, tmp_path):
    import transformers

    spec, cls = (CLIP_L, transformers.CLIPTextModel) if name == "text_encoder" else (
        CLIP_BIGG, transformers.CLIPTextModelWithProjection)
    config = transformers.CLIPTextConfig(max_position_embeddings=77, **spec)
    model = random_model(lambda: cls(config))
    ids = np.full((1, 77), 0, np.int64)
    ids[0, :6] = [49406, 320, 1125, 539, 320, 49407]
    with torch.no_grad():
        out = model(torch.from_numpy(ids), output_hidden_states=True)
    _save_fp16_and_free(model, tmp_path)
    hidden, pooled = load_text_encoder(tmp_path, F32, with_projection=name == "text_encoder_2")(jnp.asarray(ids))
    err = rel_l2(hidden, out.hidden_states[-2].numpy())
    print(f"full-size {name}: penultimate hidden states rel L2 {err:.2e}")
    assert err <= 1e-4
    if name == "text_encoder_2":
        err = rel_l2(pooled, out.text_embeds.numpy())
        print(f"full-size {name}: projected pooled rel L2 {err:.2e}")
        assert err <= 1e-4
