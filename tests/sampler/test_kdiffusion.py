"""The samplers under A1111's schedule types against k-diffusion itself, as A1111 runs it: the
model wrapped as a discrete-eps denoiser on A1111's SDXL schedule, sigmas from A1111's schedule
types, first latents sigma_max x noise, the same injected noise for the stochastic samplers; and
on our side the project's compiled denoising loop, fed its step noise by the host as RNG CPU is."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kdiffusion_reference
from sdxl_tpu.generate import sampler_update, sampling
from sdxl_tpu.generate.denoising_loop import denoise_fused
from sdxl_tpu.sampler.from_config import sampler_named
from sdxl_tpu.sampler.sigmas import alphas_cumprod, schedule_sigmas, train_sigmas
from sdxl_tpu.request.names import SCHEDULES, resolve_schedule

METHODS = {"Euler": "sample_euler", "Euler a": "sample_euler_ancestral", "DPM++ 2M": "sample_dpmpp_2m",
           "DPM++ 2M SDE": "sample_dpmpp_2m_sde", "DPM++ SDE": "sample_dpmpp_sde"}
K_SCHEDULES = [s for s in SCHEDULES if s not in ("Checkpoint", "Automatic")]
SHAPE = (2, 8, 8, 4)  # (images, h, w, channels), NHWC as the loop holds latents


def toy_eps(x, t, lib):
    """A model both sides compute alike: nonlinear in the input, dependent on the timestep."""
    return 0.8 * lib.tanh(x) * lib.cos(t / 400.0) + 0.2 * x


@functools.cache
def our_loop():
    """sampling.denoise over a toy UNet, unguided, jitted once for every sampler and schedule."""
    unet = lambda x, t, context, pooled, time_ids, lengths, cross_kv: toy_eps(x, t, jnp)
    b = SHAPE[0]
    return jax.jit(lambda state, tables, bounds: sampling.denoise(
        unet, state, jnp.zeros((b, 2, 77, 8)), (), jnp.full((b, 2), 77), jnp.zeros((b, 2, 4)), jnp.zeros((b, 6)),
        jnp.ones((b,)), tables, bounds, guided=False))


class GivenNoise:
    """denoising.HostNoise as the fused loop uses it, handing over the test's own draws in order."""

    def __init__(self, draws, tables, rows: int):
        self.draws = iter(draws)
        self.noisy = [i for i in range(rows) if tables.update[i, 3] != 0]

    def refill(self, state, count: int):
        room = state.noise.shape[1]
        rows = [next(self.draws) for _ in range(count)] + [np.zeros(SHAPE, np.float32)] * (room - count)
        return state._replace(noise=np.stack(rows, axis=1), noise_slot=np.zeros(SHAPE[0], np.int32))


# The state's room for the host's step noise: small, so that a call's noisy rows come in several
# transfers, each a dispatch of the loop taking them one slot after another.
NOISE_ROWS = 3


def run_ours(name, schedule, steps, noise, step_noises, image=None, strength=None, keep=None):
    sampler = sampler_named(name)
    tables = sampler.padded_tables(steps, schedule, strength)
    state = sampler_update.init(noise, np.array([1, 2], np.uint32), tables, image, keep, noise_rows=NOISE_ROWS)
    state = state._replace(host_noise=np.ones(SHAPE[0], np.bool_))
    step_ends = sampler.step_ends(steps - sampler.first_step(steps, strength, schedule))
    state = denoise_fused(lambda s, first, end: our_loop()(s, tables, np.array([first, end], np.int32)), state,
                          step_ends, GivenNoise(step_noises, tables, step_ends[-1]), None)
    return np.asarray(state.x), tables


