"""Inpainting: as diffusers' StableDiffusionXLInpaintPipeline runs a base UNet on the checkpoint's
schedule (same weights, the same noise: RNG CPU draws each image's VAE sample, then its initial
noise, then its step noise, the order diffusers draws them from a list of generators given one
image per generator and the masked image's latents), with the starting image's pixels kept outside the blurred
mask as A1111 keeps them; the mask read, blurred and fitted as A1111 does; nothing recompiled."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from sdxl_tpu.generate.compilation import CompileCounter
from sdxl_tpu.spec.errors import RequestError
from sdxl_tpu.spec.mask import gaussian_blur, latent_mask, mask_input
from test_img2img import SCHEDULERS, SEED, picture
from test_pipeline import psnr


def block_mask(width: int = 64, height: int = 64) -> Image.Image:
    """White (repaint) over a block aligned to the latents' 8-pixel cells, so diffusers' nearest
    downscale and A1111's bicubic-then-round agree on it."""
    mask = np.zeros((height, width), np.uint8)
    mask[16:48, 8:40] = 255
    return Image.fromarray(mask, "L")


@pytest.fixture(scope="module")
def reference_inpaint(tiny_checkpoint):
    from diffusers import StableDiffusionXLInpaintPipeline

    return StableDiffusionXLInpaintPipeline.from_pretrained(tiny_checkpoint)


@pytest.mark.parametrize("sampler, steps, strength", [("Euler", 6, 0.75), ("Euler a", 5, 0.8),
                                                      ("DPM++ 2M Karras", 8, 0.6)])
def test_inpainting_equals_diffusers(tiny_pipeline, reference_inpaint, sampler, steps, strength):
    import diffusers

    scheduler = getattr(diffusers, SCHEDULERS[sampler]).from_config(reference_inpaint.scheduler.config,
                                                                     use_karras_sigmas=sampler.endswith("Karras"))
    reference = diffusers.StableDiffusionXLInpaintPipeline(**{**reference_inpaint.components, "scheduler": scheduler})
    prompt, negative, image, mask = "a red door", "blurry", picture(), block_mask()
    counter = CompileCounter()
    with counter:
        result = tiny_pipeline.generate(prompt, negative, seed=SEED, guidance_scale=5.0, steps=steps, size=(64, 64),
                                        sampler=sampler, rng="CPU", image=image, strength=strength, mask_image=mask,
                                        mask_blur=0)
    assert counter.compiles == 0  # inpainting runs the img2img programs
    assert [(i.mask_blur, i.masked_content) for i in result.infos] == [(0, "original")] * 4
    # One image per generator (with one image diffusers samples its latents from the first generator
    # only), and masked_image_latents given (else it draws a third sample from each generator).
    ref = reference(prompt, negative_prompt=negative, image=[image] * 4, mask_image=[mask] * 4, strength=strength,
                    num_inference_steps=steps, guidance_scale=5.0, num_images_per_prompt=4, output_type="pil",
                    masked_image_latents=torch.zeros(4, 4, 8, 8), height=64, width=64,
                    generator=[torch.Generator().manual_seed(SEED + i) for i in range(4)]).images
    ref = [reference.image_processor.apply_overlay(mask, image, im) for im in ref]  # A1111's overlay, as ours
    ours = np.stack([np.asarray(im) for im in result.images])
    theirs = np.stack([np.asarray(im) for im in ref])
    inside = np.asarray(mask) > 0
    value = psnr(ours[:, inside], theirs[:, inside])
    print(f"{sampler}, {steps} steps, strength {strength}: PSNR {value:.1f} dB in the mask")
    assert value >= 40
    # Outside the mask, the starting image's pixels exactly; inside, new ones.
    assert (ours[:, ~inside] == np.asarray(image)[~inside]).all()
    assert psnr(ours[:, inside], np.broadcast_to(np.asarray(image)[inside], ours[:, inside].shape)) < 30


def test_blurred_mask_keeps_the_image_outside_it_and_masked_content_matters(tiny_pipeline):
    image, mask = picture(), block_mask()
    runs = {content: tiny_pipeline.generate("a red door", seed=3, steps=4, size=(64, 64), image=image, strength=0.9,
                                            mask_image=mask, masked_content=content)
            for content in ("original", "fill", "latent noise", "latent nothing")}
    blurred = gaussian_blur(gaussian_blur(np.asarray(mask), 4, axis=1), 4, axis=0)
    outside = blurred == 0
    for content, result in runs.items():
        ours = np.stack([np.asarray(im) for im in result.images])
        assert (ours[:, outside] == np.asarray(image)[outside]).all(), content
        assert result.infos[0].mask_blur == 4 and result.infos[0].masked_content == content
    first = np.asarray(runs["original"].images[0])
    for content in ("fill", "latent noise", "latent nothing"):  # each starts the masked area otherwise
        assert psnr(np.asarray(runs[content].images[0]), first) < 45, content


def test_mask_blur_is_opencvs_gaussian_blur():
    import cv2
    rng = np.random.default_rng(0)
    mask = (rng.random((70, 90)) > 0.7).astype(np.uint8) * 255
    for sigma in (1, 4, 16, 64):
        k = 2 * int(2.5 * sigma + 0.5) + 1
        ours = gaussian_blur(gaussian_blur(mask, sigma, axis=1), sigma, axis=0)
        theirs = cv2.GaussianBlur(cv2.GaussianBlur(mask, (k, 1), sigma), (1, k), sigma)
        # (OpenCV's 8-bit blur computes in fixed point: a level or three apart, on soft edges only)
        difference = np.abs(ours.astype(int) - theirs.astype(int))
        assert difference.max() <= 3 and difference.mean() < 0.6, sigma
        assert (ours[theirs == 0] <= 3).all() and (ours[theirs == 255] >= 252).all(), sigma


def test_masks_are_read_as_a1111_reads_them():
    # Transparency is the mask where there is some: opaque strokes repaint.
    rgba = np.zeros((16, 16, 4), np.uint8)
    rgba[4:8, 4:8] = (0, 0, 0, 255)
    read = np.asarray(mask_input(Image.fromarray(rgba, "RGBA"), (16, 16)))
    assert read[4:8, 4:8].min() == 255 and read.sum() == 16 * 255
    # Otherwise the grey levels: white repaints.
    grey = np.zeros((16, 16), np.uint8)
    grey[:, 8:] = 255
    np.testing.assert_array_equal(np.asarray(mask_input(grey, (16, 16))), grey)
    # The latents' mask: downscaled (bicubic) and rounded.
    np.testing.assert_array_equal(latent_mask(grey, 8), [[0, 1], [0, 1]])


@pytest.mark.parametrize("kwargs, message", [
    (dict(mask_image=np.zeros((32, 32), np.uint8)), "Mask is 32x32 pixels but the image is 64x64"),
    (dict(mask_image=b"<svg/>"), "Mask is not a PNG, JPEG or WebP image"),
    (dict(mask_image=block_mask(), mask_blur=65), "Mask blur must be"),
    (dict(mask_image=block_mask(), masked_content="noise"), "Masked content 'noise' is not available"),
    (dict(mask_blur=4), "Mask blur applies to a mask: give the mask too"),
    (dict(image=None, mask_image=block_mask(), strength=None), "Mask applies to a starting image"),
])
def test_bad_inpainting_inputs_are_clear_errors(tiny_pipeline, kwargs, message):
    kwargs = {"image": picture(), **kwargs}
    with pytest.raises(RequestError, match=message):
        tiny_pipeline.generate("a cat", steps=2, size=(64, 64), **kwargs)
