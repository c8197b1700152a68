"""An IP-Adapter in a call, end to end against diffusers' StableDiffusionXLPipeline with its
ip_adapter_image, on the tiny checkpoint with a random plain and a random plus adapter and a random
CLIP image encoder at the published 224 x 224: the images at 40 dB or more; a new image, scale,
start or end compiles nothing; a request's unit, as sd-webui-controlnet's API sends it, runs the
same image prompt; what cannot be is refused saying why."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from ip_adapter_files import adapter_state, write_adapter, write_image_encoder
from PIL import Image

from reference import psnr
from sdxl_tpu import CompileCounter, RequestError, load_pipeline
from sdxl_tpu.a1111.infotext import parameters_text
from sdxl_tpu.generate.control import ControlUnit
from sdxl_tpu.imaging.clip_image import clip_crop
from sdxl_tpu.request.load import LoadOptions
from sdxl_tpu.server.local_engine import LocalEngine
from sdxl_tpu.server.settings import Settings

SIZE, IMAGES, STEPS, HIRES = (64, 64), 2, 4, (96, 96)
PROMPT, NEGATIVE = "a lighthouse in a storm", "blurry"
EMBED = 24  # the random image encoder's projection (plain adapters take it); its hidden states are 32 wide


def _photo(seed: int, size=(300, 200)) -> Image.Image:
    """An image prompt of another size and shape than the call's (the encoder's crop is its centre)."""
    rng = np.random.default_rng(seed)
    image = np.zeros((size[1], size[0], 3), np.uint8)
    image[...] = rng.integers(0, 256, 3)
    image[40:160, 60 + 20 * seed:200] = rng.integers(0, 256, 3)
    return Image.fromarray(image)


@pytest.fixture(scope="module")
def files(tiny_checkpoint, tmp_path_factory):
    """diffusers' pipeline on the tiny checkpoint; a random image encoder and two adapters on disk."""
    from diffusers import StableDiffusionXLPipeline

    root = tmp_path_factory.mktemp("ip_adapters")
    base = StableDiffusionXLPipeline.from_pretrained(tiny_checkpoint)
    encoder = write_image_encoder(root / "image_encoder", image_size=224, projection_dim=EMBED)
    states = {kind: adapter_state(base.unet, kind == "plus", 32 if kind == "plus" else EMBED, seed=5)
              for kind in ("plain", "plus")}
    paths = {kind: write_adapter(state, root / f"ip-adapter-{kind}_sdxl.safetensors") for kind, state in states.items()}
    return base, encoder, states, paths, root / "image_encoder"


@pytest.fixture(scope="module")
def pipes(tiny_checkpoint, compile_cache, files):
    _, _, _, paths, encoder = files
    return {kind: load_pipeline(tiny_checkpoint, dtype="float32", sizes=[SIZE, HIRES], images_per_call=IMAGES,
                                warmup=False,
                                compile_cache=compile_cache, ip_adapter=path, image_encoder=encoder)
            for kind, path in paths.items()}


def _ours(pipe, latents, unit: ControlUnit | None, sampler="Euler"):
    request = pipe.request(PROMPT, NEGATIVE, guidance_scale=5.0, steps=STEPS, size=SIZE, sampler=sampler)
    result = pipe.run_images(request.images(IMAGES), latents=latents.numpy(), controls=[unit] if unit else [])
    return np.stack([np.asarray(im) for im in result.images])


def _theirs(files, kind, image, scale, latents, sampler="Euler"):
    import diffusers
    from diffusers import StableDiffusionXLPipeline
    from transformers import CLIPImageProcessor

    base, encoder, states, _, _ = files
    unet = copy.deepcopy(base.unet)
    unet._load_ip_adapter_weights([states[kind]], low_cpu_mem_usage=False)
    scheduler = base.scheduler if sampler == "Euler" else diffusers.DPMSolverMultistepScheduler.from_config(
        base.scheduler.config)
    pipeline = StableDiffusionXLPipeline(**{**base.components, "unet": unet, "scheduler": scheduler,
                                            "image_encoder": encoder, "feature_extractor": CLIPImageProcessor()})
    pipeline.set_ip_adapter_scale(scale)
    out = pipeline(PROMPT, negative_prompt=NEGATIVE, ip_adapter_image=image, num_inference_steps=STEPS,
                   guidance_scale=5.0, height=SIZE[1], width=SIZE[0], latents=latents, num_images_per_prompt=IMAGES,
                   output_type="np").images
    return np.round(out * 255).astype(np.uint8)


