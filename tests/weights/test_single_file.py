"""Single-file SDXL checkpoints (SGM / AUTOMATIC1111 layout) load directly and compute what
diffusers computes after `from_single_file` on the same file.

The file is written by `sdxl_tpu.weights.single_file.write_single_file` from a random diffusers-format
checkpoint; diffusers reading it back to exactly the original weights is what shows the layout is
the real one. The checkpoint's two text encoders differ in width (and its projection is not
square), as SDXL's do: diffusers tells them apart by width, and a transposed projection fails.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from reference import nchw_to_nhwc, psnr, rel_l2
from sdxl_tpu import CheckpointError, load_pipeline
from sdxl_tpu.weights.checkpoint import load_models
from sdxl_tpu.weights.single_file import PREFIXES, write_single_file
from sdxl_tpu.weights.tensors import flax_params_as_torch

TOL = 1e-4
COMPONENTS = ("text_encoder", "text_encoder_2", "unet", "vae")
WIDE_TEXT_ENCODER_2 = {"text_encoder_2": {"hidden_size": 48, "intermediate_size": 96, "projection_dim": 40},
                       "unet": {"cross_attention_dim": 32 + 48, "projection_class_embeddings_input_dim": 40 + 6 * 8}}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(diffusers directory, the same weights as one single file)."""
    from sdxl_tpu.weights.tiny import write_checkpoint

    tmp = tmp_path_factory.mktemp("single-file")
    root = write_checkpoint(tmp / "diffusers", seed=3, overrides=WIDE_TEXT_ENCODER_2)
    return root, write_single_file(root, tmp / "sdxl-finetune.safetensors")


@pytest.fixture(scope="module")
def diffusers_single_file(checkpoint):
    from diffusers import StableDiffusionXLPipeline

    root, path = checkpoint
    return StableDiffusionXLPipeline.from_single_file(str(path), config=str(root), local_files_only=True)


def test_the_file_is_what_diffusers_reads_as_the_same_weights(checkpoint, diffusers_single_file):
    from diffusers import StableDiffusionXLPipeline

    root, path = checkpoint
    keys = load_file(str(path)).keys()
    assert any(k.startswith("model.diffusion_model.input_blocks.") for k in keys)
    assert any(k.endswith(".attn.in_proj_weight") for k in keys)  # OpenCLIP's fused q/k/v
    assert not any(k.startswith(("unet.", "down_blocks.")) for k in keys)
    original = StableDiffusionXLPipeline.from_pretrained(str(root))
    for component in COMPONENTS:
        want, got = getattr(original, component).state_dict(), getattr(diffusers_single_file, component).state_dict()
        assert want.keys() == got.keys(), component
        for name in want:
            assert not got[name].is_meta and torch.equal(want[name], got[name]), f"{component}: {name}"


def test_loaded_directly_equal_to_the_diffusers_directory(checkpoint):
    root, path = checkpoint
    direct = load_models(path, dtype="float32", config=root)
    original = load_models(root, dtype="float32")
    for component in COMPONENTS:
        want, got = flax_params_as_torch(getattr(original, component)), flax_params_as_torch(getattr(direct, component))
        assert want.keys() == got.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{component}: {name}")


def test_every_component_computes_what_diffusers_from_single_file_computes(checkpoint, diffusers_single_file):
    root, path = checkpoint
    ours = load_models(path, dtype="float32", config=root)
    ref = diffusers_single_file
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 700, (2, 77), generator=gen)
    ids[:, 0], ids[0, 9:], ids[1, 40:] = 712, 713, 713  # start, then end-of-text padding
    errors = {}
    with torch.no_grad():
        for component in ("text_encoder", "text_encoder_2"):
            out = getattr(ref, component)(ids, output_hidden_states=True)
            hidden, pooled = getattr(ours, component)(jnp.asarray(ids.numpy()))
            errors[component] = rel_l2(hidden, out.hidden_states[-2].numpy())
            if component == "text_encoder_2":
                errors["text_encoder_2 pooled"] = rel_l2(pooled, out.text_embeds.numpy())
        sample, context = torch.randn(2, 4, 8, 8, generator=gen), torch.randn(2, 77, 80, generator=gen)
        pooled, time_ids = torch.randn(2, 40, generator=gen), torch.tensor([[64.0, 64, 0, 0, 64, 64]] * 2)
        t = torch.tensor([999.0, 250.0])
        want = ref.unet(sample, t, context, added_cond_kwargs=dict(text_embeds=pooled, time_ids=time_ids)).sample
        got = ours.unet(jnp.asarray(nchw_to_nhwc(sample)), jnp.asarray(t.numpy()), jnp.asarray(context.numpy()),
                        jnp.asarray(pooled.numpy()), jnp.asarray(time_ids.numpy()))
        errors["unet"] = rel_l2(got, nchw_to_nhwc(want))
        latents = torch.randn(2, 4, 8, 8, generator=gen)
        want = ref.vae.decode(latents / ref.vae.config.scaling_factor).sample
        errors["vae"] = rel_l2(ours.vae.decode(jnp.asarray(nchw_to_nhwc(latents))), nchw_to_nhwc(want))
    print("single file vs diffusers from_single_file, rel L2:", {k: f"{v:.1e}" for k, v in errors.items()})
    assert all(err <= TOL for err in errors.values()), errors


