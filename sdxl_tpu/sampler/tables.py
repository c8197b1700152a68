"""Samplers: host-side tables driving one jit-able update (generate/sampler_update.py).

Every sampler (diffusers.py: Euler, Euler a, DPM++ 2M and 2M SDE, DPM++ SDE, DDIM, LCM as
diffusers runs them on the checkpoint's scheduler config; kdiffusion.py: as k-diffusion runs them
on A1111's schedule types) makes, at step i, a linear combination of the latents x, the model's
noise prediction eps, the previous step's data prediction m (the current estimate of the clean
latents, which previews show), and fresh unit noise z:

    x' = a x + b eps + c m + n z        m' = p x + q eps

The coefficients depend only on the noise schedule and the step count. So a sampler is nothing
but its tables, computed on the host in float64 from diffusers' float32 schedules: timesteps,
the model-input scale, and (a, b, c, n, p, q) per row, padded to MAX_ROWS. A row is one model
evaluation: one per step, or two for a second-order step (DPM++ SDE evaluates at the midpoint
too; its first row keeps x in m for the second). Here: the tables and the base of every sampler.
One compiled program runs every sampler at every step count: choosing either per request never
recompiles, and the denoising loop knows no method's details.

Starting from an image (img2img) is the same loop on the schedule's tail: the tables of the steps
that run, from the first one the strength leaves (diffusers' get_timesteps on the checkpoint's
schedule, A1111's setup_img2img_steps on its schedule types), and the image's latents noised to
that step's level as the sampler's scheduler noises them (x = init_image * latents + init_sigma *
noise: variance exploding or preserving, by sampler).
"""

from __future__ import annotations

import abc
import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..request.fields import MAX_STEPS
from . import kdiffusion, sigmas

MAX_ROWS = 2 * MAX_STEPS  # room for a sampler of two model evaluations per step


class Tables(NamedTuple):
    timesteps: Any    # (rows,) model timesteps; zero padded to MAX_ROWS in the compiled loop
    input_scale: Any  # (rows,) the model sees input_scale[i] * x
    update: Any       # (rows, 6): a, b, c, n, p, q of row i (see the module docstring)
    init_sigma: Any   # () the initial latents are init_sigma * unit noise (+ init_image * an image's latents)
    init_image: Any = np.float32(1.0)  # () an image's latents' share of the initial latents (img2img)
    # (rows, 5) inpainting's known latents L, re-imposed where the mask keeps the image (None: never):
    # after row i, where x_blend: x' = L x_image + z0 x_noise there (z0: the initial noise; diffusers'
    # add_noise at the next step); before it, where d_v != 0: the model's denoised estimate
    # d_u x + d_v eps made L there (A1111's CFGDenoiser blends it so).
    known: Any = None  # columns: x_image, x_noise, x_blend, d_u, d_v


# -- the host half: one class per family of samplers ---------------------------------------------

