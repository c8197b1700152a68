"""The SDXL refiner, end to end against diffusers' ensemble of experts (StableDiffusionXLPipeline with
denoising_end, then StableDiffusionXLImg2ImgPipeline with denoising_start on its latents) on the tiny
checkpoint and a random tiny refiner (its second text encoder alone, five size and aesthetic numbers);
the switch where A1111's "Refiner switch at" puts it, in the fused and the stepwise loop; the
parameters name it as A1111 does; a new switch compiles nothing; what cannot be is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reference import psnr
from sdxl_tpu import CompileCounter, RequestError, load_pipeline
from sdxl_tpu.a1111.infotext import parameters_text
from sdxl_tpu.generate.refining import refiner_switch
from sdxl_tpu.weights.errors import RefinerError
from sdxl_tpu.weights.refiner import load_refiner

SIZE, IMAGES = (64, 64), 2
PROMPT, NEGATIVE = "a lighthouse in a storm", "blurry"


@pytest.fixture(scope="module")
def refiner(tiny_refiner):
    return tiny_refiner


@pytest.fixture(scope="module")
def pipes(tiny_checkpoint, compile_cache, refiner):
    """The fused loop's pipeline and the stepwise one's (the switch falls inside a fused dispatch, or between two)."""
    return {stepwise: load_pipeline(tiny_checkpoint, dtype="float32", sizes=[SIZE], images_per_call=IMAGES,
                                    warmup=False, compile_cache=compile_cache, refiner=refiner, step_progress=stepwise)
            for stepwise in (False, True)}


@pytest.fixture(scope="module")
def pipe(pipes):
    return pipes[False]


def _theirs(tiny_checkpoint, refiner, steps, switch, latents, negative=NEGATIVE):
    from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline

    base = StableDiffusionXLPipeline.from_pretrained(tiny_checkpoint)
    finisher = StableDiffusionXLImg2ImgPipeline.from_pretrained(refiner, vae=base.vae, tokenizer_2=base.tokenizer_2,
                                                                scheduler=base.scheduler)
    # (None: an empty negative prompt, as diffusers takes one where force_zeros_for_empty_prompt applies)
    common = dict(prompt=PROMPT, negative_prompt=negative or None, num_inference_steps=steps, guidance_scale=5.0,
                  num_images_per_prompt=IMAGES)
    handed = base(**common, denoising_end=switch, latents=latents, height=SIZE[1], width=SIZE[0],
                  output_type="latent").images
    out = finisher(**common, image=handed, denoising_start=switch, output_type="np").images
    return np.round(out * 255).astype(np.uint8)


@pytest.mark.parametrize("steps, switch, negative, stepwise", [(5, 0.6, NEGATIVE, False), (6, 0.8, "", True)])
def test_refiner_equals_diffusers_ensemble(pipes, tiny_checkpoint, refiner, steps, switch, negative, stepwise):
    """(An empty negative prompt: zeros for the model, as force_zeros_for_empty_prompt says, and
    encoded for the refiner, whose model index says otherwise: as diffusers.)"""
    pipe = pipes[stepwise]
    latents = torch.randn(IMAGES, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    result = pipe.generate(PROMPT, negative, guidance_scale=5.0, steps=steps, size=SIZE, sampler="Euler",
                           latents=latents.numpy(), refiner_switch_at=switch)
    ours = np.stack([np.asarray(im) for im in result.images])
    value = psnr(ours, _theirs(tiny_checkpoint, refiner, steps, switch, latents, negative))
    alone = pipe.generate(PROMPT, negative, guidance_scale=5.0, steps=steps, size=SIZE, sampler="Euler",
                          latents=latents.numpy())
    unrefined = psnr(ours, np.stack([np.asarray(im) for im in alone.images]))
    print(f"refiner at {switch} of {steps} steps: {value:.1f} dB against diffusers, {unrefined:.1f} dB against "
          "the model alone")
    assert value >= 40
    assert unrefined < 40  # (the refiner ran: its last steps change the image, less than 40 dB from it)
    text = parameters_text(result.infos[0], pipe.stamp_for(result.infos[0]))
    assert f"RNG: JAX, Refiner: sdxl-tiny-refiner, Refiner switch at: {switch:g}," in text


def test_the_switch_is_where_a1111_and_diffusers_put_it():
    """By the timestep: the first step below (1 - switch) of the training steps (a two-row step whole)."""
    timesteps = np.array([999.0, 799, 599, 399, 199, 0])
    assert refiner_switch(timesteps, [1, 2, 3, 4, 5], 0.6, 1000) == 3
    assert refiner_switch(timesteps, [1, 2, 3, 4, 5], 0.0, 1000) == 0  # (t < 1000: every step)
    assert refiner_switch(timesteps, [2, 4, 6], 0.5, 1000) == 4
    assert refiner_switch(timesteps, [1, 2, 3, 4, 5], 1.0, 1000) == 5  # (never)


def test_a_new_switch_compiles_nothing_and_bad_ones_are_refused(pipe, tiny_checkpoint, tmp_path):
    latents = np.random.default_rng(0).standard_normal((IMAGES, 4, 8, 8)).astype(np.float32)
    run = lambda at: pipe.generate(PROMPT, steps=4, size=SIZE, latents=latents, refiner_switch_at=at)  # noqa: E731
    run(0.5)
    with CompileCounter() as counter:
        run(0.75)
    assert counter.compiles == 0 and counter.traces == 0
    unguided = [pipe.generate(PROMPT, steps=3, size=SIZE, latents=latents, guidance_scale=1.0, refiner_switch_at=at)
                for at in (0.5, None)]  # (the prompt's pass alone, as the model runs it: distilled models)
    assert psnr(*(np.stack([np.asarray(im) for im in r.images]) for r in unguided)) < 40
    for value, words in ((1.5, "Refiner switch at must be a number between 0 and 1"),
                         ("soon", "Refiner switch at must be a number")):
        with pytest.raises(RequestError, match=words):
            run(value)
    from sdxl_tpu.request.request import Request

    with pytest.raises(RequestError, match="^The refiner with a hires fix, ControlNet or an IP-Adapter is not"):
        Request.of(PROMPT, size=SIZE, sizes=[SIZE, (96, 96)], hires=True, hires_scale=1.5, refiner_switch_at=0.5)
    with pytest.raises(RefinerError, match="an SDXL base model, not a refiner"):
        load_refiner(tiny_checkpoint)
    with pytest.raises(RefinerError, match="no model_index.json"):  # (nor a Hub id)
        load_refiner(tmp_path)


def test_a_model_without_a_refiner_says_so(tiny_pipeline):
    with pytest.raises(RequestError, match="this server has no refiner"):
        tiny_pipeline.generate(PROMPT, steps=2, size=SIZE, refiner_switch_at=0.5)


def test_img2img_with_the_refiner_equals_diffusers(pipe, tiny_checkpoint, refiner):
    """From an image: diffusers' img2img pipeline to the switch (denoising_end; RNG CPU draws its
    VAE sample and noise as diffusers' generators do), the refiner from there on its latents."""
    from diffusers import StableDiffusionXLImg2ImgPipeline

    from images import picture
    from reference import SEED

    image, steps, strength, switch = picture(), 8, 0.75, 0.7
    result = pipe.generate(PROMPT, NEGATIVE, seed=SEED, guidance_scale=5.0, steps=steps, size=SIZE, sampler="Euler",
                           rng="CPU", image=image, strength=strength, refiner_switch_at=switch)
    base = StableDiffusionXLImg2ImgPipeline.from_pretrained(tiny_checkpoint)
    finisher = StableDiffusionXLImg2ImgPipeline.from_pretrained(refiner, vae=base.vae, tokenizer_2=base.tokenizer_2,
                                                                scheduler=base.scheduler)
    generators = [torch.Generator().manual_seed(SEED + i) for i in range(IMAGES)]
    common = dict(prompt=PROMPT, negative_prompt=NEGATIVE, num_inference_steps=steps, guidance_scale=5.0,
                  num_images_per_prompt=IMAGES, generator=generators)
    handed = base(**common, image=image, strength=strength, denoising_end=switch, output_type="latent").images
    theirs = finisher(**common, image=handed, denoising_start=switch, output_type="np").images
    value = psnr(np.stack([np.asarray(im) for im in result.images]), np.round(theirs * 255).astype(np.uint8))
    print(f"img2img at strength {strength}, refiner at {switch}: {value:.1f} dB against diffusers")
    assert value >= 40
