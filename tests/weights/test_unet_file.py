"""A UNet weights file over a base checkpoint (how SDXL-Lightning is published: one diffusers-format
UNet state dict), run as Lightning runs (Euler, trailing spacing, guidance 0): equal to diffusers
with the same UNet loaded into StableDiffusionXLPipeline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reference import psnr
from sdxl_tpu import CheckpointError, load_pipeline


@pytest.fixture(scope="module")
def unet_file(tiny_checkpoint, tmp_path_factory):
    from diffusers import UNet2DConditionModel
    from safetensors.torch import save_file

    from reference import perturb_norms

    torch.manual_seed(5)
    unet = perturb_norms(UNet2DConditionModel.from_pretrained(tiny_checkpoint, subfolder="unet"))
    with torch.no_grad():  # other weights than the base's, as a distilled UNet has
        for p in unet.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("lightning") / "sdxl_lightning_4step_unet.safetensors"
    save_file({k: v.contiguous() for k, v in unet.state_dict().items()}, str(path))
    return path, unet


def test_unet_file_with_trailing_euler_equals_diffusers(tiny_checkpoint, unet_file, compile_cache):
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline

    path, ref_unet = unet_file
    ours = load_pipeline(tiny_checkpoint, dtype="float32", sizes=[(64, 64)], unet=path, timestep_spacing="trailing",
                         compile_cache=compile_cache, warmup=False)
    assert ours.model_name.endswith("sdxl_lightning_4step_unet")
    assert ours.sampler.timestep_spacing == "trailing"
    reference = StableDiffusionXLPipeline.from_pretrained(tiny_checkpoint)
    reference.unet = ref_unet
    reference.scheduler = EulerDiscreteScheduler.from_config(reference.scheduler.config, timestep_spacing="trailing")
    latents = torch.randn(4, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    prompt = "a girl smiling, 4k"
    result = ours.generate(prompt, seed=1, guidance_scale=0.0, steps=4, size=(64, 64), sampler="Euler",
                           latents=latents.numpy())
    ref = reference(prompt, num_inference_steps=4, guidance_scale=0.0, height=64, width=64, latents=latents,
                    num_images_per_prompt=4, output_type="np").images
    value = psnr(np.stack([np.asarray(im) for im in result.images]), np.round(ref * 255).astype(np.uint8))
    print(f"UNet file, Euler trailing, 4 steps, guidance 0: PSNR {value:.1f} dB")
    assert value >= 40
    # Not the base checkpoint's UNet: its images differ.
    base = load_pipeline(tiny_checkpoint, dtype="float32", sizes=[(64, 64)], timestep_spacing="trailing",
                         compile_cache=compile_cache, warmup=False)
    other = base.generate(prompt, seed=1, guidance_scale=0.0, steps=4, size=(64, 64), latents=latents.numpy())
    assert psnr(np.asarray(other.images[0]), np.asarray(result.images[0])) < 30


def test_a_unet_file_that_does_not_fit_names_the_problem(tiny_checkpoint, unet_file, tmp_path):
    from safetensors.torch import save_file

    path, ref_unet = unet_file
    state = {k: v.contiguous() for k, v in ref_unet.state_dict().items()}
    state.pop("conv_in.weight")
    state["lora_unet_down.alpha"] = torch.ones(())
    broken = tmp_path / "broken.safetensors"
    save_file(state, str(broken))
    with pytest.raises(CheckpointError, match=r"unet \(broken.safetensors\) .*missing: conv_in.weight.*"
                                              r"unexpected: lora_unet_down.alpha"):
        load_pipeline(tiny_checkpoint, unet=broken, warmup=False)
    with pytest.raises(CheckpointError, match="neither an existing file nor a Hub file"):
        load_pipeline(tiny_checkpoint, unet=tmp_path / "nope.safetensors", warmup=False)
