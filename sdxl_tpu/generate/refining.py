"""The refiner's host half: its size numbers with each pass's aesthetic score, and the row of a
call's tables where it takes over from the model (compiling/programs.py's REFINER_PROGRAMS run it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

AESTHETIC, NEGATIVE_AESTHETIC = 6.0, 2.5  # a refiner's aesthetic scores (diffusers' and A1111's defaults)


def refiner_time_ids(time_ids: np.ndarray, negative: float = NEGATIVE_AESTHETIC, positive: float = AESTHETIC
                     ) -> np.ndarray:
    """A refiner's size numbers (B, 2, 5) from SDXL's (B, 6): the size at first and the crop, then
    each pass's aesthetic score (diffusers' and A1111's defaults: 2.5 for the negative, 6 for the prompt)."""
    kept = np.repeat(time_ids[:, None, :4], 2, axis=1)
    scores = np.broadcast_to(np.array([negative, positive], np.float32)[None, :, None], (len(time_ids), 2, 1))
    return np.concatenate([kept, scores], axis=-1).astype(np.float32)


def refiner_switch(timesteps: np.ndarray, step_ends: Sequence[int], switch_at: float, train_steps: int) -> int:
    """The table row where the refiner takes over: the first step whose timestep is below
    (1 - switch_at) of the training steps, as diffusers' denoising_end/denoising_start split them and
    A1111's "Refiner switch at" does (by the timestep, not the step count)."""
    cutoff = round(train_steps * (1 - switch_at))
    for first in (0, *step_ends[:-1]):
        if timesteps[first] < cutoff:
            return first
    return step_ends[-1]
