"""A run as the page shows it: from the server's stream of updates (core.Server.stream) to what
changes on the page, by name (page_events.py maps the names to its components): the gallery, the line
under it, the run panel, the Generate button's label, the run's state and where it is, the
history and the last run the browser keeps. Stop and a refusal, likewise."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..server.events import Done, Progress, Shown, Started
from .history import history_after, history_rows, last_run, thumbnail
from .page import run_panel, running_text, stopped_summary
from .sampler_menu import request_pair

GENERATE = "Generate"
# A run that waits for a program still compiling behind the first call's (img2img, guidance 1 or
# another size, first of its kind on a new server): minutes on a TPU, said rather than sat through.
WAITS_FOR_COMPILE = ("Generating · the first run of its kind at this size on this server: waiting for its "
                     "programs to compile (a few minutes on a TPU, once)")


@dataclass(frozen=True)
class Kept:
    """Runs the history keeps as soon as they are made (an X/Y/Z plot's cells, call by call: what
    Stop leaves is kept too), each as history_after takes it."""
    runs: list[dict[str, Any]]


def idle() -> dict[str, Any]:
    """What a run's end sets, however it ends (the page script then frees Generate, disables Stop)."""
    return {"run": GENERATE, "run_state": "idle"}


def page_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The form's values as the page sent them, with the menus' sampler and schedule as a request
    names them (sampler_menu.py)."""
    sampler, schedule = request_pair(values.get("sampler"), values.get("schedule"))
    return {**values, "sampler": sampler, "schedule": schedule}


def page_run(updates: Iterable[Started | Progress | Shown | Kept | Done], values: Mapping[str, Any], history: Any,
             keep_run: bool = True) -> Iterator[dict[str, Any]]:
    """The page's changes, by name, for each update of a run of `values` (the history: the browser's,
    as it sent it; `history_rows` of it is "history_rows"; `keep_run`: the run joins it when done,
    else only what Kept says)."""
    began = time.monotonic()
    seeds: list[int] = []
    for update in updates:
        if isinstance(update, Started):
            seeds, steps = update.seeds, update.all_steps  # (steps counted over all the calls)
            made = f"{len(seeds)} images" + (f" in {update.calls} calls" if update.calls > 1 else "")
            each = f"{update.steps} steps" if steps == update.steps * update.calls else f"{steps} steps in all"
            # The run replaces the last one at once: nothing of it is shown as current.
            yield dict(gallery=[], last_seeds=seeds, last_images=[], picked=None, run_state="running",
                       run_at={"seeds": seeds, "step": 0, "steps": steps}, run=f"Generating 0/{steps}",
                       summary=f"Generating {made}, {each}. Seeds: {', '.join(map(str, seeds))}.",
                       panel=run_panel("running", WAITS_FOR_COMPILE if update.compiling
                                       else "Generating · encoding the prompts", 0, steps))
        elif isinstance(update, Progress):
            step, steps, call = update.step, update.steps, [update.call, update.calls]
            text = running_text(step, steps, time.monotonic() - began, *call)
            yield dict(panel=run_panel("running", text, step, steps), run=f"Generating {step}/{steps}",
                       run_at={"seeds": seeds, "step": step, "steps": steps, "call": call})
        elif isinstance(update, Shown):
            yield dict(gallery=update.gallery)
        elif isinstance(update, Kept):
            for run in update.runs:
                history = history_after(history, run)
            yield dict(history=history, history_rows=history_rows(history))
        elif isinstance(update, Done):
            images, seeds, text, ran = update.gallery, update.seeds, update.summary, update.ran
            # The run joins the history, which the browser keeps (in and out with the call; the server
            # stores no prompt): what ran, the server's defaults where none was sent.
            kept = history_after(history, {**values, **ran, "negative": values["negative"] or "", "seed": seeds[0],
                                           "thumb": thumbnail(images[0][0]) if images else None}
                                 ) if keep_run else history_after(history, None)
            yield dict(gallery=images, last_seeds=seeds, last_images=[path for path, _ in images], summary=text,
                       history=kept, history_rows=history_rows(kept),
                       kept_run=last_run(images, seeds, text),
                       panel=run_panel("done", f"Done in {time.monotonic() - began:.1f} s."), **idle())


def refused(message: str) -> dict[str, Any]:
    """A refused run: said once, in the run panel; the images and the line under them stay."""
    return dict(panel=run_panel("refused", f"⚠️ {message}"), **idle())


def stopped(state: Any, at: Any) -> dict[str, Any]:
    """After Stop (the run's `state` and where it was, `at`: {seeds, step, steps}): where it stopped
    and its seeds; nothing when it had ended first."""
    if state == "idle":
        return {}
    at = at if isinstance(at, dict) else {}
    step, steps, call = at.get("step"), at.get("steps"), at.get("call")
    where = f"Stopped at step {step} of {steps}." if step else "Stopped before the first step."
    several = isinstance(call, (list, tuple)) and len(call) == 2 and all(type(n) is int for n in call) and call[1] > 1
    if step and several:
        where = f"{where[:-1]}, in call {call[0]} of {call[1]}: the calls before it are kept."
    return dict(panel=run_panel("stopped", where), summary=stopped_summary(at.get("seeds"), steps, step), **idle())
