"""Hires. fix: the first pass at its size, upscaled as A1111 upscales (its "Latent": torch's bilinear
interpolate; "Lanczos": the decoded image, then encoded), and a second pass from there at the
larger compiled size: exactly the img2img this project makes of the upscaled image (checked
against diffusers and k-diffusion in test_img2img/test_kdiffusion), as one call."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from upscaler_files import GENERAL

from sdxl_tpu.generate.call import call_passes, run_pass
from sdxl_tpu.generate.upscaling import ModelUpscalers
from sdxl_tpu.weights.upscalers import find_upscalers
from sdxl_tpu.request.errors import RequestError
from sdxl_tpu.imaging.hires import latent_upscale, scales_to
from sdxl_tpu.a1111.infotext import parameters_text
from sdxl_tpu.imaging.resize import fit_image



def test_latent_upscale_is_torchs_bilinear_interpolate():
    latents = np.random.default_rng(0).standard_normal((2, 8, 12, 4)).astype(np.float32)
    for height, width in ((12, 18), (16, 24), (13, 29), (8, 12)):
        theirs = torch.nn.functional.interpolate(torch.from_numpy(latents.transpose(0, 3, 1, 2)), size=(height, width),
                                                 mode="bilinear", antialias=False).numpy().transpose(0, 2, 3, 1)
        np.testing.assert_allclose(latent_upscale(latents, height, width), theirs, rtol=0, atol=1e-5)


def _images(result) -> np.ndarray:
    return np.stack([np.asarray(im) for im in result.images])


@pytest.fixture
def with_upscalers(tiny_pipeline, upscalers_folder):
    """tiny_pipeline with the upscaler model of upscalers_folder (its own again afterwards)."""
    found = find_upscalers(upscalers_folder)
    assert list(found.found) == [GENERAL] and list(found.skipped) == ["notes"]
    before, tiny_pipeline.upscalers = tiny_pipeline.upscalers, ModelUpscalers(found.found, found.skipped)
    yield tiny_pipeline
    tiny_pipeline.upscalers = before


@pytest.mark.parametrize("upscaler", ["Latent", "Lanczos", GENERAL])
def test_hires_fix_is_the_first_pass_upscaled_then_denoised_again(with_upscalers, upscaler):
    pipe, seen = with_upscalers, []
    request = pipe.request("a lighthouse in a storm", "blurry", seed=21, steps=4, size=(64, 64), rng="CPU",
                           hires=True, hires_scale=1.5, hires_upscaler=upscaler, hires_steps=6, hires_strength=0.5)
    result = pipe.run(request, progress=lambda step, steps: seen.append((step, steps)))
    assert [im.size for im in result.images] == [(96, 96)] * 4
    assert seen[-1] == (7, 7) and len(seen) == 7  # both passes' steps: 4, then int(0.5 * 6)
    text = parameters_text(result.infos[0], "tiny")
    assert "Size: 64x64," in text and "Denoising strength: 0.5, RNG: CPU" not in text
    assert f"Denoising strength: 0.5, Hires upscale: 1.5, Hires steps: 6, Hires upscaler: {upscaler}, RNG: CPU" in text
    # The same, by hand: the first pass, upscaled, then img2img at 96x96 from it.
    infos = [dataclasses.replace(i, hires=None) for i in request.images(4)]
    second = dict(size=(96, 96), steps=6, strength=0.5)
    if upscaler == "Latent":
        passes = [[dataclasses.replace(i, sampler=pipe.default_sampler, **kw) for i in infos] for kw in ({}, second)]
        first, _ = run_pass(pipe, passes[0], call_passes(pipe, passes[0])[0][1], decode=False)
        upscaled = latent_upscale(first, 12, 12)
        out, _ = run_pass(pipe, passes[1], call_passes(pipe, passes[1])[0][1], start_latents=upscaled)
        np.testing.assert_array_equal(_images(result), out)
    else:
        first = pipe.run(dataclasses.replace(request, hires=None))
        # Lanczos, or the model until the image is at least the size, then Lanczos (A1111's resize_image)
        starts = [fit_image(im, (96, 96)) if upscaler == "Lanczos" else pipe.upscalers[upscaler].resize(im, (96, 96))
                  for im in first.images]
        again = pipe.run_images([dataclasses.replace(i, **second) for i in infos],
                                init_images=np.stack([np.asarray(s) for s in starts]))
        np.testing.assert_array_equal(_images(result), _images(again))
    # Pipeline.generate takes the same fields, and makes the same images.
    if upscaler == "Latent":
        made = pipe.generate("a lighthouse in a storm", "blurry", seed=21, steps=4, size=(64, 64), rng="CPU",
                             hires=True, hires_scale=1.5, hires_upscaler=upscaler, hires_steps=6, hires_strength=0.5)
        np.testing.assert_array_equal(_images(made), _images(result))
    # Not simply the first pass enlarged: the second pass drew on it.
    plain = pipe.run(dataclasses.replace(request, hires=None))
    enlarged = np.stack([np.asarray(im.resize((96, 96), Image.Resampling.LANCZOS)) for im in plain.images])
    assert np.abs(_images(result).astype(int) - enlarged).mean() > 2


def test_hires_sizes_and_bad_inputs_are_clear(tiny_pipeline):
    assert scales_to((64, 64), tiny_pipeline.sizes) == [1.5]
    assert scales_to((512, 512), [(768, 768), (1024, 1024), (1024, 768), (2048, 2048)]) == [1.5, 2.0, 4.0]
    for kwargs, message in [
        (dict(hires=True, hires_scale=2), "Hires upscale 2 makes 128x128 from 64x64, which is not a size this "
                                          "server offers; from 64x64 these upscales reach one: 1.5."),
        (dict(hires=True, size=(96, 96)), "no upscale of 96x96 reaches one"),
        (dict(hires_steps=5), "Hires steps applies to a hires fix: turn Hires. fix on too."),
        (dict(hires=True, hires_scale=1.5, hires_upscaler="ESRGAN"),
         "Hires upscaler 'ESRGAN' is not available; choose one of: Latent, Lanczos."),
        (dict(hires=True, hires_scale=1.5, hires_strength=2), "Hires denoising strength must be a number between 0"),
        (dict(hires="yes"), "Hires. fix must be true or false, got text."),
        (dict(hires=True, hires_scale=1.5, image=np.zeros((64, 64, 3), np.uint8)),
         "Hires. fix applies to text to image, not to a starting image."),
    ]:
        with pytest.raises(RequestError, match=message.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
            tiny_pipeline.request("a cat", **{"size": (64, 64), **kwargs})
