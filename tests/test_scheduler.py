"""Euler discrete tables equal diffusers' EulerDiscreteScheduler for 1..50 steps."""

from __future__ import annotations

import numpy as np
import pytest

from sdxl_tpu.scheduler import MAX_STEPS, EulerDiscrete
from sdxl_tpu.presets import SCHEDULER_CONFIG


@pytest.mark.parametrize("spacing", ["leading", "trailing", "linspace"])
def test_tables_match_diffusers(spacing):
    from diffusers import EulerDiscreteScheduler

    config = dict(SCHEDULER_CONFIG, timestep_spacing=spacing)
    ref = EulerDiscreteScheduler.from_config(config)
    ours = EulerDiscrete.from_config(config)
    for steps in range(1, MAX_STEPS + 1):
        ref.set_timesteps(steps)
        timesteps, sigmas, init = ours.tables(steps)
        np.testing.assert_array_equal(timesteps, ref.timesteps.numpy(), err_msg=f"{spacing}, {steps} steps")
        np.testing.assert_allclose(sigmas, ref.sigmas.numpy(), rtol=2e-6, err_msg=f"{spacing}, {steps} steps")
        np.testing.assert_allclose(init, float(ref.init_noise_sigma), rtol=2e-6)


def test_padded_tables_and_step_range():
    sched = EulerDiscrete.from_config(SCHEDULER_CONFIG)
    t, s, _ = sched.padded_tables(20)
    assert t.shape == (MAX_STEPS,) and s.shape == (MAX_STEPS + 1,)
    assert t[19] == 1.0 and t[20] == 0.0 and s[20] == 0.0 and s[19] > 0
    for bad in (0, MAX_STEPS + 1):
        with pytest.raises(ValueError, match="steps must be between 1 and 50"):
            sched.tables(bad)


def test_unsupported_scheduler_config_names_key():
    with pytest.raises(ValueError, match="prediction_type='v_prediction'"):
        EulerDiscrete.from_config(dict(SCHEDULER_CONFIG, prediction_type="v_prediction"))


@pytest.mark.parametrize("spacing", ["leading", "trailing", "linspace"])
def test_steps_through_the_interface_equal_diffusers(spacing):
    """The sampler's jitted step on the padded tables, run through the same model outputs as
    diffusers' scheduler.step: the latents after every step agree."""
    import jax
    import torch
    from diffusers import EulerDiscreteScheduler

    config = dict(SCHEDULER_CONFIG, timestep_spacing=spacing)
    ref = EulerDiscreteScheduler.from_config(config)
    ours = EulerDiscrete.from_config(config)
    steps = 7
    ref.set_timesteps(steps)
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((2, 8, 8, 4)).astype(np.float32)
    tables = ours.padded_tables(steps)
    state = ours.init(noise, tables)
    ref_x = torch.from_numpy(noise.transpose(0, 3, 1, 2).copy()) * ref.init_noise_sigma
    step = jax.jit(ours.step)
    for i, t in enumerate(ref.timesteps):
        x_in, timestep = ours.model_input(state, i, tables)
        np.testing.assert_allclose(np.asarray(x_in).transpose(0, 3, 1, 2), ref.scale_model_input(ref_x, t).numpy(),
                                   rtol=1e-5, atol=1e-6)
        assert float(timestep) == float(t)
        eps = rng.standard_normal(noise.shape).astype(np.float32)
        state = step(state, eps, np.int32(i), tables)
        ref_x = ref.step(torch.from_numpy(eps.transpose(0, 3, 1, 2).copy()), t, ref_x).prev_sample
        ours_x = np.asarray(state.x).transpose(0, 3, 1, 2)
        rel = np.linalg.norm(ours_x - ref_x.numpy()) / np.linalg.norm(ref_x.numpy())
        assert rel <= 1e-5, (spacing, i, rel)


def test_the_denoising_loop_knows_only_the_interface():
    """sampling.denoise drives any Sampler: a sampler that counts in its state (as a multistep
    method carries its previous prediction) gets every step, in order, inside the compiled loop."""
    import jax
    import jax.numpy as jnp

    from sdxl_tpu import sampling
    from sdxl_tpu.scheduler import Sampler, State, Tables

    class Counting(Sampler):
        name = "counting"

        def tables(self, steps):
            return Tables(np.arange(steps, 0, -1, dtype=np.float32), np.linspace(1, 0, steps + 1, dtype=np.float32), 1.0)

        def init(self, noise, tables):
            return State(noise, jnp.zeros((), jnp.int32))

        def step(self, state, model_output, i, tables):
            return State(state.x + model_output, state.memory * 10 + i + 1)

    unet = lambda x, t, context, pooled, time_ids: jnp.full_like(x, 1.0) * t  # "predicts" its timestep
    sampler = Counting()
    tables = sampler.padded_tables(3)
    b = 2
    state = sampler.init(jnp.zeros((b, 2, 2, 4)), tables)
    out = jax.jit(lambda s, t, n: sampling.denoise(unet, sampler, s, jnp.zeros((b, 2, 77, 8)), jnp.zeros((b, 2, 4)),
                                                   jnp.zeros((b, 6)), jnp.full((b,), 5.0), t, n))(state, tables, 3)
    assert int(out.memory) == 123  # steps 1, 2, 3 in order
    np.testing.assert_allclose(np.asarray(out.x), 3 + 2 + 1)  # guidance of equal halves = the prediction
