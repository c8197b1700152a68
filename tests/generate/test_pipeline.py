"""The compiled pipeline: parity with diffusers end to end, no recompiles, seeds, errors."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from reference import psnr
from sdxl_tpu import CompileCounter, GenerationError, RequestError
from sdxl_tpu.request.fields import MAX_STEPS
from sdxl_tpu.a1111.infotext import parameters_text
from sdxl_tpu.request.names import RNGS, SAMPLERS, SCHEDULES, resolve_schedule
from sdxl_tpu.version import VERSION


def _images(result) -> np.ndarray:
    return np.stack([np.asarray(im) for im in result.images])


@pytest.fixture(scope="module")
def reference_pipeline(tiny_checkpoint):
    from diffusers import StableDiffusionXLPipeline

    return StableDiffusionXLPipeline.from_pretrained(tiny_checkpoint)


@pytest.mark.parametrize("steps, negative, guidance", [(1, "blurry, low quality", 5.0), (4, "ugly", 7.5),
                                                      (3, "", 5.0), (2, "text", 1.0), (3, "", 0.0)])
def test_images_equal_diffusers(tiny_pipeline, reference_pipeline, steps, negative, guidance):
    latents = torch.randn(4, 4, 8, 8, generator=torch.Generator().manual_seed(steps))
    prompt = "a photo of an astronaut riding a horse on the moon"
    ours = _images(tiny_pipeline.generate(prompt, negative, guidance_scale=guidance, steps=steps, size=(64, 64),
                                          latents=latents.numpy()))
    # diffusers zeroes the negative embeddings only for negative_prompt=None (our empty prompt).
    ref = reference_pipeline(prompt, negative_prompt=negative or None, num_inference_steps=steps,
                             guidance_scale=guidance, height=64, width=64, latents=latents,
                             num_images_per_prompt=4, output_type="np").images
    ref = np.round(ref * 255).astype(np.uint8)
    value = psnr(ours, ref)
    print(f"steps={steps} negative={negative!r} guidance={guidance}: PSNR {value:.1f} dB")
    assert value >= 40


SCHEDULERS = {"Euler": "EulerDiscreteScheduler", "Euler a": "EulerAncestralDiscreteScheduler",
              "DPM++ 2M": "DPMSolverMultistepScheduler", "DPM++ 2M Karras": "DPMSolverMultistepScheduler",
              "DPM++ SDE Karras": "DPMSolverSDEScheduler"}


@pytest.mark.parametrize("sampler", list(SCHEDULERS))
def test_every_sampler_equals_diffusers_end_to_end(tiny_pipeline, reference_pipeline, sampler, monkeypatch):
    """StableDiffusionXLPipeline with the same scheduler, switched as users do
    (`Scheduler.from_config(pipe.scheduler.config)`); for Euler a, diffusers is fed the noise our
    steps draw (each image's from its seed and the step index); DPM++ SDE's Brownian tree is replaced
    by the noise of each of our table rows (two model evaluations a step)."""
    import diffusers
    from diffusers.schedulers import scheduling_dpmsolver_sde, scheduling_euler_ancestral_discrete

    from sdxl_tpu.generate.sampler_update import step_noise

    steps, seed = 6, 100  # first-order, second-order and final DPM++ steps
    latents = torch.randn(4, 4, 8, 8, generator=torch.Generator().manual_seed(7))
    drawn = []

    def our_noise(shape, **kwargs):
        i = len(drawn)
        drawn.append(i)
        z = step_noise(np.arange(seed, seed + 4, dtype=np.uint32), np.int32(i), (shape[2], shape[3], shape[1]))
        return torch.from_numpy(np.asarray(z).transpose(0, 3, 1, 2).copy())

    monkeypatch.setattr(scheduling_euler_ancestral_discrete, "randn_tensor", our_noise)
    monkeypatch.setattr(scheduling_dpmsolver_sde, "BrownianTreeNoiseSampler",
                        lambda x, *args, **kwargs: lambda sigma, sigma_next: our_noise(x.shape))
    scheduler = getattr(diffusers, SCHEDULERS[sampler]).from_config(reference_pipeline.scheduler.config,
                                                                     use_karras_sigmas=sampler.endswith("Karras"))
    reference = diffusers.StableDiffusionXLPipeline(**{**reference_pipeline.components, "scheduler": scheduler})
    prompt = "a lighthouse in a storm"
    result = tiny_pipeline.generate(prompt, "blurry", seed=seed, guidance_scale=5.0, steps=steps, size=(64, 64),
                                    sampler=sampler, latents=latents.numpy())
    assert [i.sampler for i in result.infos] == [sampler] * 4
    ref = reference(prompt, negative_prompt="blurry", num_inference_steps=steps, guidance_scale=5.0, height=64,
                    width=64, latents=latents, num_images_per_prompt=4, output_type="np").images
    assert len(drawn) == {"Euler a": steps, "DPM++ SDE Karras": 2 * steps - 2}.get(sampler, 0)
    value = psnr(_images(result), np.round(ref * 255).astype(np.uint8))
    print(f"{sampler}: PSNR {value:.1f} dB")
    assert value >= 40


def test_unguided_calls_run_the_conditional_pass_alone(tiny_pipeline):
    """Guidance <= 1 for every image: the half-batch program; any image guided: the CFG one."""
    programs = tiny_pipeline.compiled((64, 64))
    calls = {"denoise": 0, "denoise_unguided": 0}
    originals = {name: programs[name] for name in calls}

    def counting(name):
        def run(*args):
            calls[name] += 1
            return originals[name](*args)
        return run

    try:
        for name in calls:
            programs[name] = counting(name)
        for guidance in (0.0, 1.0, [0.0, 1.0, 0.5, 1.0]):
            tiny_pipeline.generate("a cat", seed=1, guidance_scale=guidance, steps=2, size=(64, 64))
        assert calls == {"denoise": 0, "denoise_unguided": 6}
        tiny_pipeline.generate("a cat", seed=1, guidance_scale=[1.0, 1.0, 1.5, 0.0], steps=2, size=(64, 64))
        assert calls == {"denoise": 2, "denoise_unguided": 6}
    finally:
        programs.update(originals)
    # The unguided program's UNet batch is half the guided one's.
    shapes = {name: [v.shape for v in jax.tree.leaves(tiny_pipeline.trace(name, (64, 64)).jaxpr.in_avals)]
              for name in ("denoise", "denoise_unguided")}
    assert shapes["denoise"] == shapes["denoise_unguided"]  # the same arguments ...
    text = {name: str(tiny_pipeline.trace(name, (64, 64)).jaxpr) for name in ("denoise", "denoise_unguided")}
    assert "f32[8,8,8,4]" in text["denoise"] and "f32[8,8,8,4]" not in text["denoise_unguided"]  # ... half the batch


def test_nothing_recompiles_after_warmup(tiny_pipeline):
    long_prompt = "a very detailed painting of a castle " * 40  # cut after 3 chunks
    two_chunks = "a (very:1.2) detailed painting of a castle, " * 5  # and emphasis
    with CompileCounter() as counter:
        for i, (prompt, negative, steps, sampler) in enumerate([
            ("a cat", "", 1, "Euler"), ("a dog on a (beach:1.3)", "[blurry]", 2, "Euler a"),
            (long_prompt, long_prompt, 7, "DPM++ 2M"), (["a", "b", "c", "d"], ["", "x", "", "y"], MAX_STEPS, "Euler"),
            ("neon city BREAK rain", "rain", 13, "DPM++ 2M Karras"), ("a fox", "", 20, "Euler a"),
            (two_chunks, "", 3, "Euler"),
            ([two_chunks, "a", long_prompt, "((b))"], ["x", two_chunks, "", ""], 2, "Euler a"),
        ]):
            tiny_pipeline.generate(prompt, negative, seed=[i, 2**32 - 1, 0, 12345] if i % 2 else i * 1000,
                                   guidance_scale=[1.0, 3.5, 7.0, 12.0] if i % 2 else 5.0 + i, steps=steps,
                                   size=(64, 64) if i % 2 else "96x64", sampler=sampler)
        # Every sampler on every schedule type it runs on, with either noise, guided or not, both sizes.
        for i, sampler in enumerate(SAMPLERS):
            for j, schedule in enumerate(SCHEDULES):
                try:
                    resolve_schedule(sampler, schedule)
                except ValueError:
                    continue
                tiny_pipeline.generate("a cat", "dog", seed=i * 10 + j, guidance_scale=5.0 if (i + j) % 2 else 1.0,
                                       steps=1 + (i + j) % 4, size=(64, 64) if j % 2 else "96x64", sampler=sampler,
                                       schedule=schedule, rng=RNGS[(i + j) % 2])
    print(f"after warm-up: {counter.compiles} compilations, {counter.traces} traces")
    assert counter.compiles == 0 and counter.traces == 0


def test_size_not_compiled_is_refused_not_compiled(tiny_pipeline):
    with CompileCounter() as counter, pytest.raises(RequestError, match="Size 128x128 is not available; choose one "
                                                                        "of: 64x64, 96x64, 96x96"):
        tiny_pipeline.generate("a cat", size=(128, 128), steps=1)
    assert counter.compiles == 0


def test_each_image_depends_only_on_its_own_seed(tiny_pipeline):
    a = tiny_pipeline.generate("a red chair", "blurry", seed=100, steps=2, size=(64, 64))
    assert a.seeds == [100, 101, 102, 103]
    b = tiny_pipeline.generate("a red chair", "blurry", seed=[102, 7, 100, 8], steps=2, size=(64, 64))
    ia, ib = _images(a), _images(b)
    np.testing.assert_allclose(ib[0], ia[2], atol=1)
    np.testing.assert_allclose(ib[2], ia[0], atol=1)
    assert np.abs(ia[0].astype(int) - ia[1].astype(int)).mean() > 1  # different seeds, different images


def test_result_carries_images_seeds_parameters_and_timings(tiny_pipeline):
    steps_seen = []
    result = tiny_pipeline.generate(["a", "b", "c", "d"], "blurry", seed=2**32 - 2, guidance_scale=[1, 2, 3, 4],
                                    steps=3, size="96x64", progress=lambda i, n: steps_seen.append((i, n)))
    assert [im.size for im in result.images] == [(96, 64)] * 4
    assert result.seeds == [2**32 - 2, 2**32 - 1, 0, 1]
    assert [i.prompt for i in result.infos] == ["a", "b", "c", "d"]
    assert [i.guidance_scale for i in result.infos] == [1.0, 2.0, 3.0, 4.0]
    assert steps_seen == [(1, 3), (2, 3), (3, 3)]
    t = result.timings
    assert set(t) == {"text_encoding", "denoising", "decoding", "total"}
    assert t["total"] == pytest.approx(t["text_encoding"] + t["denoising"] + t["decoding"])
    text = parameters_text(result.infos[1], "tiny")
    assert text == ("b\nNegative prompt: blurry\nSteps: 3, Sampler: Euler, Schedule type: Checkpoint, CFG scale: 2, "
                    f"Seed: 4294967295, Size: 96x64, Model: tiny, RNG: JAX, Version: sdxl-tpu {VERSION}")
    # A random base seed: drawn anew per call, image i gets base + i (wrapping at 2**32).
    draws = [tiny_pipeline.generate("x", steps=1, size=(64, 64)).seeds for _ in range(3)]
    assert len({d[0] for d in draws}) == 3
    assert all(d == [(d[0] + i) % 2**32 for i in range(4)] for d in draws)


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=0), r"Steps must be a whole number between 1 and 50\."),
    (dict(steps=51), r"Steps must be a whole number between 1 and 50\."),
    (dict(steps=2.5), r"Steps must be a whole number between 1 and 50\."),
    (dict(seed=-2), r"Seed must be a whole number between -1 \(random\) and 4294967295\."),
    (dict(seed=2**32), r"Seed must be a whole number between -1 \(random\) and 4294967295\."),
    (dict(seed="7"), r"Seed must be a whole number between -1 \(random\) and 4294967295, got text\."),
    (dict(seed=[1, 2]), r"Seed: got 2 values for 4 images\."),
    (dict(guidance_scale=float("nan")), r"Guidance scale must be a finite number between 0 and 20\."),
    (dict(prompt=["a", "b"]), r"Prompt: got 2 values for 4 images\."),
    (dict(prompt=7), r"Prompt must be text, got a number\."),
    (dict(prompt=" "), r"Prompt is empty: please enter a prompt\."),
    (dict(size="64"), r"Size '64' is not available; choose one of: 64x64, 96x64, 96x96\."),
    (dict(latents=np.zeros((4, 4, 4, 4))), r"latents must have shape \(4, 4, 8, 8\), got \(4, 4, 4, 4\)\."),
])
def test_bad_requests_are_clear_errors(tiny_pipeline, kwargs, message):
    kwargs = {"prompt": "a cat", "size": (64, 64), "steps": 1, **kwargs}
    with pytest.raises(RequestError, match=f"^{message}$"):
        tiny_pipeline.generate(kwargs.pop("prompt"), **kwargs)


def test_non_finite_output_is_an_error_not_an_image(tiny_pipeline):
    """A poisoned decoder bias (NaN) is caught and names the seeds; swapping the parameters back
    gives exactly the images of before."""
    before = _images(tiny_pipeline.generate("a cat", seed=1, steps=1, size=(64, 64)))
    params = tiny_pipeline.params["vae"]
    poisoned = jax.tree.map(lambda x: x, params)
    bias = poisoned["decoder"]["conv_out"]["bias"]
    bias.set_value(jax.device_put(np.full(bias.get_value().shape, np.nan, np.float32), bias.get_value().sharding))
    tiny_pipeline.params["vae"] = poisoned
    try:
        with pytest.raises(GenerationError, match=r"non-finite values \(NaN/inf\) for seeds \[1, 2, 3, 4\]"):
            tiny_pipeline.generate("a cat", seed=1, steps=1, size=(64, 64))
    finally:
        tiny_pipeline.params["vae"] = params
    np.testing.assert_array_equal(_images(tiny_pipeline.generate("a cat", seed=1, steps=1, size=(64, 64))), before)


def test_seed_wraps_around_at_the_top_of_its_range(tiny_pipeline):
    """Base seed 2**32 - 1: image 1 gets seed 0 (not 2**32, which uint32 would silently turn into
    0 on the device while the caption said otherwise), and its pixels are those of seed 0."""
    top = tiny_pipeline.generate("a cat", seed=2**32 - 1, steps=1, size=(64, 64))
    assert top.seeds == [2**32 - 1, 0, 1, 2]
    zero = tiny_pipeline.generate("a cat", seed=0, steps=1, size=(64, 64))
    np.testing.assert_array_equal(_images(top)[1:], _images(zero)[:3])


def test_bfloat16_is_the_default_and_gives_finite_images(tiny_checkpoint, compile_cache):
    """(Not warmed up, a pipeline compiles what a call runs, once: text to image with guidance needs
    neither the image encoder, nor the loop from given latents, nor the unguided one.)"""
    import jax.numpy as jnp

    from sdxl_tpu import CompileCounter, load_pipeline

    pipe = load_pipeline(tiny_checkpoint, sizes=[(64, 64)], compile_cache=compile_cache, warmup=False)
    assert pipe.params["unet"]["conv_in"]["kernel"].get_value().dtype == jnp.bfloat16
    images = _images(pipe.generate("a cat", "blurry", seed=3, steps=2, size=(64, 64)))
    assert set(pipe.compiled((64, 64), ())) == {"encode", "noise", "denoise", "decode"}
    assert not pipe.is_compiled((64, 64)) and images.std() > 1
    with CompileCounter() as counter:
        pipe.generate("a dog", seed=4, steps=3, size=(64, 64))
    assert counter.compiles == 0


def test_loading_a_pipeline_leaves_the_process_compile_cache_alone(tiny_checkpoint):
    """The persistent cache is a process-wide setting: entry points set it, the library does not
    (unless asked with compile_cache=)."""
    from sdxl_tpu import load_pipeline

    before = jax.config.jax_compilation_cache_dir
    load_pipeline(tiny_checkpoint, dtype="float32", sizes=[(64, 64)], warmup=False)
    assert jax.config.jax_compilation_cache_dir == before


def test_compile_cache_can_be_moved_after_earlier_compiles(tmp_path):
    """JAX settles its persistent cache at a process's first compile with one; a pipeline loaded
    later with another directory (tests do this) must still write there."""
    import os
    import subprocess
    import sys

    script = ("import sys, jax, jax.numpy as jnp\n"
              "from sdxl_tpu.generate.compiling.compilation import enable_compile_cache\n"
              "enable_compile_cache(sys.argv[1] + '-first')\n"
              "jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()\n"
              "enable_compile_cache(sys.argv[1])\n"
              "jax.jit(lambda x: x * 3)(jnp.ones(5)).block_until_ready()\n")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "cache")], capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert any((tmp_path / "cache").iterdir()), "nothing was written to the persistent cache"


def test_compile_counter_counts():
    with CompileCounter() as counter:
        jax.jit(lambda x: x * 3 + 1)(np.arange(7.0))
    assert counter.compiles >= 1 and counter.traces >= 1


def test_noise_sources_mix_in_a_call_each_image_its_own(tiny_pipeline):
    """Images of RNG CPU and RNG JAX in one call (the batcher packs requests that differ only in
    it): each comes out as in a call of its own kind, ancestral step noise included."""
    kwargs = dict(seed=500, steps=3, size=(64, 64), sampler="Euler a", schedule="Uniform")
    cpu = tiny_pipeline.request("a red chair", "blurry", rng="CPU", **kwargs).images(4)
    jax_noise = tiny_pipeline.request("a red chair", "blurry", rng="JAX", **kwargs).images(4)
    alone = {rng: _images(tiny_pipeline.run_images(infos)) for rng, infos in (("CPU", cpu), ("JAX", jax_noise))}
    mixed = tiny_pipeline.run_images([cpu[0], jax_noise[1], cpu[2], jax_noise[3]])
    assert [i.rng for i in mixed.infos] == ["CPU", "JAX", "CPU", "JAX"]
    ours = _images(mixed)
    for i, rng in enumerate(["CPU", "JAX", "CPU", "JAX"]):
        np.testing.assert_allclose(ours[i], alone[rng][i], atol=1)
    assert np.abs(alone["CPU"][0].astype(int) - alone["JAX"][0].astype(int)).mean() > 1  # the sources differ
