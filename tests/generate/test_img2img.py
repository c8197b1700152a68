"""img2img: from an image, as diffusers' StableDiffusionXLImg2ImgPipeline runs it (same weights, the
same noise: RNG CPU draws each image's VAE sample, then its initial noise, then its step noise
from a generator seeded with its seed, the order diffusers draws them from a list of generators);
fitted to a compiled size by A1111's resize modes; and nothing recompiles for it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from images import picture
from reference import SCHEDULERS, SEED, psnr
from sdxl_tpu.generate.compiling.compilation import CompileCounter
from sdxl_tpu.request.errors import RequestError
from sdxl_tpu.imaging.resize import RESIZE_MODES, fit_image, nearest_size


@pytest.fixture(scope="module")
def reference_img2img(tiny_checkpoint):
    from diffusers import StableDiffusionXLImg2ImgPipeline

    return StableDiffusionXLImg2ImgPipeline.from_pretrained(tiny_checkpoint)


@pytest.mark.parametrize("sampler, steps, strength", [("Euler", 6, 0.5), ("Euler a", 5, 0.8),
                                                      ("DPM++ 2M Karras", 8, 0.6)])
def test_img2img_equals_diffusers(tiny_pipeline, reference_img2img, sampler, steps, strength):
    import diffusers

    scheduler = getattr(diffusers, SCHEDULERS[sampler]).from_config(reference_img2img.scheduler.config,
                                                                     use_karras_sigmas=sampler.endswith("Karras"))
    reference = diffusers.StableDiffusionXLImg2ImgPipeline(**{**reference_img2img.components, "scheduler": scheduler})
    prompt, negative, image = "a lighthouse in a storm", "blurry", picture()
    counter = CompileCounter()
    with counter:
        result = tiny_pipeline.generate(prompt, negative, seed=SEED, guidance_scale=5.0, steps=steps, size=(64, 64),
                                        sampler=sampler, rng="CPU", image=image, strength=strength)
    assert counter.compiles == 0  # its programs were compiled with the size's
    assert [i.strength for i in result.infos] == [strength] * 4
    ref = reference(prompt, negative_prompt=negative, image=image, strength=strength, num_inference_steps=steps,
                    guidance_scale=5.0, num_images_per_prompt=4, output_type="np",
                    generator=[torch.Generator().manual_seed(SEED + i) for i in range(4)]).images
    ours = np.stack([np.asarray(im) for im in result.images])
    value = psnr(ours, np.round(ref * 255).astype(np.uint8))
    print(f"{sampler}, {steps} steps, strength {strength}: PSNR {value:.1f} dB")
    assert value >= 40
    # The image matters: another starting image, another result (by far more than the rounding
    # between two implementations; the tiny model's random VAE keeps little of any image).
    other = tiny_pipeline.generate(prompt, negative, seed=SEED, guidance_scale=5.0, steps=steps, size=(64, 64),
                                   sampler=sampler, rng="CPU", image=picture().rotate(90), strength=strength)
    assert psnr(np.stack([np.asarray(im) for im in other.images]), ours) < value - 20


def test_strength_reaches_the_steps_run_and_the_parameters(tiny_pipeline):
    seen = []
    result = tiny_pipeline.generate("a cat", seed=1, steps=10, size=(64, 64), image=picture(), strength=0.3,
                                    progress=lambda step, steps: seen.append((step, steps)))
    assert seen[-1] == (3, 3)  # int(0.3 * 10) steps, as diffusers runs them
    seen.clear()
    tiny_pipeline.generate("a cat", seed=1, steps=10, size=(64, 64), image=picture(), strength=0.3,
                           schedule="Karras", progress=lambda step, steps: seen.append((step, steps)))
    assert seen[-1] == (4, 4)  # one more on A1111's schedule types, as A1111 runs them
    # Previews follow the steps that run: every step but the last of the three.
    previews = []
    tiny_pipeline.run(tiny_pipeline.request("a cat", seed=1, steps=10, size=(64, 64), strength=0.3,
                                            image=np.asarray(picture())), preview_every=1,
                      preview=lambda step, steps, images: previews.append((step, steps, len(images))))
    assert previews == [(1, 3, 4), (2, 3, 4)]
    from sdxl_tpu.a1111.infotext import parameters_text

    assert "Denoising strength: 0.3" in parameters_text(result.infos[0], "tiny")
    assert "Denoising strength" not in parameters_text(tiny_pipeline.run(tiny_pipeline.request(
        "a cat", seed=1, steps=1, size=(64, 64)), images=1).infos[0], "tiny")


@pytest.mark.parametrize("kwargs, message", [
    (dict(strength=1.5), "Denoising strength must be a number between 0 and 1"),
    (dict(strength="high"), "Denoising strength must be a number between 0 and 1, got text"),
    (dict(strength=0.5, image=None), "Denoising strength applies to a starting image"),
    (dict(resize_mode="Stretch"), "Resize mode 'Stretch' is not available; choose one of: Just resize, Crop and "
                                   "resize, Resize and fill."),
])
def test_bad_img2img_inputs_are_clear_errors(tiny_pipeline, kwargs, message):
    kwargs = {"image": picture(), **kwargs}
    with pytest.raises(RequestError, match=message):
        tiny_pipeline.generate("a cat", steps=2, size=(64, 64), **kwargs)


def test_resize_modes_as_a1111_fits_images():
    wide = picture(128, 64)  # 2:1 into a square
    just, crop, fill = (np.asarray(fit_image(wide, (64, 64), mode)) for mode in RESIZE_MODES)
    assert just.shape == crop.shape == fill.shape == (64, 64, 3)
    # Crop and resize covers the square: the image at height 64 (128x64), its middle 64 columns.
    scaled = np.asarray(wide.resize((128, 64), Image.Resampling.LANCZOS))
    np.testing.assert_array_equal(crop, scaled[:, 32:96])
    # Resize and fill: the image scaled to fit (64x32) in the middle, the bands its edge rows stretched.
    inner = np.asarray(wide.resize((64, 32), Image.Resampling.LANCZOS))
    np.testing.assert_array_equal(fill[16:48], inner)
    for band, edge in ((fill[:16], inner[:1]), (fill[48:], inner[-1:])):
        assert (band == band[:1]).all()  # each column one colour down the band
        assert np.abs(band.astype(int) - edge.astype(int)).max() <= 8  # (Lanczos at the edge: nearly its row)
    # Just resize stretches: the whole image, squeezed.
    np.testing.assert_array_equal(just, np.asarray(wide.resize((64, 64), Image.Resampling.LANCZOS)))


def test_the_size_nearest_an_images_aspect_ratio():
    sizes = [(1024, 1024), (1152, 896), (896, 1152), (1344, 768), (768, 1344)]
    assert nearest_size((4000, 3000), sizes) == (1152, 896)
    assert nearest_size((1080, 1920), sizes) == (768, 1344)
    assert nearest_size((500, 500), sizes) == (1024, 1024)
