"""Every sampler against diffusers' scheduler of the same name: the tables for 1..50 steps, and
the latents after each step given the same model outputs (and, for Euler a, the same noise)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sdxl_tpu.sampler.from_config import SCHEDULER_CONFIG, sampler_named, samplers_for
from sdxl_tpu.sampler.tables import MAX_ROWS
from sdxl_tpu.request.fields import MAX_STEPS
from sdxl_tpu.request.names import SAMPLERS

SPACINGS = ["leading", "trailing", "linspace"]


def reference(name: str, spacing: str, prediction_type: str = "epsilon"):
    """diffusers' scheduler for an A1111 sampler name, as one would switch SDXL base to it."""
    from diffusers import (DDIMScheduler, DPMSolverMultistepScheduler, DPMSolverSDEScheduler,
                           EulerAncestralDiscreteScheduler, EulerDiscreteScheduler, LCMScheduler)

    config = dict(SCHEDULER_CONFIG, timestep_spacing=spacing, prediction_type=prediction_type)
    sde = dict(algorithm_type="sde-dpmsolver++")
    return {"Euler": lambda: EulerDiscreteScheduler.from_config(config),
            "Euler a": lambda: EulerAncestralDiscreteScheduler.from_config(config),
            "DPM++ 2M": lambda: DPMSolverMultistepScheduler.from_config(config),
            "DPM++ 2M Karras": lambda: DPMSolverMultistepScheduler.from_config(config, use_karras_sigmas=True),
            "DPM++ 2M SDE": lambda: DPMSolverMultistepScheduler.from_config(config, **sde),
            "DPM++ 2M SDE Karras": lambda: DPMSolverMultistepScheduler.from_config(config, use_karras_sigmas=True,
                                                                                   **sde),
            "DPM++ SDE": lambda: DPMSolverSDEScheduler.from_config(config),
            "DPM++ SDE Karras": lambda: DPMSolverSDEScheduler.from_config(config, use_karras_sigmas=True),
            "DDIM": lambda: DDIMScheduler.from_config(config),
            "LCM": lambda: LCMScheduler.from_config(config),
            }[name]()


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("name", SAMPLERS)
def test_tables_match_diffusers(name, spacing):
    ref = reference(name, spacing)
    ours = sampler_named(name, dict(SCHEDULER_CONFIG, timestep_spacing=spacing))
    assert ours.name == name
    for steps in range(1, MAX_STEPS + 1):
        ref.set_timesteps(steps)
        timesteps, sigmas, init = ours.sigmas(steps)
        # DPM++ SDE's timesteps interleave each step's with its midpoint's; its sigmas repeat the inner ones.
        rows, ref_timesteps = ours.tables(steps).timesteps, ref.timesteps.numpy().astype(np.float32)
        assert len(rows) == len(ref_timesteps) == ours.step_ends(steps)[-1]
        per_step = slice(None, None, ours.rows_per_step)
        # (to a float32 ulp: DPM++ SDE Karras' fractional timesteps are float64 there)
        np.testing.assert_allclose(timesteps, ref_timesteps[per_step], rtol=1e-6, atol=0,
                                   err_msg=f"{name}, {spacing}, {steps} steps")
        np.testing.assert_allclose(rows, ref_timesteps, rtol=1e-6)
        np.testing.assert_array_equal(rows[per_step], timesteps)
        if not hasattr(ref, "sigmas"):  # DDIM and LCM work in timesteps and alphas only
            continue
        ref_sigmas = ref.sigmas.numpy()
        if ours.rows_per_step == 2:
            ref_sigmas = ref_sigmas[[0, *range(1, len(ref_sigmas), 2)]]
        np.testing.assert_allclose(sigmas, ref_sigmas, rtol=2e-6, err_msg=f"{name}, {spacing}, {steps} steps")
        np.testing.assert_allclose(init, float(ref.init_noise_sigma), rtol=2e-6)


def test_padded_tables_and_step_range():
    sched = sampler_named("Euler", SCHEDULER_CONFIG)
    t = sched.padded_tables(20)
    assert t.timesteps.shape == (MAX_ROWS,) and t.input_scale.shape == (MAX_ROWS,)
    assert t.update.shape == (MAX_ROWS, 6)
    assert t.timesteps[19] == 1.0 and t.timesteps[20] == 0.0 and not t.update[20:].any()
    for bad in (0, MAX_STEPS + 1):
        with pytest.raises(ValueError, match="steps must be between 1 and 50"):
            sched.tables(bad)


