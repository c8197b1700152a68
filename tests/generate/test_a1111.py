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
from sdxl_tpu.a1111.infotext import parse, request_fields

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
          image: np.ndarray | None = None, strength: float | None = None, mask: np.ndarray | None = None,
          overlay: bool = True) -> np.ndarray:
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

        condition = []  # an inpainting UNet's, beside the (scaled) latents: A1111's c_concat

        def unet(x, t):
            x = torch.cat([x, *condition], dim=1)
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
        shape = (pipe.vae.config.latent_channels, height // 8, width // 8)
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
        noise = draw()
        if pipe.unet.config.in_channels == 9:  # A1111's inpainting_image_conditioning (mask weight 1)
            pixels = torch.from_numpy(image.astype(np.float32) / 255.0 * 2 - 1).permute(2, 0, 1)[None]
            rounded = torch.from_numpy(np.round(mask.astype(np.float32) / 255))[None, None]
            posterior = pipe.vae.encode(pixels * (1 - rounded)).latent_dist
            masked = pipe.vae.config.scaling_factor * (posterior.mean + posterior.std * draw())
            resized = torch.nn.functional.interpolate(rounded, size=(height // 8, width // 8)).expand(n, -1, -1, -1)
            condition.append(torch.cat([resized, masked], dim=1).repeat(2, 1, 1, 1))
        latents = getattr(sampling, function)(cfg_denoiser, start + noise * sigmas[0], sigmas, disable=True, **extra)
        images = pipe.vae.decode(blend(latents) / pipe.vae.config.scaling_factor).sample
    images = torch.clamp((images + 1.0) / 2.0, min=0.0, max=1.0)
    images = (255.0 * images.numpy().transpose(0, 2, 3, 1)).astype(np.uint8)
    if mask is None or not overlay:
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


@pytest.fixture(scope="module")
def reference_inpainting_pipeline(tiny_inpainting_checkpoint):
    from diffusers import StableDiffusionXLPipeline

    return StableDiffusionXLPipeline.from_pretrained(tiny_inpainting_checkpoint)


@pytest.mark.parametrize("unet, sampler, steps, strength", [("base", "DPM++ 2M Karras", 12, 0.6),
                                                            ("inpainting", "Euler a", 10, 0.75),
                                                            ("inpainting", "DPM++ 2M Karras", 12, 1.0)])
def test_an_a1111_inpainting_is_reproduced(request, unet, sampler, steps, strength):
    """Inpainting with A1111's parameters (Mask blur 4, masked content original): its mask blurred
    with OpenCV as A1111 blurs it, the steps and blends as its CFG denoiser and sample() make them,
    its overlay; the pixels outside the blurred mask are the image's. An inpainting UNet also takes
    A1111's conditioning: the rounded mask and the latents of the image blanked under it (that VAE
    sample, unseeded in A1111, drawn third from each image's generator, as ours)."""
    import cv2

    from sdxl_tpu.imaging.mask import gaussian_blur

    names = ("tiny_pipeline", "reference_pipeline") if unet == "base" else ("tiny_inpainting_pipeline",
                                                                           "reference_inpainting_pipeline")
    tiny_pipeline, reference_pipeline = map(request.getfixturevalue, names)
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
    print(f"inpainting ({unet} UNet) {sampler}, {steps} steps, strength {strength}: PSNR {value:.1f} dB")
    assert value >= 40
    outside = gaussian_blur(gaussian_blur(mask, 4, axis=1), 4, axis=0) == 0  # (ours: within 3 levels of OpenCV's)
    assert (ours[:, outside] == image[outside]).all() and psnr(ours[:, mask > 0], theirs[:, mask > 0]) >= 40


def a1111_crop_region(mask: np.ndarray, pad: int, width: int, height: int) -> tuple[int, int, int, int]:
    """A1111's masking.get_crop_region (the loop it had before get_crop_region_v2's getbbox, the
    same box) and expand_crop_region, as its source writes them."""
    h, w = mask.shape
    left = next(i for i in range(w) if mask[:, i].any())
    right = next(i for i in range(w) if mask[:, w - 1 - i].any())
    top = next(i for i in range(h) if mask[i].any())
    bottom = next(i for i in range(h) if mask[h - 1 - i].any())
    x1, y1, x2, y2 = max(left - pad, 0), max(top - pad, 0), min(w - right + pad, w), min(h - bottom + pad, h)
    if (x2 - x1) / (y2 - y1) > width / height:
        diff = int((x2 - x1) / (width / height) - (y2 - y1))
        y1 -= diff // 2
        y2 += diff - diff // 2
        if y2 >= h:
            y1, y2 = y1 - (y2 - h), h
        if y1 < 0:
            y2, y1 = y2 - y1, 0
        y2 = min(y2, h)
    else:
        diff = int((y2 - y1) * (width / height) - (x2 - x1))
        x1 -= diff // 2
        x2 += diff - diff // 2
        if x2 >= w:
            x1, x2 = x1 - (x2 - w), w
        if x1 < 0:
            x2, x1 = x2 - x1, 0
        x2 = min(x2, w)
    return x1, y1, x2, y2


def test_an_a1111_only_masked_inpainting_is_reproduced(tiny_pipeline, reference_pipeline):
    """Inpaint area "Only masked" with A1111's parameters: the blurred mask's box, padded and widened
    to the size's shape, cropped from image and mask and fitted (Resize and fill), inpainted as
    A1111 inpaints, the results fitted back (Crop and resize) into the image at its own size and the
    image laid over them through the blurred mask (not doubled). The images are the starting
    image's size; outside the blurred mask its pixels."""
    from sdxl_tpu.imaging.mask import gaussian_blur
    from sdxl_tpu.imaging.resize import fit_image

    settings, function, schedule = CASES["Euler a"]
    y, x = np.mgrid[0:80, 0:120]
    image = np.stack([x * 2, y * 3, 255 - x * 2], -1).astype(np.uint8)
    mask = np.zeros((80, 120), np.uint8)
    mask[30:44, 70:100] = 255
    text = (f"{PROMPT}\nNegative prompt: {NEGATIVE}\nSteps: 10, {settings}, CFG scale: {CFG}, Seed: {SEED}, "
            "Size: 64x64, Denoising strength: 0.75, Mask blur: 4, Inpaint area: Only masked, Masked area padding: 6, "
            "RNG: CPU, Version: v1.10.1")
    fields, notes = request_fields(parse(text), tiny_pipeline.sizes, list(tiny_pipeline.samplers))
    assert (fields["inpaint_area"], fields["mask_padding"]) == ("Only masked", 6), (fields, notes)
    result = tiny_pipeline.generate(**fields, image=image, mask_image=mask)
    ours = np.stack([np.asarray(im) for im in result.images])
    assert ours.shape == (4, 80, 120, 3)
    # A1111 on the same blurred mask (ours: within 3 levels of OpenCV's, test_inpaint.py)
    blurred = gaussian_blur(gaussian_blur(mask, 4, axis=1), 4, axis=0)
    x1, y1, x2, y2 = region = a1111_crop_region(blurred, 6, 64, 64)
    cropped = np.asarray(fit_image(Image.fromarray(image).crop(region), (64, 64), "Resize and fill"))
    cropped_mask = np.asarray(fit_image(Image.fromarray(blurred).crop(region), (64, 64), "Resize and fill"))
    made = a1111(reference_pipeline, 10, function, schedule, image=cropped, strength=0.75, mask=cropped_mask,
                 overlay=False)
    kept = Image.new("RGBa", (120, 80))
    kept.paste(Image.fromarray(image).convert("RGBA").convert("RGBa"), mask=ImageOps.invert(Image.fromarray(blurred)))
    theirs = []
    for one in made:
        base = Image.new("RGBA", (120, 80))
        base.paste(fit_image(Image.fromarray(one), (x2 - x1, y2 - y1), "Crop and resize"), (x1, y1))
        base.alpha_composite(kept.convert("RGBA"))
        theirs.append(np.asarray(base.convert("RGB")))
    value = psnr(ours, np.stack(theirs))
    print(f"Only masked, region {region}: PSNR {value:.1f} dB")
    assert value >= 40 and (ours[:, blurred == 0] == image[blurred == 0]).all()
    assert psnr(ours[:, mask > 0], np.broadcast_to(image[mask > 0], ours[:, mask > 0].shape)) < 30  # redrawn there
