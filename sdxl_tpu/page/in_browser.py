"""What the page's events do in the browser, without a server event (web/in_browser.js: the form's
rules beside their Python twins, the run panel's answers to Stop and to a run not taken), given the
data they need: each event's JavaScript is that file called with this server's config."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..request.fields import FIELDS, FORM, HISTORY
from ..server.form import EXAMPLES
from .page import CUSTOM, run_panel
from .sampler_menu import CHECKPOINT_KARRAS, KARRAS, schedule_menus

SCRIPT = (Path(__file__).resolve().parent / "web" / "in_browser.js").read_text()
NOT_TAKEN = "The server could not take the request (its queue is full, or it is stopping); please try again."


def browser_config(presets: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """What the script reads: the menus' names, the presets offered ({name: [steps, sampler,
    guidance]}), for each of the form's fields what a restored history row gives it, the run
    panel's answers and the example prompts."""
    fields = [{"name": f.name, "kept": HISTORY in f.kept,
               "fallback": f.default if f.optional and f.default is not None else None, "restored": f.restored}
              for f in FIELDS]
    return {"karras": KARRAS, "checkpointKarras": CHECKPOINT_KARRAS, "custom": CUSTOM, "presets": dict(presets),
            "fields": fields, "sampler": FORM.index("sampler"), "schedule": FORM.index("schedule"),
            "panels": {"notTaken": run_panel("refused", "⚠️ " + NOT_TAKEN), "stopped": run_panel("stopped", "Stopped.")},
            "examples": EXAMPLES}


def offered_now(presets: Sequence[str], samplers: Sequence[str], schedules: Sequence[str]) -> str:
    """What the page's hidden `offered` field holds, as JSON: what the menus offer now that the
    script's rules read (the presets' names; each sampler's Schedule type menu). A front end's
    back ends may change it, so it is a field, not part of the config."""
    return json.dumps({"presets": list(presets), "schedules": schedule_menus(samplers, schedules)})


def in_browser(name: str, config: Mapping[str, Any]) -> str:
    """An event's `js`: the script's function `name` (menuPair, presetFill, failedRun, ...) on its inputs."""
    return f"(...args) => ({SCRIPT})({json.dumps(config)}).{name}(...args)"