def run_kdiffusion(name, schedule, steps, noise, step_noises, image=None, strength=None, keep=None):
    """k-diffusion as A1111 runs it: from noise, or (`strength`) from an image's latents as its
    KDiffusionSampler.sample_img2img does (setup_img2img_steps, the sigmas' tail, x + noise * sigma);
    with `keep` (inpainting), every denoised estimate blended with the image's latents where the
    mask keeps them, as its CFGDenoiser does, and the final latents as its sample() does."""
    import torch

    sampling_k, external = kdiffusion_reference.load()
    seen = []

    def model(x, t):
        seen.append(t[0].item())
        return toy_eps(x, t[:, None, None, None], torch)

    denoiser = external.DiscreteEpsDDPMDenoiser(model, kdiffusion_reference.a1111_alphas_cumprod(), quantize=False)
    blend = lambda latents: latents
    if keep is not None:
        kept, init_latent = (torch.from_numpy(a.transpose(0, 3, 1, 2).copy()) for a in (keep, image))
        blend = lambda latents: latents * (1 - kept) + init_latent * kept
    call = lambda x, sigma, **kw: blend(denoiser(x, sigma, **kw))
    sigmas = kdiffusion_reference.a1111_sigmas(schedule, steps, denoiser)
    x = torch.from_numpy(noise.transpose(0, 3, 1, 2).copy()) * sigmas[0]
    if strength is not None:
        t_enc = int(min(strength, 0.999) * steps)
        sigmas = sigmas[steps - t_enc - 1:]
        x = torch.from_numpy(image.transpose(0, 3, 1, 2).copy()) + torch.from_numpy(
            noise.transpose(0, 3, 1, 2).copy()) * sigmas[0]
    draws = iter(step_noises)
    extra = {}
    if name in ("Euler a", "DPM++ 2M SDE", "DPM++ SDE"):
        extra["noise_sampler"] = lambda sigma, sigma_next: torch.from_numpy(next(draws).transpose(0, 3, 1, 2).copy())
    if name == "DPM++ 2M SDE" and len(sigmas) == 2:
        # k-diffusion 0.1.1 fails here (h_last = h before any h); its one step would be the denoised estimate.
        out = call(x, sigmas[:1].expand(x.shape[0]))
    else:
        out = getattr(sampling_k, METHODS[name])(call, x, sigmas, disable=True, **extra)
    return blend(out).numpy().transpose(0, 2, 3, 1), np.array(seen), sigmas.numpy()


def a1111_train_sigmas() -> np.ndarray:
    """SDXL's training sigmas as A1111 holds them (float64 betas)."""
    return train_sigmas(alphas_cumprod(1000, 0.00085, 0.012, "scaled_linear", betas_dtype=np.float64))


@pytest.mark.parametrize("schedule", K_SCHEDULES)
@pytest.mark.parametrize("name", list(METHODS))
def test_samplers_match_kdiffusion_on_a1111_schedules(name, schedule):
    rng = np.random.default_rng(7)
    for steps in (1, 2, 8, 20, 50):
        noise = rng.standard_normal(SHAPE).astype(np.float32)
        step_noises = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2 * steps)]
        ref, ref_timesteps, ref_sigmas = run_kdiffusion(name, schedule, steps, noise, step_noises)
        ours, tables = run_ours(name, schedule, steps, noise, step_noises)
        case = (name, schedule, steps)
        # The schedule itself: A1111's sigmas, and the fractional timesteps k-diffusion gives the model.
        np.testing.assert_allclose(schedule_sigmas(schedule, steps, a1111_train_sigmas()), ref_sigmas, rtol=2e-6,
                                   atol=1e-7, err_msg=str(case))
        # Every model evaluation's timestep (DPM++ SDE's midpoints among them), and none more.
        np.testing.assert_allclose(tables.timesteps[:len(ref_timesteps)], ref_timesteps, rtol=1e-5, atol=2e-4,
                                   err_msg=str(case))
        assert sampler_named(name).step_ends(steps)[-1] == len(ref_timesteps)
        assert tables.init_sigma == pytest.approx(float(ref_sigmas[0]), rel=1e-6)
        rel = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
        assert rel <= 1e-5, (case, rel)


@pytest.mark.parametrize("name", list(METHODS))
def test_img2img_matches_kdiffusion_as_a1111_runs_it(name):
    """From an image's latents: the steps A1111 runs for a denoising strength (one more than
    diffusers' int(strength * steps)), on the sigmas' tail, its first the image's noise, every
    method's first step there first order; on each kind of schedule type."""
    rng = np.random.default_rng(11)
    for schedule, steps, strength in (("Karras", 20, 0.75), ("Uniform", 8, 0.3), ("Exponential", 10, 1.0),
                                      ("SGM Uniform", 6, 0.05)):
        image, noise = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2))
        step_noises = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2 * steps)]
        ref, ref_timesteps, ref_sigmas = run_kdiffusion(name, schedule, steps, noise, step_noises, image, strength)
        ours, tables = run_ours(name, schedule, steps, noise, step_noises, image, strength)
        case = (name, schedule, steps, strength)
        assert len(ref_sigmas) - 1 == int(min(strength, 0.999) * steps) + 1, case  # the steps that ran
        assert tables.init_sigma == pytest.approx(float(ref_sigmas[0]), rel=1e-6) and tables.init_image == 1
        np.testing.assert_allclose(tables.timesteps[:len(ref_timesteps)], ref_timesteps, rtol=1e-5, atol=2e-4,
                                   err_msg=str(case))
        rel = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
        assert rel <= 1e-5, (case, rel)


