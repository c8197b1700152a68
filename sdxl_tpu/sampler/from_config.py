"""Samplers by name, on a checkpoint's scheduler config (its scheduler/scheduler_config.json), as
diffusers' `<Scheduler>.from_config(pipe.scheduler.config)` makes them: which config values they
support, SDXL base 1.0's config (the default), and the checkpoint's own sampler."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

from ..request.configs import check_supported
from ..request.names import SAMPLERS
from .diffusers import DDIM, DPMSolverMultistep, DPMSolverSDE, EulerDiscrete, LCM, NOISE_ONLY, schedule_fields
from .tables import Sampler

SCHEDULER_CONFIG: dict[str, Any] = {  # as SDXL base 1.0 ships it
    "_class_name": "EulerDiscreteScheduler",
    "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False,
    "interpolation_type": "linear", "num_train_timesteps": 1000, "prediction_type": "epsilon",
    "sample_max_value": 1.0, "set_alpha_to_one": False, "skip_prk_steps": True, "steps_offset": 1,
    "timestep_spacing": "leading", "trained_betas": None, "use_karras_sigmas": False,
}

# Scheduler config keys (scheduler_config.json) whose value must be one of these, for the samplers
# (diffusers.py); diffusers' defaults among them.
SCHEDULER_VALUES = {
    "beta_schedule": ("scaled_linear", "linear"),
    "prediction_type": ("epsilon", "sample"),
    "timestep_spacing": ("leading", "trailing", "linspace"),
    "interpolation_type": ("linear",),
    "use_exponential_sigmas": (False, None),
    "use_beta_sigmas": (False, None),
    "use_lu_lambdas": (False, None),
    "use_flow_sigmas": (False, None),
    "final_sigmas_type": ("zero", None),
    "rescale_betas_zero_snr": (False, None),
    "trained_betas": (None,),
    "timestep_type": ("discrete", None),
    "algorithm_type": ("dpmsolver++", "sde-dpmsolver++"),
    "solver_order": (2,),
    "solver_type": ("midpoint",),
    "thresholding": (False,),
    "lower_order_final": (True,),
    "euler_at_final": (False,),
    "variance_type": (None,),
    "lambda_min_clipped": (-float("inf"),),
    "clip_sample": (False, None),
    "set_alpha_to_one": (False, True, None),
    "use_karras_sigmas": (False, True, None),  # (DPM-Solver's only: samplers_for says so)
    "noise_sampler_seed": (None,),
}


_CLASSES = {"EulerDiscreteScheduler": "Euler", "EulerAncestralDiscreteScheduler": "Euler a",
            "DPMSolverMultistepScheduler": "DPM++ 2M", "DPMSolverSDEScheduler": "DPM++ SDE", "DDIMScheduler": "DDIM",
            "LCMScheduler": "LCM"}


def check_config(cfg: dict[str, Any]) -> None:
    """Refuse a scheduler config with a value no sampler here implements (ValueError naming it)."""
    check_supported("scheduler", cfg, SCHEDULER_VALUES)


def sampler_named(name: str, cfg: dict[str, Any] | None = None) -> Sampler:
    """Sampler `name` (one of SAMPLERS) on the noise schedule of a scheduler config (a
    checkpoint's scheduler_config.json; default SDXL base's), as diffusers'
    `<Scheduler>.from_config(pipe.scheduler.config)` would make it."""
    cfg = dict(SCHEDULER_CONFIG if cfg is None else cfg)
    check_config(cfg)
    fields = schedule_fields(cfg)
    if name in NOISE_ONLY and fields["prediction_type"] == "sample":  # as diffusers: not implemented there
        scheduler = next(c for c, n in _CLASSES.items() if n == name.removesuffix(" Karras"))
        raise ValueError(f"{name} does not support prediction_type='sample' (diffusers' {scheduler} does not either)")
    # The method's own settings come from the name, not from another method's config (use_karras_sigmas,
    # algorithm_type).
    karras = name.endswith(" Karras")
    if name in ("Euler", "Euler a"):
        return EulerDiscrete(**fields, ancestral=name == "Euler a")
    if name.startswith("DPM++ 2M") and name in SAMPLERS:
        return DPMSolverMultistep(**fields, karras=karras, sde=" SDE" in name)
    if name in ("DPM++ SDE", "DPM++ SDE Karras"):
        return DPMSolverSDE(**fields, karras=karras)
    if name in ("DDIM", "LCM"):
        ddim = dict(fields, set_alpha_to_one=cfg.get("set_alpha_to_one", True))
        return DDIM(**ddim) if name == "DDIM" else LCM(
            **ddim, original_inference_steps=cfg.get("original_inference_steps", 50),
            timestep_scaling=cfg.get("timestep_scaling", 10.0))
    raise ValueError(f"no sampler {name!r}; samplers: {', '.join(SAMPLERS)}")


def samplers_for(cfg: dict[str, Any] | None = None) -> tuple[dict[str, Sampler], str]:
    """Every sampler on a scheduler config's noise schedule (those that support its prediction
    type), and the name of the config's own (its `_class_name`; Euler for classes not implemented
    here, with a warning)."""
    cfg = dict(cfg or {})
    check_config(cfg)
    default = _CLASSES.get(cfg.get("_class_name", "EulerDiscreteScheduler"))
    if default is None:
        warnings.warn(f"scheduler {cfg['_class_name']!r} is not implemented; the default sampler is Euler "
                      f"(available: {', '.join(SAMPLERS)})", stacklevel=2)
        default = "Euler"
    if default == "DPM++ 2M" and cfg.get("algorithm_type") == "sde-dpmsolver++":
        default = "DPM++ 2M SDE"
    if cfg.get("use_karras_sigmas"):
        if not default.startswith("DPM++"):
            raise ValueError(f"scheduler config: use_karras_sigmas=True is supported with DPMSolverMultistepScheduler "
                             f"and DPMSolverSDEScheduler only, not {cfg.get('_class_name')}")
        default += " Karras"
    names = [n for n in SAMPLERS if not (n in NOISE_ONLY and cfg.get("prediction_type") == "sample")]
    if default not in names:
        raise ValueError(f"scheduler config: {default} does not support prediction_type={cfg.get('prediction_type')!r}")
    return {name: sampler_named(name, cfg) for name in names}, default


def load_samplers(root: os.PathLike, timestep_spacing: str | None = None,
                  prediction_type: str | None = None) -> tuple[dict[str, Sampler], str]:
    """Every sampler on the checkpoint's noise schedule (scheduler/scheduler_config.json, else SDXL
    base's), and the name of the checkpoint's own scheduler, the default. `timestep_spacing` and
    `prediction_type` override the config's (SDXL-Lightning: "trailing"; its 1-step UNet: "sample")."""
    path = os.path.join(root, "scheduler", "scheduler_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            config = dict(json.load(f))
    else:
        config = dict(SCHEDULER_CONFIG)
    if timestep_spacing is not None:
        config["timestep_spacing"] = timestep_spacing
    if prediction_type is not None:
        config["prediction_type"] = prediction_type
    return samplers_for(config)