def test_unsupported_scheduler_configs_name_the_key():
    with pytest.raises(ValueError, match=r"prediction_type='v_prediction' \(supported: \('epsilon', 'sample'\)\)"):
        sampler_named("Euler", dict(SCHEDULER_CONFIG, prediction_type="v_prediction"))
    with pytest.raises(ValueError, match="solver_order=3"):
        samplers_for({"_class_name": "DPMSolverMultistepScheduler", "solver_order": 3})
    with pytest.raises(ValueError, match="use_karras_sigmas=True is supported with DPMSolverMultistepScheduler and "
                                         "DPMSolverSDEScheduler only"):
        samplers_for(dict(SCHEDULER_CONFIG, use_karras_sigmas=True))
    with pytest.raises(ValueError, match="no sampler 'Heun'"):
        sampler_named("Heun")
    # The checkpoint's own scheduler is the default sampler; an unknown one falls back to Euler.
    assert samplers_for(SCHEDULER_CONFIG)[1] == "Euler"
    assert samplers_for({"_class_name": "EulerAncestralDiscreteScheduler"})[1] == "Euler a"
    assert samplers_for({"_class_name": "DPMSolverMultistepScheduler",
                         "use_karras_sigmas": True})[1] == "DPM++ 2M Karras"
    assert samplers_for({"_class_name": "DPMSolverMultistepScheduler", "algorithm_type": "sde-dpmsolver++",
                         "use_karras_sigmas": True})[1] == "DPM++ 2M SDE Karras"
    assert samplers_for({"_class_name": "DPMSolverSDEScheduler", "use_karras_sigmas": True})[1] == "DPM++ SDE Karras"
    assert samplers_for({"_class_name": "LCMScheduler"})[1] == "LCM"
    assert samplers_for({"_class_name": "DDIMScheduler"})[1] == "DDIM"
    with pytest.warns(UserWarning, match="'UniPCMultistepScheduler' is not implemented"):
        assert samplers_for({"_class_name": "UniPCMultistepScheduler"})[1] == "Euler"


@pytest.mark.parametrize("spacing, prediction_type", [(s, "epsilon") for s in SPACINGS] + [("trailing", "sample")])
@pytest.mark.parametrize("name", SAMPLERS)
def test_steps_equal_diffusers(name, spacing, prediction_type, monkeypatch):
    """The jitted step on the padded tables, fed the same model outputs as diffusers'
    sampler_update.step (and for Euler a the same noise, injected into both): the latents agree after
    every step, through first- and second-order DPM++ steps and the final one; for a model that
    predicts the clean sample (SDXL-Lightning's 1-step UNet) as well as for one predicting noise."""
    import jax
    import torch
    from diffusers.schedulers import scheduling_dpmsolver_multistep, scheduling_euler_ancestral_discrete, scheduling_lcm

    from sdxl_tpu.generate import sampler_update

    if name in ("Euler a", "DPM++ SDE", "DPM++ SDE Karras") and prediction_type == "sample":
        # diffusers has no such mode; neither do we
        with pytest.raises(ValueError, match=f"{re.escape(name)} does not support prediction_type='sample'"):
            sampler_named(name, dict(SCHEDULER_CONFIG, prediction_type="sample"))
        assert name not in samplers_for(dict(SCHEDULER_CONFIG, prediction_type="sample"))[0]
        return
    rng = np.random.default_rng(0)
    noises = []
    for module in (scheduling_euler_ancestral_discrete, scheduling_dpmsolver_multistep, scheduling_lcm):
        monkeypatch.setattr(module, "randn_tensor",
                            lambda shape, **kw: torch.from_numpy(noises[-1].transpose(0, 3, 1, 2).copy()))
    for steps in (1, 2, 7, 20):
        ref = reference(name, spacing, prediction_type)
        ours = sampler_named(name, dict(SCHEDULER_CONFIG, timestep_spacing=spacing, prediction_type=prediction_type))
        assert ours.prediction_type == prediction_type
        ref.set_timesteps(steps)
        # DPM++ SDE draws from a Brownian tree it makes at its first step, unless it has a sampler already.
        ref.noise_sampler = lambda sigma, sigma_next: torch.from_numpy(noises[-1].transpose(0, 3, 1, 2).copy())
        noise = rng.standard_normal((2, 8, 8, 4)).astype(np.float32)
        tables = ours.padded_tables(steps)
        step_ends = ours.step_ends(steps)
        state = sampler_update.init(noise, np.array([1, 2], np.uint32), tables)
        ref_x = torch.from_numpy(noise.transpose(0, 3, 1, 2).copy()) * ref.init_noise_sigma
        step = jax.jit(sampler_update.step)
        for i, t in enumerate(ref.timesteps):
            x_in, timestep = sampler_update.model_input(state, i, tables)
            ref_in = ref.scale_model_input(ref_x, t).numpy()
            rel_in = np.linalg.norm(np.asarray(x_in).transpose(0, 3, 1, 2) - ref_in) / np.linalg.norm(ref_in)
            assert rel_in <= 1e-5, (name, spacing, steps, i, rel_in)
            assert float(timestep) == pytest.approx(float(t), rel=1e-6)  # (DPM++ SDE's midpoints: float64 there)
            eps = rng.standard_normal(noise.shape).astype(np.float32)
            noises.append(rng.standard_normal(noise.shape).astype(np.float32))
            x_before = state.x
            state = step(state, eps, np.int32(i), tables, noises[-1])
            out = ref.step(torch.from_numpy(eps.transpose(0, 3, 1, 2).copy()), t, ref_x,
                           **({"variance_noise": torch.from_numpy(noises[-1].transpose(0, 3, 1, 2).copy())}
                              if name.startswith("DPM++ 2M SDE") else {}))
            ref_x = out.prev_sample
            ours_x = np.asarray(state.x).transpose(0, 3, 1, 2)
            rel = np.linalg.norm(ours_x - ref_x.numpy()) / np.linalg.norm(ref_x.numpy())
            assert rel <= 1e-5, (name, spacing, prediction_type, steps, i, rel)
            # The state's data prediction is the step's estimate of the clean latents (what a
            # preview shows): diffusers' pred_original_sample, DPM++'s converted model output, LCM's denoised.
            if i + 1 not in step_ends:  # DPM++ SDE's first evaluation keeps x in m for the midpoint's
                np.testing.assert_array_equal(np.asarray(state.prediction), np.asarray(x_before))
                continue
            x0 = (ref.model_outputs[-1] if name.startswith("DPM++ 2M") else out.denoised if name == "LCM"
                  else out.pred_original_sample).numpy()
            ours_x0 = np.asarray(state.prediction).transpose(0, 3, 1, 2)
            rel = np.linalg.norm(ours_x0 - x0) / np.linalg.norm(x0)
            assert rel <= 1e-5, ("x0", name, spacing, prediction_type, steps, i, rel)