def test_end_to_end_equal_to_diffusers_from_single_file(checkpoint, diffusers_single_file, compile_cache):
    root, path = checkpoint
    pipe = load_pipeline(path, config=root, dtype="float32", sizes=[(64, 64)], compile_cache=compile_cache,
                         warmup=False)
    assert pipe.model_name == "sdxl-finetune"
    latents = torch.randn(4, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    prompt = "a lighthouse in a storm, oil painting"
    result = pipe.generate(prompt, seed=1, guidance_scale=5.0, steps=3, size=(64, 64), latents=latents.numpy())
    ref = diffusers_single_file(prompt, num_inference_steps=3, guidance_scale=5.0, height=64, width=64,
                                latents=latents, num_images_per_prompt=4, output_type="np").images
    value = psnr(np.stack([np.asarray(im) for im in result.images]), np.round(ref * 255).astype(np.uint8))
    print(f"single file end to end: PSNR {value:.1f} dB")
    assert value >= 40


def test_a_single_file_checkpoint_as_the_unet_over_a_base(checkpoint, tiny_checkpoint):
    """--unet takes a single-file checkpoint too (how some few-step models are published): its UNet
    part replaces the base's; the base's text encoders and VAE stay."""
    root, path = checkpoint
    models = load_models(root, dtype="float32", unet=path)
    want = flax_params_as_torch(load_models(path, dtype="float32", config=root).unet)
    got = flax_params_as_torch(models.unet)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def _rewrite(path, out, change):
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(out))
    return out


@pytest.mark.parametrize("change, named", [
    (lambda t: t.pop("model.diffusion_model.input_blocks.4.1.proj_in.weight"),
     "missing: model.diffusion_model.input_blocks.4.1.proj_in.weight"),
    (lambda t: t.update({"first_stage_model.decoder.up.9.block.0.conv1.bias": np.zeros(4, np.float32)}),
     "unexpected: first_stage_model.decoder.up.9.block.0.conv1.bias"),
    (lambda t: t.update({"conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight":
                         np.zeros((96, 48), np.float32)}),
     "conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight[q] (checkpoint (32, 48)"),
    (lambda t: t.update({"cond_stage_model.transformer.text_model.final_layer_norm.weight": np.ones(4, np.float32)}),
     "Stable Diffusion 1.x/2.x"),
    (lambda t: t.update({"lora_unet_conv_in.lora_down.weight": np.ones((2, 4), np.float32)}),
     "unexpected tensors outside the four SDXL networks: lora_unet_conv_in.lora_down.weight"),
    (lambda t: [t.pop(k) for k in list(t) if k.startswith(PREFIXES["text_encoder"])],
     "no tensors under conditioner.embedders.0.transformer."),
])
def test_a_file_that_does_not_fit_names_the_tensor(checkpoint, tmp_path, change, named):
    root, path = checkpoint
    bad = _rewrite(path, tmp_path / "bad.safetensors", change)
    with pytest.raises(CheckpointError) as e:
        load_models(bad, dtype="float32", config=root)
    assert named in str(e.value)


def test_the_checkpoint_lacking_its_file_is_named(checkpoint, tmp_path):
    root, _ = checkpoint
    with pytest.raises(CheckpointError, match="no-such-model.safetensors"):
        load_models(tmp_path / "no-such-model.safetensors", config=root)


def test_an_inpainting_single_file_is_read_as_one(tiny_inpainting_checkpoint, tiny_checkpoint, tmp_path):
    """A single file's UNet that takes 9 channels (SDXL inpainting) loads as an inpainting UNet over a
    base checkpoint's configs, as diffusers infers it from the file; a UNet taking other channels
    (InstructPix2Pix's 8) is refused by what it takes."""
    path = write_single_file(tiny_inpainting_checkpoint, tmp_path / "sdxl-inpainting.safetensors")
    direct = load_models(path, dtype="float32", config=tiny_checkpoint)
    assert direct.unet.config.in_channels == 9 and direct.condition_channels == 5
    want = flax_params_as_torch(load_models(tiny_inpainting_checkpoint, dtype="float32").unet)
    got = flax_params_as_torch(direct.unet)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    tensors = load_file(str(path))
    key = PREFIXES["unet"] + "input_blocks.0.0.weight"
    tensors[key] = tensors[key][:, :8]
    save_file(tensors, str(tmp_path / "pix2pix.safetensors"))
    with pytest.raises(CheckpointError, match="the UNet takes 8 input channels: supported are 4 .* and 9"):
        load_models(tmp_path / "pix2pix.safetensors", dtype="float32", config=tiny_checkpoint)
