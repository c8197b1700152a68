"""The names a request or an option chooses from, and the rules between them: samplers, schedule
types, noise sources, the default model, the architectures. The tables behind each sampler's name
are sampler/'s."""

from __future__ import annotations

SDXL_BASE = "stabilityai/stable-diffusion-xl-base-1.0"  # the default model
ARCHITECTURES = ("tiny", "small", "sdxl")  # what weights/architectures.py builds, by name

# AUTOMATIC1111's names. "... Karras" is the old name of the sampler with Schedule type Karras
# (A1111 before 1.9); on the checkpoint's schedule it is diffusers' use_karras_sigmas.
SAMPLERS = ("Euler", "Euler a", "DPM++ 2M", "DPM++ 2M Karras", "DPM++ 2M SDE", "DPM++ 2M SDE Karras", "DPM++ SDE",
            "DPM++ SDE Karras", "DDIM", "LCM")

# Schedule types: "Checkpoint" is the checkpoint's own scheduler config as diffusers runs it (the
# default: diffusers' images, exactly); the others are A1111's (1.9 and later), on k-diffusion's
# conventions (kdiffusion.py), "Automatic" being each sampler's A1111 default.
SCHEDULES = ("Checkpoint", "Automatic", "Uniform", "Karras", "Exponential", "SGM Uniform")
DEFAULT_SCHEDULE = "Checkpoint"
# Where the noise comes from: JAX's generator on the device (fast, the default), or PyTorch's CPU
# generator as A1111's "CPU" source, ComfyUI and Fooocus draw it (torch_rng.py).
RNGS = ("JAX", "CPU")
DEFAULT_RNG = "JAX"

# Each sampler's schedule under "Automatic" (A1111's sampler options), and the k-diffusion update
# it runs; DDIM and LCM have only their own timesteps (diffusers').
_AUTOMATIC = {"Euler": "Uniform", "Euler a": "Uniform", "DPM++ 2M": "Karras", "DPM++ 2M Karras": "Karras",
              "DPM++ 2M SDE": "Exponential", "DPM++ 2M SDE Karras": "Karras", "DPM++ SDE": "Karras",
              "DPM++ SDE Karras": "Karras", "DDIM": "Checkpoint", "LCM": "Checkpoint"}


def resolve_schedule(sampler: str, schedule: str) -> str:
    """The schedule `sampler` runs on under Schedule type `schedule` ("Automatic" resolved), or
    ValueError naming a combination that does not exist."""
    auto = _AUTOMATIC[sampler]
    if schedule == "Automatic" or schedule == "Checkpoint":
        return auto if schedule == "Automatic" else "Checkpoint"
    if auto == "Checkpoint":
        raise ValueError(f"{sampler} runs on its own timesteps: choose Schedule type Checkpoint or Automatic, "
                         f"not {schedule}.")
    if sampler.endswith(" Karras") and schedule != "Karras":
        raise ValueError(f"{sampler} names its schedule (Karras): for Schedule type {schedule} choose "
                         f"{sampler.removesuffix(' Karras')}.")
    return schedule


def schedule_used(sampler: str | None, schedule: str) -> str:
    """The Schedule type that ran, as the parameters text and the answers name it: "Automatic"
    resolved for `sampler` (what A1111 writes too); `schedule` itself where it cannot be resolved
    (no sampler known)."""
    try:
        return resolve_schedule(sampler, schedule) if sampler else schedule
    except (KeyError, ValueError):
        return schedule


__all__ = ["ARCHITECTURES", "DEFAULT_RNG", "DEFAULT_SCHEDULE", "RNGS", "SAMPLERS", "SCHEDULES", "SDXL_BASE",
           "resolve_schedule", "schedule_used"]


# How the prompts' dynamic syntax is read ({a|b}, __wildcard__; a1111/dynamic_prompts.py), as
# sd-dynamic-prompts' switch and its combinatorial mode: not at all, each image drawing its own
# prompt from its seed, or the combinations in order.
PROMPT_MODES = ("Off", "Random", "Combinatorial")
DEFAULT_PROMPT_MODE = "Random"

# How a starting image is fitted to a compiled size (img2img): AUTOMATIC1111's resize modes (resize.py).
RESIZE_MODES = ("Just resize", "Crop and resize", "Resize and fill")
DEFAULT_RESIZE_MODE = RESIZE_MODES[0]  # A1111's