@dataclass(frozen=True)
class Sampler(abc.ABC):
    """A sampler is its tables, on a noise schedule (the fields, as in diffusers' scheduler
    configs). `prediction_type` is what the model predicts: "epsilon" (the noise, SDXL) or
    "sample" (the clean latents, as SDXL-Lightning's 1-step UNet does); the tables turn either
    into eps."""

    num_train_timesteps: int = 1000
    beta_start: float = 0.00085
    beta_end: float = 0.012
    beta_schedule: str = "scaled_linear"
    timestep_spacing: str = "leading"
    steps_offset: int = 1
    prediction_type: str = "epsilon"

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """What image parameters call it (AUTOMATIC1111's name)."""

    @property
    def kdiffusion_method(self) -> str | None:
        """Its k-diffusion function (kdiffusion.METHODS), for A1111's schedule types; None: it runs
        on its own timesteps only."""
        return None

    #: model evaluations (table rows) per step but the last, which goes to sigma 0 in one
    rows_per_step = 1

    def step_ends(self, steps: int) -> tuple[int, ...]:
        """For each of `steps` steps, the number of rows run when it is complete."""
        k = self.rows_per_step
        return tuple(k * i for i in range(1, steps)) + (k * (steps - 1) + 1,)

    @abc.abstractmethod
    def sigmas(self, steps: int) -> tuple[np.ndarray, np.ndarray, float]:
        """(timesteps, sigmas ending in 0, init sigma) as diffusers' scheduler has them after
        set_timesteps(steps): float32, unpadded; sigmas in Karras' (variance exploding) terms."""

    @abc.abstractmethod
    def tables(self, steps: int, start: int = 0) -> Tables:
        """Tables for steps `start` to `steps` of a `steps`-step schedule, step_ends(steps - start)[-1]
        rows (host, float32, unpadded); a multistep method's first step there is first order, as its
        scheduler makes it after set_begin_index."""

    @abc.abstractmethod
    def noising(self, steps: int, start: int) -> tuple[float, float]:
        """(image, noise): how the scheduler puts clean latents at step `start`'s noise level,
        image * latents + noise * unit noise (diffusers' add_noise at timesteps[start])."""

    def kdiffusion_tables(self, steps: int, schedule: str, start: int = 0) -> Tables:
        """Tables for steps `start` to `steps` of its k-diffusion function on A1111's Schedule type
        `schedule` (Uniform, Karras, Exponential, SGM Uniform), on this noise schedule (host,
        unpadded): the function runs on the sigmas' tail, as A1111's img2img gives it."""
        if self.kdiffusion_method is None:
            raise ValueError(f"{self.name} runs on its own timesteps only, not on Schedule type {schedule}")
        self._check_steps(steps)
        # A1111's training sigmas: its betas in float64 (sgm's LegacyDDPMDiscretization).
        train = sigmas.train_sigmas(sigmas.alphas_cumprod(self.num_train_timesteps, self.beta_start, self.beta_end,
                                                          self.beta_schedule, betas_dtype=np.float64))
        timesteps, scale, update, init, to_eps = kdiffusion.tables(self.kdiffusion_method, schedule, steps, train,
                                                                   start)
        # Inpainting: every row's denoised estimate, x - sigma eps (or the model's own for a sample-
        # predicting one), takes the known latents; after the last, the latents do (A1111's sample()).
        known = np.zeros((len(update), 5), np.float32)
        if self.prediction_type == "epsilon":
            known[:, 3], known[:, 4] = 1.0, -1 / to_eps[0]
        else:
            known[:, 3], known[:, 4] = 0.0, 1.0
        known[-1, :3] = (1.0, 0.0, 1.0)
        return Tables(timesteps, scale, self._predicting(update, to_eps).astype(np.float32), init, known=known)

    def first_step(self, steps: int, strength: float | None, schedule: str = "Checkpoint") -> int:
        """The step a call starts at: 0 from noise (strength None), else what an image's denoising
        strength leaves: diffusers' get_timesteps on the checkpoint's schedule (int(strength *
        steps) steps, at least one), A1111's setup_img2img_steps on its schedule types (one more)."""
        if strength is None:
            return 0
        if not 0 <= strength <= 1:
            raise ValueError(f"denoising strength must be between 0 and 1, got {strength}")
        if schedule == "Checkpoint":
            return steps - max(1, min(int(steps * strength), steps))
        return steps - int(min(strength, 0.999) * steps) - 1

    # asked for on every request; a few per sampler
    @functools.lru_cache(maxsize=8 * MAX_STEPS)  # noqa: B019 (samplers are few, frozen and live as long as the process)
    def padded_tables(self, steps: int, schedule: str = "Checkpoint", strength: float | None = None) -> Tables:
        """The tables padded to MAX_ROWS, as the compiled loop takes them (read-only: shared), on
        the checkpoint's schedule or A1111's Schedule type `schedule` (resolved: not Automatic); with
        a denoising `strength`, of the steps an image's denoising runs (first_step onwards), its
        latents noised to the first one's level."""
        start = self.first_step(steps, strength, schedule)
        t = self.tables(steps, start) if schedule == "Checkpoint" else self.kdiffusion_tables(steps, schedule, start)
        if strength is not None and schedule == "Checkpoint":
            image, noise = self.noising(steps, start)
            t = t._replace(init_image=image, init_sigma=noise)
        step_ends = self.step_ends(steps - start)
        rows = step_ends[-1]
        assert len(t.update) == rows, (self.name, steps, start, len(t.update))
        timesteps, scale = np.zeros(MAX_ROWS, np.float32), np.zeros(MAX_ROWS, np.float32)
        update, known = np.zeros((MAX_ROWS, 6), np.float32), np.zeros((MAX_ROWS, 5), np.float32)
        timesteps[:rows], scale[:rows], update[:rows] = t.timesteps, t.input_scale, t.update
        if t.known is not None:
            known[:rows] = t.known
        else:  # diffusers' inpainting: after each step, the known latents noised to the next step's level
            for k, end in enumerate(step_ends):
                after = start + k + 1
                known[end - 1, :3] = (*self.noising(steps, after), 1.0) if after < steps else (1.0, 0.0, 1.0)
        for array in (timesteps, scale, update, known):
            array.setflags(write=False)
        return Tables(timesteps, scale, update, np.float32(t.init_sigma), np.float32(t.init_image), known)

    def alphas_cumprod(self) -> np.ndarray:
        """alpha-bar of each training timestep, float32, as diffusers computes it."""
        return sigmas.alphas_cumprod(self.num_train_timesteps, self.beta_start, self.beta_end, self.beta_schedule)

    def train_sigmas(self) -> np.ndarray:
        """The noise level of each training timestep, float32, as diffusers computes it."""
        return sigmas.train_sigmas(self.alphas_cumprod())

    def _tail(self, t: Tables, start: int) -> Tables:
        """The rows of steps `start` onwards, for a method whose rows do not depend on the steps before."""
        first = start * self.rows_per_step
        return t._replace(timesteps=t.timesteps[first:], input_scale=t.input_scale[first:], update=t.update[first:])

    def _predicting(self, update: np.ndarray, to_eps: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Update coefficients for this model's prediction: with eps = u x + v output for a
        sample-predicting model (`to_eps`: u, v per step), x' = a x + b eps + ... becomes
        (a + b u) x + (b v) output + ..., and m' = p x + q eps likewise."""
        if self.prediction_type == "epsilon":
            return update
        (u, v), out = to_eps, update.copy()
        a, b, p, q = update[:, 0], update[:, 1], update[:, 4], update[:, 5]
        out[:, 0], out[:, 1], out[:, 4], out[:, 5] = a + b * u, b * v, p + q * u, q * v
        return out

    def _check_steps(self, steps: int) -> None:
        if not 1 <= steps <= MAX_STEPS:
            raise ValueError(f"steps must be between 1 and {MAX_STEPS}, got {steps}")


__all__ = ["MAX_ROWS", "Sampler", "Tables"]
