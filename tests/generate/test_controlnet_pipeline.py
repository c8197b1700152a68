"""ControlNets in a call, end to end against diffusers' StableDiffusionXLControlNetPipeline on the
tiny checkpoint and random ControlNets made from its UNet (as ControlNetModel.from_unet makes
them): one and two at once, their weights, start and end steps, guess mode, Euler and DPM++ 2M; and
nothing recompiles when those or the control image change."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from reference import psnr, write_controlnet
from sdxl_tpu import CompileCounter, load_pipeline
from sdxl_tpu.generate.control import ControlUnit

SIZE, IMAGES = (64, 64), 4
PROMPT, NEGATIVE = "a lighthouse in a storm", "blurry"


@pytest.fixture(scope="module")
def reference(tiny_checkpoint, tmp_path_factory):
    """diffusers' pipeline on the tiny checkpoint, and two random ControlNets written as diffusers does."""
    from diffusers import StableDiffusionXLPipeline

    base = StableDiffusionXLPipeline.from_pretrained(tiny_checkpoint)
    root = tmp_path_factory.mktemp("controlnets")
    nets = {name: write_controlnet(base.unet, root / name, seed) for seed, name in enumerate(("edges", "depth"))}
    return base, nets, root


@pytest.fixture(scope="module")
def pipe(tiny_checkpoint, compile_cache, reference):
    _, _, root = reference
    return load_pipeline(tiny_checkpoint, dtype="float32", sizes=[SIZE], images_per_call=IMAGES, warmup=False,
                         compile_cache=compile_cache, controlnets=[root / "edges", root / "depth"])