@pytest.mark.parametrize("kind, scale, sampler", [("plain", 0.7, "Euler"), ("plus", 1.2, "DPM++ 2M")])
def test_ip_adapter_equals_diffusers(pipes, files, kind, scale, sampler):
    pipe = pipes[kind]
    latents = torch.randn(IMAGES, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    image = _photo(0)
    unit = ControlUnit(pipe.ip_adapter, np.repeat(clip_crop(image)[None], IMAGES, axis=0), weight=scale)
    ours = _ours(pipe, latents, unit, sampler)
    value = psnr(ours, _theirs(files, kind, image, scale, latents, sampler))
    plain = psnr(ours, _ours(pipe, latents, None, sampler))
    print(f"{kind} IP-Adapter at {scale}, {sampler}: {value:.1f} dB against diffusers, {plain:.1f} dB against none")
    assert value >= 40
    assert plain < 30  # (the image prompt changed the images)


def test_image_scale_and_steps_do_not_recompile(pipes):
    pipe = pipes["plain"]
    latents = torch.randn(IMAGES, 4, 8, 8, generator=torch.Generator().manual_seed(4))
    first = _ours(pipe, latents, ControlUnit(pipe.ip_adapter, np.repeat(clip_crop(_photo(0))[None], IMAGES, 0)))
    with CompileCounter() as counter:
        other = _ours(pipe, latents, ControlUnit(pipe.ip_adapter, np.stack([clip_crop(_photo(i)) for i in (1, 2)]),
                                                 weight=0.4, start=0.25, end=0.75))
        off = _ours(pipe, latents, ControlUnit(pipe.ip_adapter, np.repeat(clip_crop(_photo(1))[None], IMAGES, 0),
                                               weight=0.0))
    assert counter.compiles == 0 and counter.traces == 0
    assert psnr(first, other) < 40  # (it did change)
    np.testing.assert_array_equal(off, _ours(pipe, latents, None))  # (scale 0: as if there were none)
    # A server's warm-up compiles the image prompt's programs with the rest.
    assert {"image_prompt", "denoise_ip"} <= set(pipe.programs_at()) and pipe.is_compiled(SIZE, ["denoise_ip"])


def test_a_request_unit_is_the_image_prompt(pipes):
    """sd-webui-controlnet's unit naming the IP-Adapter (its module names an image encoder) runs the
    image prompt as the ControlUnit does; its parameters say so; what cannot be is refused."""
    pipe = pipes["plus"]
    name, photo = pipe.ip_adapter, _photo(2, (180, 260))
    latents = np.random.default_rng(1).standard_normal((IMAGES, 4, 8, 8)).astype(np.float32)
    unit = {"model": name, "image": photo, "module": "ip-adapter_clip_sdxl_plus_vith", "weight": 0.8,
            "guidance_end": 0.5}
    request = pipe.request(PROMPT, NEGATIVE, seed=5, guidance_scale=5.0, steps=STEPS, size=SIZE, controlnet=[unit])
    ours = pipe.run(request, latents=latents)
    direct = pipe.run_images(request.images(IMAGES), latents=latents, controls=[
        ControlUnit(name, np.repeat(clip_crop(photo)[None], IMAGES, axis=0), weight=0.8, end=0.5)])
    assert psnr(np.stack([np.asarray(i) for i in ours.images]), np.stack([np.asarray(i) for i in direct.images])) > 80
    text = parameters_text(ours.infos[0], pipe.stamp_for(ours.infos[0]))
    assert f'ControlNet 0: "Module: ip-adapter_clip_sdxl_plus_vith, Model: {name}, Weight: 0.8' in text
    for bad, words in (({**unit, "module": "canny"}, "a ControlNet's preprocessor"),
                       ({**unit, "guess_mode": True}, "guess mode is a ControlNet's"),
                       ({**unit, "image": b"not an image"}, "ControlNet unit 0 image")):
        with pytest.raises(RequestError, match=words):
            pipe.request(PROMPT, steps=STEPS, size=SIZE, controlnet=[bad])
    with pytest.raises(RequestError, match="one IP-Adapter unit"):
        pipe.request(PROMPT, steps=STEPS, size=SIZE, controlnet=[unit, unit])


def test_the_image_prompt_guides_both_passes_of_a_hires_fix(pipes):
    """As sd-webui-controlnet's IP-Adapter does (its hr_option Both): the hires pass sees the image
    prompt too; a ControlNet with a hires fix is still refused."""
    pipe = pipes["plain"]
    unit = {"model": pipe.ip_adapter, "image": _photo(1), "weight": 0.9}
    run = lambda **more: pipe.run(pipe.request(PROMPT, NEGATIVE, seed=3, steps=3, size=SIZE, hires=True,  # noqa: E731
                                               hires_scale=1.5, hires_steps=2, **more))
    # A run's start says it compiles first while a program of either pass is missing: with the first
    # pass's run alone (at 64x64), still the hires pass's with the image prompt at 96x96.
    engine = LocalEngine(Settings(load=LoadOptions(model="tiny", sizes=[SIZE, HIRES])))
    engine.pipeline = pipe
    hires = lambda **more: pipe.request(PROMPT, NEGATIVE, seed=3, steps=3, size=SIZE, hires=True,  # noqa: E731
                                        hires_scale=1.5, hires_steps=2, controlnet=[unit], **more)
    pipe.run(pipe.request(PROMPT, NEGATIVE, seed=3, steps=3, size=SIZE, controlnet=[unit]))
    assert engine.waits_for_compile(hires()) and engine.waits_for_compile(hires(hires_upscaler="Latent"))
    guided, plain = run(controlnet=[unit]), run()
    assert not engine.waits_for_compile(hires()) and not engine.waits_for_compile(hires(hires_upscaler="Latent"))
    assert guided.images[0].size == HIRES and guided.infos[0].controls[0].model == pipe.ip_adapter
    assert psnr(np.stack([np.asarray(i) for i in guided.images]), np.stack([np.asarray(i) for i in plain.images])) < 30