@pytest.mark.parametrize("name", SAMPLERS)
def test_img2img_steps_equal_diffusers(name, monkeypatch):
    """Starting from an image's latents as diffusers' StableDiffusionXLImg2ImgPipeline does (its
    get_timesteps, set_begin_index, the scheduler's add_noise at the first timestep): the same
    first latents and the same latents after every step that runs, given the same model outputs
    and noise, for strengths that leave a few steps, most and all of them; a multistep method's
    first step there is first order, as diffusers' is. Where int(strength * steps) is 0 (diffusers
    refuses) one step runs, as A1111 runs it."""
    import jax
    import torch
    from diffusers.schedulers import scheduling_dpmsolver_multistep, scheduling_euler_ancestral_discrete, scheduling_lcm

    from sdxl_tpu.generate import sampler_update

    rng = np.random.default_rng(1)
    noises = []
    for module in (scheduling_euler_ancestral_discrete, scheduling_dpmsolver_multistep, scheduling_lcm):
        monkeypatch.setattr(module, "randn_tensor",
                            lambda shape, **kw: torch.from_numpy(noises[-1].transpose(0, 3, 1, 2).copy()))
    nchw = lambda a: torch.from_numpy(np.asarray(a).transpose(0, 3, 1, 2).copy())
    ours = sampler_named(name)
    assert ours.first_step(1, 0.3) == 0 and ours.first_step(10, 0.05) == 9  # one step, not a refusal
    for steps, strength in ((7, 0.3), (20, 0.75), (9, 1.0), (4, 0.5)):
        ref = reference(name, "leading")
        ref.set_timesteps(steps)
        start = steps - min(int(steps * strength), steps)  # diffusers' get_timesteps
        assert ours.first_step(steps, strength) == start
        timesteps = ref.timesteps[start * ref.order:]
        if hasattr(ref, "set_begin_index"):  # (DDIM has none: it steps by its timesteps)
            ref.set_begin_index(start * ref.order)
        tables = ours.padded_tables(steps, "Checkpoint", strength)
        assert ours.step_ends(steps - start)[-1] == len(timesteps)
        image, noise = (rng.standard_normal((2, 8, 8, 4)).astype(np.float32) for _ in range(2))
        ref_x = ref.add_noise(nchw(image), nchw(noise), timesteps[:1])
        state = sampler_update.init(noise, np.array([1, 2], np.uint32), tables, image)
        np.testing.assert_allclose(np.asarray(state.x).transpose(0, 3, 1, 2), ref_x.numpy(), rtol=1e-5, atol=1e-5)
        ref.noise_sampler = lambda sigma, sigma_next: nchw(noises[-1])
        step = jax.jit(sampler_update.step)
        for i, t in enumerate(timesteps):
            x_in, timestep = sampler_update.model_input(state, i, tables)
            ref_in = ref.scale_model_input(ref_x, t).numpy()
            np.testing.assert_allclose(np.asarray(x_in).transpose(0, 3, 1, 2), ref_in, rtol=1e-5, atol=1e-5)
            assert float(timestep) == pytest.approx(float(t), rel=1e-6)
            eps = rng.standard_normal(noise.shape).astype(np.float32)
            noises.append(rng.standard_normal(noise.shape).astype(np.float32))
            state = step(state, eps, np.int32(i), tables, noises[-1])
            ref_x = ref.step(nchw(eps), t, ref_x, **({"variance_noise": nchw(noises[-1])}
                                                     if name.startswith("DPM++ 2M SDE") else {})).prev_sample
            ours_x = np.asarray(state.x).transpose(0, 3, 1, 2)
            rel = np.linalg.norm(ours_x - ref_x.numpy()) / np.linalg.norm(ref_x.numpy())
            assert rel <= 1e-5, (name, steps, strength, i, rel)


