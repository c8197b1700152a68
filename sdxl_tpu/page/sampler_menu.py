"""The page's sampler and Schedule type menus: each sampler once, and only the schedule types it
runs on. A1111's old "DPM++ 2M Karras" names (on the checkpoint's schedule: diffusers'
use_karras_sigmas, not k-diffusion's Karras) are the menu's "DPM++ 2M" with the Schedule type
entry CHECKPOINT_KARRAS; requests, the history, the images' parameters and pasted texts keep the
old names (`request_pair` and `menu_pair` translate, here and, for the history, in the browser)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..request.names import resolve_schedule

KARRAS = " Karras"
CHECKPOINT_KARRAS = "Checkpoint, Karras sigmas"  # the page's alone: "<sampler> Karras" on "Checkpoint"
# How the Schedule type menu names its entries (the others by their own names, A1111's).
SCHEDULE_LABELS = {"Checkpoint": "Checkpoint (as diffusers runs it)", "Automatic": "Automatic (A1111's per sampler)",
                   CHECKPOINT_KARRAS: "Checkpoint, Karras sigmas (diffusers)"}


def menu_samplers(samplers: Sequence[str]) -> list[str]:
    """The sampler menu: each sampler once (the "... Karras" names folded into their sampler)."""
    return list(dict.fromkeys(s.removesuffix(KARRAS) for s in samplers))


def schedule_menu(sampler: Any, samplers: Sequence[str], schedules: Sequence[str]) -> list[tuple[str, str]]:
    """(label, value) pairs of the schedule types `sampler` (a menu name) runs on; all of them for
    a sampler not offered (the request's check then says what is wrong)."""
    def runs(schedule: str) -> bool:
        try:
            resolve_schedule(sampler, schedule)
            return True
        except (KeyError, ValueError):
            return False

    names = [s for s in schedules if runs(s)] if sampler in menu_samplers(samplers) else list(schedules)
    if isinstance(sampler, str) and sampler + KARRAS in samplers and "Checkpoint" in names:
        names.insert(names.index("Checkpoint") + 1, CHECKPOINT_KARRAS)
    return [(SCHEDULE_LABELS.get(name, name), name) for name in names]


def fitted_schedule(sampler: Any, schedule: Any, samplers: Sequence[str], schedules: Sequence[str]) -> tuple:
    """The Schedule type menu for `sampler`, and the schedule kept if it runs on it, else the first."""
    menu = schedule_menu(sampler, samplers, schedules)
    values = [value for _, value in menu]
    return menu, schedule if schedule in values else (values[0] if values else None)


def schedule_menus(samplers: Sequence[str], schedules: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
    """Each menu sampler's Schedule type menu, and under "" the menu of a sampler not offered (all
    of them): what the browser fits the menu from when the sampler changes (web/in_browser.js's
    fitSchedule, fitted_schedule's twin)."""
    return {"": schedule_menu(None, samplers, schedules),
            **{name: schedule_menu(name, samplers, schedules) for name in menu_samplers(samplers)}}


def request_pair(sampler: Any, schedule: Any) -> tuple[Any, Any]:
    """The menu's (sampler, schedule) as a request names them; anything else as it is (the
    request's check refuses what is wrong)."""
    if schedule == CHECKPOINT_KARRAS and isinstance(sampler, str):
        return sampler + KARRAS, "Checkpoint"
    return sampler, schedule


def menu_pair(sampler: Any, schedule: Any) -> tuple[Any, Any]:
    """A request's (sampler, schedule) as the menus show them: "DPM++ 2M Karras" on Checkpoint is
    "DPM++ 2M" with CHECKPOINT_KARRAS; on Automatic or Karras (k-diffusion's Karras either way),
    "DPM++ 2M" with Karras."""
    if isinstance(sampler, str) and sampler.endswith(KARRAS):
        return sampler.removesuffix(KARRAS), CHECKPOINT_KARRAS if schedule == "Checkpoint" else "Karras"
    return sampler, schedule