@pytest.mark.parametrize("name", list(METHODS))
def test_inpainting_matches_kdiffusion_as_a1111_runs_it(name):
    """Inpainting under A1111's schedule types: the image's latents re-imposed on every denoised
    estimate (DPM++ SDE's midpoints too) where the mask keeps them, and on the final latents."""
    rng = np.random.default_rng(13)
    keep = np.zeros((*SHAPE[:3], 1), np.float32)
    keep[:, :, :4] = 1  # the left half kept
    for schedule, steps, strength in (("Karras", 12, 0.75), ("Exponential", 8, 1.0), ("Uniform", 6, 0.5)):
        image, noise = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2))
        step_noises = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2 * steps)]
        ref = run_kdiffusion(name, schedule, steps, noise, step_noises, image, strength, keep)[0]
        ours = run_ours(name, schedule, steps, noise, step_noises, image, strength, keep)[0]
        case = (name, schedule, steps, strength)
        np.testing.assert_array_equal(ours[:, :, :4], image[:, :, :4], err_msg=str(case))  # kept exactly
        rel = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
        assert rel <= 1e-5, (case, rel)


def test_karras_names_and_automatic_schedules():
    """"DPM++ 2M Karras" on Schedule type Karras (or Automatic) is DPM++ 2M on Karras' sigmas,
    the same tables; Automatic is each sampler's A1111 default; impossible combinations refused."""
    for old, new in (("DPM++ 2M Karras", "DPM++ 2M"), ("DPM++ 2M SDE Karras", "DPM++ 2M SDE"),
                     ("DPM++ SDE Karras", "DPM++ SDE")):
        for schedule in ("Karras", "Automatic"):
            a = sampler_named(old).padded_tables(20, resolve_schedule(old, schedule))
            b = sampler_named(new).padded_tables(20, "Karras")
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
    assert [resolve_schedule(n, "Automatic") for n in ("Euler", "Euler a", "DPM++ 2M", "DPM++ 2M SDE", "DPM++ SDE",
                                                       "DDIM", "LCM")] \
        == ["Uniform", "Uniform", "Karras", "Exponential", "Karras", "Checkpoint", "Checkpoint"]
    with pytest.raises(ValueError, match="DDIM runs on its own timesteps"):
        resolve_schedule("DDIM", "Karras")
    with pytest.raises(ValueError, match=re.escape("for Schedule type Exponential choose DPM++ 2M.")):
        resolve_schedule("DPM++ 2M Karras", "Exponential")
    # Under A1111's schedules the first latents are sigma_max x noise, not sqrt(sigma_max^2 + 1) x noise.
    tables = sampler_named("Euler").padded_tables(20, "Uniform")
    assert tables.init_sigma == pytest.approx(14.614641, rel=1e-6)


def test_a_sample_predicting_model_on_a1111_schedules():
    """A model that predicts the clean latents (SDXL-Lightning's 1-step UNet) runs the same
    k-diffusion update: its output converted to eps inside the tables."""
    from sdxl_tpu.sampler.from_config import SCHEDULER_CONFIG

    rng = np.random.default_rng(3)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    for name in ("Euler", "DPM++ 2M", "DPM++ 2M SDE"):
        eps_model = sampler_named(name).padded_tables(8, "Karras")
        x0_model = sampler_named(name, dict(SCHEDULER_CONFIG, prediction_type="sample")).padded_tables(8, "Karras")
        state = sampler_update.init(x, np.array([1, 2], np.uint32), eps_model)
        sigma = float(schedule_sigmas("Karras", 8, a1111_train_sigmas())[0])
        eps = rng.standard_normal(SHAPE).astype(np.float32)
        x0 = np.asarray(state.x) - sigma * eps  # the same prediction, said as the clean latents
        noise = np.zeros(SHAPE, np.float32)
        a = sampler_update.step(state, eps, 0, eps_model, noise)
        b = sampler_update.step(state, x0, 0, x0_model, noise)
        np.testing.assert_allclose(np.asarray(a.x), np.asarray(b.x), rtol=2e-4, atol=2e-5)