def _control_image(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = np.zeros((SIZE[1], SIZE[0], 3), np.uint8)
    image[rng.integers(0, SIZE[1], 300), rng.integers(0, SIZE[0], 300)] = 255  # sparse white "edges"
    return image


def _ours(pipe, units, sampler, steps, latents):
    result = pipe.generate(PROMPT, NEGATIVE, guidance_scale=5.0, steps=steps, size=SIZE, sampler=sampler,
                           latents=latents.numpy()) if not units else pipe.run_images(
        pipe.request(PROMPT, NEGATIVE, guidance_scale=5.0, steps=steps, size=SIZE, sampler=sampler).images(IMAGES),
        latents=latents.numpy(), controls=units)
    return np.stack([np.asarray(im) for im in result.images])


def _theirs(reference, names, images, weights, starts, ends, guess_mode, sampler, steps, latents):
    import diffusers
    from diffusers import StableDiffusionXLControlNetPipeline

    base, nets, _ = reference
    scheduler = base.scheduler if sampler == "Euler" else diffusers.DPMSolverMultistepScheduler.from_config(
        base.scheduler.config)
    controlnet = [nets[n] for n in names] if len(names) > 1 else nets[names[0]]
    pipeline = StableDiffusionXLControlNetPipeline(**{**base.components, "scheduler": scheduler},
                                                   controlnet=controlnet)
    one = len(names) == 1
    out = pipeline(PROMPT, negative_prompt=NEGATIVE, image=Image.fromarray(images[0]) if one else
                   [Image.fromarray(im) for im in images], num_inference_steps=steps, guidance_scale=5.0,
                   height=SIZE[1], width=SIZE[0], latents=latents, num_images_per_prompt=IMAGES, output_type="np",
                   controlnet_conditioning_scale=weights[0] if one else weights,
                   control_guidance_start=starts[0] if one else starts, control_guidance_end=ends[0] if one else ends,
                   guess_mode=guess_mode).images
    return np.round(out * 255).astype(np.uint8)


# (Three cases cover the samplers, one and two ControlNets, weights, start and end, guess mode: each
# case is some 15 s of the suite's CPU time.)
@pytest.mark.parametrize("sampler, names, weights, starts, ends, guess_mode", [
    ("Euler", ["edges"], [0.8], [0.0], [1.0], False),
    ("Euler", ["edges"], [0.9], [0.0], [0.6], True),
    ("DPM++ 2M", ["depth", "edges"], [1.2, 0.6], [0.2, 0.0], [1.0, 0.5], False),
])
def test_controlnets_equal_diffusers(pipe, reference, sampler, names, weights, starts, ends, guess_mode):
    steps = 5
    latents = torch.randn(IMAGES, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    images = [_control_image(i) for i in range(len(names))]
    units = [ControlUnit(n, np.repeat(im[None], IMAGES, axis=0), weight=w, start=s, end=e, guess_mode=guess_mode)
             for n, im, w, s, e in zip(names, images, weights, starts, ends, strict=True)]
    ours = _ours(pipe, units, sampler, steps, latents)
    theirs = _theirs(reference, names, images, weights, starts, ends, guess_mode, sampler, steps, latents)
    value = psnr(ours, theirs)
    plain = psnr(ours, _ours(pipe, [], sampler, steps, latents))
    print(f"{sampler} {names} weights {weights} steps {starts}-{ends} guess mode {guess_mode}: {value:.1f} dB "
          f"against diffusers, {plain:.1f} dB against no ControlNet")
    assert value >= 40
    assert plain < 30  # the ControlNets changed the images


def test_weights_steps_and_images_do_not_recompile(pipe):
    latents = np.random.default_rng(0).standard_normal((IMAGES, 4, 8, 8)).astype(np.float32)
    request = pipe.request(PROMPT, NEGATIVE, guidance_scale=5.0, steps=4, size=SIZE, sampler="Euler")
    run = lambda units: pipe.run_images(request.images(IMAGES), latents=latents, controls=units)  # noqa: E731
    first = run([ControlUnit("edges", np.repeat(_control_image(0)[None], IMAGES, axis=0))])  # (compiles)
    with CompileCounter() as counter:
        other = run([ControlUnit("edges", np.stack([_control_image(i) for i in range(IMAGES)]), weight=0.4,
                                 start=0.25, end=0.75, guess_mode=True)])
    assert counter.compiles == 0 and counter.traces == 0
    assert psnr(np.asarray(first.images[0]), np.asarray(other.images[0])) < 40  # (it did change)
    # A server's warm-up (the background one too) compiles each ControlNet's step with the rest.
    assert {"denoise+edges", "denoise+depth"} <= set(pipe.programs_at()) and pipe.is_compiled(SIZE, ["denoise+edges"])
    assert not {"denoise+depth+edges", "denoise_unguided+edges"} & set(pipe.programs_at())  # (when first asked for)


def test_unknown_controlnet_and_bad_steps_are_refused(pipe):
    from sdxl_tpu import RequestError

    request = pipe.request(PROMPT, steps=2, size=SIZE)
    image = np.repeat(_control_image(0)[None], IMAGES, axis=0)
    with pytest.raises(RequestError, match="ControlNet.*canny"):
        pipe.run_images(request.images(IMAGES), controls=[ControlUnit("canny", image)])
    with pytest.raises(ValueError, match="start below its end"):
        ControlUnit("edges", image, start=0.8, end=0.2)


def test_a_request_with_units_runs_them(pipe):
    """pipe.run(pipe.request(..., controlnet=[unit])): sd-webui-controlnet's unit fields, the image
    preprocessed (Canny) at the size, the same images as the unit given to run_images directly."""
    from sdxl_tpu.imaging.control_image import canny

    latents = np.random.default_rng(1).standard_normal((IMAGES, 4, 8, 8)).astype(np.float32)
    photo = np.zeros((SIZE[1], SIZE[0], 3), np.uint8)
    photo[16:48, 12:40] = 220
    unit = {"model": "edges", "image": photo, "module": "canny", "weight": 0.7, "guidance_end": 0.8,
            "threshold_a": 50, "threshold_b": 120}
    request = pipe.request(PROMPT, NEGATIVE, seed=5, guidance_scale=5.0, steps=3, size=SIZE, controlnet=[unit])
    ours = pipe.run(request, latents=latents)
    direct = pipe.run_images(request.images(IMAGES), latents=latents, controls=[
        ControlUnit("edges", np.repeat(canny(photo, 50, 120)[None], IMAGES, axis=0), weight=0.7, end=0.8)])
    assert psnr(np.stack([np.asarray(i) for i in ours.images]), np.stack([np.asarray(i) for i in direct.images])) > 80
