"""An AUTOMATIC1111 image, reproduced from its parameters text.

A1111 is simulated on the tiny checkpoint's weights with the parts it runs: diffusers' UNet, VAE
and text encoders, k-diffusion's sampler on A1111's SDXL schedule and schedule type, A1111's CFG
denoiser (both passes in one batch, the denoised estimates combined), and its "CPU" random
source (ImageRNG: one torch.Generator per image, seeded seed + i, the initial noise then each
ancestral step's drawn from it), the decoded image truncated to uint8 as A1111 saves it. This
project gets only the parameters text, through paste parameters, as a person would give it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import kdiffusion_reference
from sdxl_tpu.spec.infotext import parse, request_fields

PROMPT, NEGATIVE, SEED, CFG = "a lighthouse in a storm, dramatic sky", "blurry, low quality", 3000000000, 5.5
# The settings line as A1111 writes it: 1.9 and later name the schedule apart; before, "... Karras" samplers.
CASES = {
    "Euler": ("Sampler: Euler", "sample_euler", "Uniform"),
    "Euler a": ("Sampler: Euler a", "sample_euler_ancestral", "Uniform"),
    "DPM++ 2M": ("Sampler: DPM++ 2M, Schedule type: Karras", "sample_dpmpp_2m", "Karras"),
    "DPM++ 2M Karras": ("Sampler: DPM++ 2M Karras", "sample_dpmpp_2m", "Karras"),
}


@pytest.fixture(scope="module")
def reference_pipeline(tiny_checkpoint):
    from diffusers import StableDiffusionXLPipeline

    return StableDiffusionXLPipeline.from_pretrained(tiny_checkpoint)


def a1111(pipe, steps: int, function: str, schedule: str, n: int = 4, size: tuple[int, int] = (64, 64),
          image: np.ndarray | None = None, strength: float | None = None, mask: np.ndarray | None = None) -> np.ndarray:
    """A1111's txt2img, or with `image` and `strength` its img2img (KDiffusionSampler.sample_img2img:
    setup_img2img_steps, the sigmas' tail, the image's latents plus noise times its first sigma).
    A1111 samples the VAE's latent distribution from torch's global generator, unseeded; here that
    draw comes first from each image's own generator, as our RNG CPU and diffusers draw it. With
    `mask` (blurred, at the size; masked content "original"), its inpainting: the latents' mask
    (PIL's bicubic downscale, rounded), every denoised estimate and the final latents blended with
    the image's latents where it keeps them (CFGDenoiser, sample()), the image laid over the result
    through the doubled mask (apply_overlay)."""
    sampling, external = kdiffusion_reference.load()
    width, height = size
    with torch.no_grad():
        cond, uncond, pooled, uncond_pooled = pipe.encode_prompt(PROMPT, negative_prompt=NEGATIVE,
                                                                 num_images_per_prompt=n)
        time_ids = torch.tensor([[height, width, 0, 0, height, width]] * 2 * n, dtype=torch.float32)
        context, pooled_both = torch.cat([cond, uncond]), torch.cat([pooled, uncond_pooled])

        def unet(x, t):
            return pipe.unet(x, t, encoder_hidden_states=context,
                             added_cond_kwargs={"text_embeds": pooled_both, "time_ids": time_ids}).sample

        model = external.DiscreteEpsDDPMDenoiser(unet, kdiffusion_reference.a1111_alphas_cumprod(), quantize=False)

        blend = lambda latents: latents

        def cfg_denoiser(x, sigma):  # A1111's CFGDenoiser
            denoised = model(torch.cat([x, x]), torch.cat([sigma, sigma]))
            on_prompt, on_negative = denoised.chunk(2)
            return blend(on_negative + (on_prompt - on_negative) * CFG)

        sigmas = kdiffusion_reference.a1111_sigmas(schedule, steps, model)
        generators = [torch.Generator("cpu").manual_seed(SEED + i) for i in range(n)]
        shape = (pipe.unet.config.in_channels, height // 8, width // 8)
        draw = lambda *_: torch.stack([torch.randn(shape, generator=g) for g in generators])
        extra = {"noise_sampler": draw} if function == "sample_euler_ancestral" else {}
        start = 0
        if image is not None:
            pixels = torch.from_numpy(image.astype(np.float32) / 255.0 * 2 - 1).permute(2, 0, 1)
            pixels = pixels[None].repeat(n, 1, 1, 1)
            posterior = pipe.vae.encode(pixels).latent_dist
            start = pipe.vae.config.scaling_factor * (posterior.mean + posterior.std * draw())
            t_enc = int(min(strength, 0.999) * steps)
            sigmas = sigmas[steps - t_enc - 1:]
        if mask is not None:
            latmask = np.asarray(Image.fromarray(mask).convert("RGB").resize((width // 8, height // 8)), np.float32)
            nmask = torch.from_numpy(np.around(latmask[..., 0] / 255))
            blend = lambda latents: latents * nmask + start * (1 - nmask)
        latents = getattr(sampling, function)(cfg_denoiser, start + draw() * sigmas[0], sigmas, disable=True, **extra)
        images = pipe.vae.decode(blend(latents) / pipe.vae.config.scaling_factor).sample
    images = torch.clamp((images + 1.0) / 2.0, min=0.0, max=1.0)
    images = (255.0 * images.numpy().transpose(0, 2, 3, 1)).astype(np.uint8)
    if mask is None:
        return images
    overlay = Image.new("RGBa", size)
    overlay.paste(Image.fromarray(image).convert("RGBA").convert("RGBa"),
                  mask=ImageOps.invert(Image.fromarray(np.clip(mask.astype(np.float32) * 2, 0, 255).astype(np.uint8))))
    out = []
    for made in images:
        made = Image.fromarray(made).convert("RGBA")
        made.alpha_composite(overlay.convert("RGBA"))
        out.append(np.asarray(made.convert("RGB")))
    return np.stack(out)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


# (8 steps each; one at 20: the schedules themselves are checked at 1 to 50 steps in test_kdiffusion)
@pytest.mark.parametrize("sampler, steps", [*((name, 8) for name in CASES), ("DPM++ 2M Karras", 20)])
def test_an_a1111_image_is_reproduced_from_its_parameters(tiny_pipeline, reference_pipeline, sampler, steps):
    settings, function, schedule = CASES[sampler]
    text = (f"{PROMPT}\nNegative prompt: {NEGATIVE}\nSteps: {steps}, {settings}, CFG scale: {CFG}, Seed: {SEED}, "
            "Size: 64x64, Model hash: 31e35c80fc, Model: sd_xl_base_1.0, RNG: CPU, Version: v1.10.1")
    fields, notes = request_fields(parse(text), tiny_pipeline.sizes, list(tiny_pipeline.samplers))
    assert fields["rng"] == "CPU" and fields["sampler"] == sampler, (fields, notes)
    result = tiny_pipeline.generate(**fields)
    assert [i.seed for i in result.infos] == [SEED + i for i in range(4)]
    assert {i.schedule for i in result.infos} == {schedule}  # what ran, as its parameters say
    ours = np.stack([np.asarray(im) for im in result.images])
    ref = a1111(reference_pipeline, steps, function, schedule)
    value = psnr(ours, ref)
    print(f"{sampler}, {steps} steps: PSNR {value:.1f} dB")
    assert value >= 40
    # The same text without RNG: CPU is JAX's noise, another image (A1111's default GPU noise is not reproduced).
    other = tiny_pipeline.generate(**{**fields, "rng": "JAX"})
    assert psnr(np.stack([np.asarray(im) for im in other.images]), ref) < 30


@pytest.mark.parametrize("sampler, steps, strength", [("Euler a", 10, 0.6), ("DPM++ 2M Karras", 12, 0.45)])
def test_an_a1111_img2img_is_reproduced(tiny_pipeline, reference_pipeline, sampler, steps, strength):
    """img2img from the same image with A1111's parameters (its schedule type, RNG CPU, Denoising
    strength): the steps A1111 runs for the strength, on the sigmas' tail, from the image's latents."""
    settings, function, schedule = CASES[sampler]
    y, x = np.mgrid[0:64, 0:64]
    image = np.stack([x * 4, y * 4, 255 - x * 2], -1).astype(np.uint8)
    text = (f"{PROMPT}\nNegative prompt: {NEGATIVE}\nSteps: {steps}, {settings}, CFG scale: {CFG}, Seed: {SEED}, "
            f"Size: 64x64, Denoising strength: {strength}, RNG: CPU, Version: v1.10.1")
    fields, notes = request_fields(parse(text), tiny_pipeline.sizes, list(tiny_pipeline.samplers))
    assert fields["strength"] == strength  # (A1111's key, read back)
    result = tiny_pipeline.generate(**fields, image=image)
    ours = np.stack([np.asarray(im) for im in result.images])
    value = psnr(ours, a1111(reference_pipeline, steps, function, schedule, image=image, strength=strength))
    print(f"img2img {sampler}, {steps} steps, strength {strength}: PSNR {value:.1f} dB")
    assert value >= 40


@pytest.mark.parametrize("sampler, steps, strength", [("Euler a", 10, 0.75), ("DPM++ 2M Karras", 12, 0.6)])
def test_an_a1111_inpainting_is_reproduced(tiny_pipeline, reference_pipeline, sampler, steps, strength):
    """Inpainting with A1111's parameters (Mask blur 4, masked content original): its mask blurred
    with OpenCV as A1111 blurs it, the steps and blends as its CFG denoiser and sample() make them,
    its overlay; the pixels outside the blurred mask are the image's."""
    import cv2

    from sdxl_tpu.spec.mask import gaussian_blur

    settings, function, schedule = CASES[sampler]
    y, x = np.mgrid[0:64, 0:64]
    image = np.stack([x * 4, y * 4, 255 - x * 2], -1).astype(np.uint8)
    mask = np.zeros((64, 64), np.uint8)
    mask[16:48, 8:40] = 255
    blurred = cv2.GaussianBlur(cv2.GaussianBlur(mask, (21, 1), 4), (1, 21), 4)  # (A1111: 2 * int(2.5 * 4 + 0.5) + 1)
    text = (f"{PROMPT}\nNegative prompt: {NEGATIVE}\nSteps: {steps}, {settings}, CFG scale: {CFG}, Seed: {SEED}, "
            f"Size: 64x64, Denoising strength: {strength}, Mask blur: 4, RNG: CPU, Version: v1.10.1")
    fields, notes = request_fields(parse(text), tiny_pipeline.sizes, list(tiny_pipeline.samplers))
    result = tiny_pipeline.generate(**fields, image=image, mask_image=mask)
    ours = np.stack([np.asarray(im) for im in result.images])
    theirs = a1111(reference_pipeline, steps, function, schedule, image=image, strength=strength, mask=blurred)
    value = psnr(ours, theirs)
    print(f"inpainting {sampler}, {steps} steps, strength {strength}: PSNR {value:.1f} dB")
    assert value >= 40
    outside = gaussian_blur(gaussian_blur(mask, 4, axis=1), 4, axis=0) == 0  # (ours: within 3 levels of OpenCV's)
    assert (ours[:, outside] == image[outside]).all() and psnr(ours[:, mask > 0], theirs[:, mask > 0]) >= 40
