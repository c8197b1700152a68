"""`python -m sdxl_tpu make-tiny DIR` writes a checkpoint diffusers loads exactly, and so do we."""

from __future__ import annotations

import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from reference import nchw_to_nhwc, rel_l2
from sdxl_tpu import load_models, load_tokenizers


@pytest.fixture(scope="module")
def cli_tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "t"
    result = subprocess.run([sys.executable, "-m", "sdxl_tpu", "make-tiny", str(out)], capture_output=True,
                            text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr
    assert "wrote tiny SDXL checkpoint" in result.stdout
    return out


def test_make_tiny_bad_directory_is_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = subprocess.run([sys.executable, "-m", "sdxl_tpu", "make-tiny", str(blocker / "t")],
                            capture_output=True, text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode != 0
    assert result.stderr.strip().startswith("error: cannot write") and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_every_component_loads_in_diffusers_without_missing_or_extra_tensors(cli_tiny):
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    for cls, sub in ((UNet2DConditionModel, "unet"), (AutoencoderKL, "vae"), (CLIPTextModel, "text_encoder"),
                     (CLIPTextModelWithProjection, "text_encoder_2")):
        _, info = cls.from_pretrained(cli_tiny, subfolder=sub, output_loading_info=True)
        problems = {k: v for k, v in info.items() if v}
        assert not problems, f"{sub}: {problems}"


def test_diffusers_pipeline_runs_on_tiny_and_our_models_match_it(cli_tiny):
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_pretrained(cli_tiny)
    assert pipe.config.force_zeros_for_empty_prompt
    images = pipe("a photo of a cat", negative_prompt="blurry", num_inference_steps=2, height=64, width=64,
                  output_type="np", generator=torch.Generator().manual_seed(0)).images
    assert images.shape == (1, 64, 64, 3) and np.isfinite(images).all() and images.std() > 0.01

    ours = load_models(cli_tiny, dtype="float32")
    tok1, tok2 = load_tokenizers(cli_tiny)
    prompt = "a cinematic photo of an astronaut riding a horse, highly detailed"
    for ours_tok, ref_tok in ((tok1, pipe.tokenizer), (tok2, pipe.tokenizer_2)):
        assert ours_tok(prompt).input_ids == ref_tok(prompt).input_ids
    assert tok2.pad_token == "!" and tok1.pad_token == "<|endoftext|>"

    def ids(tok):
        return tok(prompt, padding="max_length", max_length=77, truncation=True, return_tensors="np").input_ids

    with torch.no_grad():
        ref1 = pipe.text_encoder(torch.from_numpy(ids(tok1)), output_hidden_states=True)
        ref2 = pipe.text_encoder_2(torch.from_numpy(ids(tok2)), output_hidden_states=True)
    h1, _ = ours.text_encoder(jnp.asarray(ids(tok1)))
    h2, pooled = ours.text_encoder_2(jnp.asarray(ids(tok2)))
    assert rel_l2(h1, ref1.hidden_states[-2].numpy()) <= 1e-4
    assert rel_l2(h2, ref2.hidden_states[-2].numpy()) <= 1e-4
    assert rel_l2(pooled, ref2.text_embeds.numpy()) <= 1e-4

    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    context = torch.cat([ref1.hidden_states[-2], ref2.hidden_states[-2]], dim=-1)
    time_ids = torch.tensor([[64.0, 64.0, 0.0, 0.0, 64.0, 64.0]])
    with torch.no_grad():
        ref_eps = pipe.unet(latents, torch.tensor([500.0]), context,
                            added_cond_kwargs=dict(text_embeds=ref2.text_embeds, time_ids=time_ids)).sample
        ref_img = pipe.vae.decode(latents / pipe.vae.config.scaling_factor).sample
    eps = ours.unet(jnp.asarray(nchw_to_nhwc(latents)), jnp.asarray([500.0]), jnp.asarray(context.numpy()),
                    jnp.asarray(ref2.text_embeds.numpy()), jnp.asarray(time_ids.numpy()))
    assert rel_l2(eps, nchw_to_nhwc(ref_eps)) <= 1e-4
    assert rel_l2(ours.vae.decode(jnp.asarray(nchw_to_nhwc(latents))), nchw_to_nhwc(ref_img)) <= 1e-4


def test_tiny_loads_in_bfloat16_by_default(tiny_checkpoint):
    models = load_models(tiny_checkpoint)
    assert models.unet.conv_in.kernel[...].dtype == jnp.bfloat16
    assert models.text_encoder_2.text_projection.kernel[...].dtype == jnp.bfloat16
