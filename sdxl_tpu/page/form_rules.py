"""The form's rules that run in the browser (web/form_rules.js, beside their Python twins), given
the data they need: each event's JavaScript is that file called with this server's config."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..request.fields import FIELDS, FORM, HISTORY
from .page import CUSTOM
from .sampler_menu import CHECKPOINT_KARRAS, KARRAS

RULES = (Path(__file__).resolve().parent / "web" / "form_rules.js").read_text()


def rules_config(presets: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """What the rules read: the menus' names, the presets offered ({name: [steps, sampler,
    guidance]}), and for each of the form's fields what a restored history row gives it."""
    fields = [{"name": f.name, "kept": HISTORY in f.kept,
               "fallback": f.default if f.optional and f.default is not None else None, "restored": f.restored}
              for f in FIELDS]
    return {"karras": KARRAS, "checkpointKarras": CHECKPOINT_KARRAS, "custom": CUSTOM, "presets": dict(presets),
            "fields": fields, "sampler": FORM.index("sampler"), "schedule": FORM.index("schedule")}


def rule_js(rule: str, config: Mapping[str, Any]) -> str:
    """An event's `js`: the rule `rule` (menuPair, matchingPreset, presetFill, restoreHistory) on its inputs."""
    return f"(...args) => ({RULES})({json.dumps(config)}).{rule}(...args)"
