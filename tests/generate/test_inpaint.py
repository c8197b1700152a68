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

from images import block_mask, hostile_masks, picture
from reference import SCHEDULERS, SEED, psnr
from sdxl_tpu.generate.compiling.compilation import CompileCounter
from sdxl_tpu.request.errors import RequestError
from sdxl_tpu.imaging.mask import gaussian_blur, latent_mask, mask_input


@pytest.fixture(scope="module")
def reference_inpaint(tiny_checkpoint):
    from diffusers import StableDiffusionXLInpaintPipeline

    return StableDiffusionXLInpaintPipeline.from_pretrained(tiny_checkpoint)


@pytest.fixture(scope="module")
def reference_inpainting_unet(tiny_inpainting_checkpoint):
    from diffusers import StableDiffusionXLInpaintPipeline

    return StableDiffusionXLInpaintPipeline.from_pretrained(tiny_inpainting_checkpoint)


@pytest.mark.parametrize("unet, sampler, steps, strength", [
    ("base", "Euler", 6, 0.75), ("base", "Euler a", 5, 0.8), ("base", "DPM++ 2M Karras", 8, 0.6),
    ("base", "Euler", 6, 1.0),  # (diffusers' is_strength_max: the noise alone to start)
    ("inpainting", "Euler a", 5, 1.0), ("inpainting", "DPM++ 2M Karras", 8, 0.6)])
def test_inpainting_equals_diffusers(request, unet, sampler, steps, strength):
    """A base UNet, and an inpainting UNet (9 input channels: the latents, the mask, the masked
    image's latents, whose VAE sample diffusers draws third from each generator; no known latents
    re-imposed, and at full strength the image not encoded at all, as diffusers runs it)."""
    import diffusers

    names = ("tiny_pipeline", "reference_inpaint") if unet == "base" else ("tiny_inpainting_pipeline",
                                                                          "reference_inpainting_unet")
    tiny_pipeline, reference_inpaint = map(request.getfixturevalue, names)
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
    # only), and for a base UNet masked_image_latents given (else it draws a third sample, unused).
    unused = {"masked_image_latents": torch.zeros(4, 4, 8, 8)} if unet == "base" else {}
    ref = reference(prompt, negative_prompt=negative, image=[image] * 4, mask_image=[mask] * 4, strength=strength,
                    num_inference_steps=steps, guidance_scale=5.0, num_images_per_prompt=4, output_type="pil",
                    height=64, width=64, **unused,
                    generator=[torch.Generator().manual_seed(SEED + i) for i in range(4)]).images
    ref = [reference.image_processor.apply_overlay(mask, image, im) for im in ref]  # A1111's overlay, as ours
    ours = np.stack([np.asarray(im) for im in result.images])
    theirs = np.stack([np.asarray(im) for im in ref])
    inside = np.asarray(mask) > 0
    value = psnr(ours[:, inside], theirs[:, inside])
    print(f"{unet} UNet, {sampler}, {steps} steps, strength {strength}: PSNR {value:.1f} dB in the mask")
    assert value >= 40
    # Outside the mask, the starting image's pixels exactly; inside, new ones.
    assert (ours[:, ~inside] == np.asarray(image)[~inside]).all()
    assert psnr(ours[:, inside], np.broadcast_to(np.asarray(image)[inside], ours[:, inside].shape)) < 30


def test_an_inpainting_unet_makes_images_from_text_as_from_an_all_white_mask(tiny_inpainting_pipeline,
                                                                            reference_inpainting_unet):
    """From text alone an inpainting UNet is conditioned on a mask over everything and a blank
    image (A1111's txt2img conditioning): what diffusers makes of any image under a white mask at
    full strength."""
    white = Image.fromarray(np.full((64, 64), 255, np.uint8))
    result = tiny_inpainting_pipeline.generate("a red door", "blurry", seed=SEED, guidance_scale=5.0, steps=5,
                                               size=(64, 64), sampler="Euler", rng="CPU")
    ref = reference_inpainting_unet("a red door", negative_prompt="blurry", image=[picture()] * 4,
                                    mask_image=[white] * 4, strength=1.0, num_inference_steps=5, guidance_scale=5.0,
                                    num_images_per_prompt=4, output_type="np", height=64, width=64,
                                    generator=[torch.Generator().manual_seed(SEED + i) for i in range(4)]).images
    ours = np.stack([np.asarray(im) for im in result.images])
    assert "image_encoding" in result.timings  # (the blank image's latents)
    assert psnr(ours, (ref * 255).astype(np.uint8)) >= 40


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