def test_ancestral_noise_depends_on_the_seed_and_step_only():
    import jax

    from sdxl_tpu.generate import sampler_update

    ours = sampler_named("Euler a")
    tables = ours.padded_tables(4)
    x = np.ones((3, 4, 4, 4), np.float32)
    eps = np.zeros_like(x)
    run = jax.jit(lambda seeds, i: sampler_update.step(sampler_update.init(x, seeds, tables), eps, i, tables).x)
    a = np.asarray(run(np.array([5, 6, 7], np.uint32), 1))
    b = np.asarray(run(np.array([7, 5, 9], np.uint32), 1))  # other slots, another batch
    np.testing.assert_array_equal(a[2], b[0])
    np.testing.assert_array_equal(a[0], b[1])
    assert not np.array_equal(a[0], a[1])
    assert not np.array_equal(a[0], np.asarray(run(np.array([5, 6, 7], np.uint32), 2))[0])  # another step
    # Euler (no noise) draws none: its update has n = 0 at every step.
    assert not sampler_named("Euler").tables(10).update[:, 3].any()


def test_the_denoising_loop_applies_every_step_in_order():
    """sampling.denoise runs the update of step i, for every i in order, inside the compiled loop:
    tables whose step i adds 10^i times the model output give the digits of the steps run."""
    import jax
    import jax.numpy as jnp

    from sdxl_tpu.generate import sampling
    from sdxl_tpu.generate import sampler_update
    from sdxl_tpu.sampler.tables import Tables

    steps = 3
    rows = np.zeros((MAX_ROWS, 6), np.float32)
    rows[:steps, 0] = 1.0  # a: keep x
    rows[:steps, 1] = 10.0 ** np.arange(steps)  # b: add 10^i eps
    tables = Tables(np.ones(MAX_ROWS, np.float32), np.ones(MAX_ROWS, np.float32), rows, np.float32(1.0))
    unet = lambda x, t, context, pooled, time_ids, context_lengths, cross_kv: jnp.ones_like(x)
    b = 2
    state = sampler_update.init(jnp.zeros((b, 2, 2, 4)), jnp.arange(b, dtype=jnp.uint32), tables)
    out = jax.jit(lambda s, t, n: sampling.denoise(unet, s, jnp.zeros((b, 2, 77, 8)), (), jnp.full((b, 2), 77),
                                                   jnp.zeros((b, 2, 4)), jnp.zeros((b, 6)), jnp.full((b,), 5.0), t,
                                                   n))
    np.testing.assert_allclose(np.asarray(out(state, tables, np.array([0, steps], np.int32)).x), 111.0)  # steps 0, 1, 2
    # A part of the steps (the host gives each step's noise one step at a time): steps 1 and 2 only.
    np.testing.assert_allclose(np.asarray(out(state, tables, np.array([1, steps], np.int32)).x), 110.0)
