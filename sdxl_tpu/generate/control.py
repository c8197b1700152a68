"""ControlNets' host half: what a call asks of each (its control images, weight, the steps it acts
on, guess mode) and the table of factors the device indexes by step (sampling.Control), so that
changing any of them runs the same compiled program."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from ..models.controlnet import guess_mode_ramp
from ..request.control import NAME
from ..request.request import ImageInfo
from ..sampler.tables import MAX_ROWS

T = TypeVar("T")


@dataclass(frozen=True)
class ControlUnit:
    """One ControlNet in a call: `controlnet` (the pipeline's, by name) on `images`, (n, H, W, 3)
    uint8 at the call's size (the processed control images: edges, a depth map...), its residuals
    times `weight` (A1111's Control Weight, diffusers' controlnet_conditioning_scale) on the steps
    from `start` to `end` (fractions of the steps that run: A1111's Starting and Ending Control
    Step, diffusers' control_guidance_start/end); `guess_mode` as diffusers': the prompt's pass
    alone takes its residuals, ramped from 0.1 at the first skip to 1 at the mid block."""
    controlnet: str
    images: np.ndarray
    weight: float = 1.0
    start: float = 0.0
    end: float = 1.0
    guess_mode: bool = False

    def __post_init__(self):
        if not 0.0 <= self.start < self.end <= 1.0:
            raise ValueError(f"ControlNet {self.controlnet!r}: its steps must run from a start below its end, "
                             f"both from 0 to 1 (got {self.start} to {self.end})")


def units_of(infos: Sequence[ImageInfo]) -> tuple[ControlUnit, ...]:
    """The ControlNets of a call's images as their infos carry them (ImageInfo.controls: one
    request's units, or several requests' with the same settings, each its own control images)."""
    first = infos[0].controls
    if any(info.controls != first for info in infos):
        raise ValueError("the images of one call share their ControlNets' settings")
    return tuple(ControlUnit(unit.model, np.stack([info.controls[k].image for info in infos]), unit.weight, unit.start,
                             unit.end, unit.guess_mode) for k, unit in enumerate(first))


def checked_names(controlnets: Mapping[str, T]) -> Mapping[str, T]:
    """`controlnets` by name, each name one that program names can carry (ValueError otherwise)."""
    for name in controlnets:
        if not NAME.fullmatch(name):
            raise ValueError(f"ControlNet name {name!r}: letters, digits, '.', '_' and '-' only")
    return controlnets


def steps_kept(start: float, end: float, steps: int) -> np.ndarray:
    """Which of `steps` steps a ControlNet acts on (1) or skips (0), as diffusers' controlnet_keep."""
    i = np.arange(steps)
    return 1.0 - ((i / steps < start) | ((i + 1) / steps > end)).astype(np.float64)


def scale_table(unit: ControlUnit, residuals: int, pooled: bool, step_ends: Sequence[int], batch: int) -> np.ndarray:
    """(batch, 2, MAX_ROWS, residuals) float32: each residual's factor per image, pass (negative,
    prompt) and table row; a step's rows (two for DPM++ SDE) share its factor. `pooled`: the
    ControlNet pools its conditions (global_pool_conditions), where diffusers ramps no guess mode."""
    per_step = unit.weight * steps_kept(unit.start, unit.end, len(step_ends))
    step_of_row = np.searchsorted(np.asarray(step_ends), np.arange(MAX_ROWS), side="right")
    per_row = np.where(step_of_row < len(step_ends), per_step[np.minimum(step_of_row, len(step_ends) - 1)], 0.0)
    ramp = np.array(guess_mode_ramp(residuals) if unit.guess_mode and not pooled else [1.0] * residuals)
    prompt = per_row[:, None] * ramp[None, :]
    negative = np.zeros_like(prompt) if unit.guess_mode else prompt
    table = np.stack([negative, prompt]).astype(np.float32)
    return np.broadcast_to(table, (batch, *table.shape)).copy()