def test_outpainting_repaints_what_resize_and_fill_adds(tiny_pipeline):
    """An image fitted inside the size (Resize and fill) with a mask of the size that covers the new
    bands (the page's "Mask the new area"): the image kept where the blurred mask is black, the
    bands redrawn; a mask of neither size, or Only masked with such a mask, is refused by size."""
    from sdxl_tpu.imaging.resize import fit_image, new_area_mask

    wide = picture(96, 48)  # 2:1 into a square: bands of 16 rows above and below
    mask = new_area_mask(wide.size, (64, 64))
    assert (mask[:16] == 255).all() and (mask[48:] == 255).all() and not mask[16:48].any()
    result = tiny_pipeline.generate("a beach", seed=5, steps=4, size=(64, 64), image=wide, strength=1.0,
                                    resize_mode="Resize and fill", mask_image=mask, masked_content="fill")
    fitted = np.asarray(fit_image(wide, (64, 64), "Resize and fill"))
    blurred = gaussian_blur(gaussian_blur(mask, 4, axis=1), 4, axis=0)
    for image in result.images:
        ours = np.asarray(image)
        assert ours.shape == (64, 64, 3) and (ours[blurred == 0] == fitted[blurred == 0]).all()
        assert psnr(ours[:8], fitted[:8]) < 30  # (the stretched edge rows, redrawn)
    with pytest.raises(RequestError, match=r"Mask is 32x32 pixels but the image is 96x48: .*\(or the size to make, "
                                           r"64x64"):
        tiny_pipeline.request("a beach", size=(64, 64), image=wide, mask=np.zeros((32, 32), np.uint8))
    with pytest.raises(RequestError, match="Only masked takes a mask of the image's own size, 96x48"):
        tiny_pipeline.request("a beach", size=(64, 64), image=wide, mask=mask, inpaint_area="Only masked")


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
    (dict(mask_image=np.zeros((64, 64), np.uint8), inpaint_area="Only masked"), "this mask marks nothing"),
    (dict(mask_image=block_mask(), inpaint_area="Only masked", mask_padding=257), "Only masked padding, pixels must"),
    (dict(mask_image=block_mask(), inpaint_area="all"), "Inpaint area 'all' is not available"),
    (dict(inpaint_area="Only masked"), "Inpaint area applies to a mask"),
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


def test_hostile_masks_are_refused_by_name_or_taken_as_masks():
    """Every hostile mask: a request whose mask is the image's, or a RequestError naming what is
    wrong (the mask, or the setting that came with it) in one line; nothing else."""
    from sdxl_tpu.request.request import Request

    cases = hostile_masks()
    assert len(cases) >= 300
    image, outcomes = picture(), {"taken": 0, "refused": 0}
    for name, mask, fields in cases:
        try:
            request = Request.of("a cat", size=(64, 64), image=image, mask=mask, **fields)
        except RequestError as e:
            outcomes["refused"] += 1
            message = str(e)
            named = ("Mask", "Inpaint area", "Only masked padding", "Masked content")
            assert message.startswith(named), (name, message)
            assert "\n" not in message and len(message) < 300 and "Traceback" not in message, (name, message)
        else:
            outcomes["taken"] += 1
            assert request.mask.shape == (64, 64) and request.mask.dtype == np.uint8, name
    assert outcomes["refused"] > 250 and outcomes["taken"] > 10, outcomes
