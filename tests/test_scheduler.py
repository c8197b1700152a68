"""Euler discrete tables equal diffusers' EulerDiscreteScheduler for 1..50 steps."""

from __future__ import annotations

import numpy as np
import pytest

from sdxl_tpu.scheduler import MAX_STEPS, EulerDiscrete
from sdxl_tpu.tiny import SCHEDULER_CONFIG


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
