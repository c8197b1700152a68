"""The runs the page keeps in the browser (the server stores no prompt): the history of the last
runs, which the browser sends back with each run and a click restores into the form, and the last
run's images, shown again after a reload while the server still keeps their files. Pure functions
of what a client sent (any JSON value)."""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Sequence
from typing import Any

from PIL import Image

from ..request.fields import FIELD, HISTORY, MAX_PROMPT_CHARS, kept
from ..request.names import DEFAULT_RNG, DEFAULT_SCHEDULE

HISTORY_LENGTH = 24  # runs kept in the browser, newest first
HISTORY_PER_PAGE = 12
HISTORY_FIELDS = kept(HISTORY)
# Each run's first image, small, as a JPEG data URL: 24 of them stay well within what a browser
# keeps for a page (about 2 KB each at 64 px; the bound refuses anything far bigger).
THUMBNAIL_PIXELS, MAX_THUMBNAIL_CHARS = 64, 12_000
_THUMBNAIL = re.compile(r"data:image/jpeg;base64,[A-Za-z0-9+/]+={0,2}")


def thumbnail(path: str) -> str | None:
    """A run's first image (a file the server wrote) as a small JPEG data URL, or None."""
    try:
        with Image.open(path) as image:
            image.thumbnail((THUMBNAIL_PIXELS, THUMBNAIL_PIXELS))
            out = io.BytesIO()
            image.convert("RGB").save(out, "JPEG", quality=70)
    except (OSError, ValueError):
        return None
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


def history_entry(value: Any) -> dict[str, Any] | None:
    """A run as the history keeps it (the fields kept HISTORY), from a client's value (any JSON), or
    None if it is not one. The page stores it in the browser (localStorage); the server keeps none."""
    if not isinstance(value, dict):
        return None
    entry = {}
    for name in HISTORY_FIELDS:
        f = FIELD[name]
        # Runs kept before an optional field existed ran on its default.
        entry[name] = v = value.get(name, f.default if f.optional else None)
        if f.kind in ("text", "choice"):
            ok = isinstance(v, str) and len(v) <= MAX_PROMPT_CHARS and (f.choices is None or v in f.choices)
        elif f.kind == "switch":
            ok = isinstance(v, bool)
        else:
            low, high = f.bounds
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= high and (
                f.kind != "whole" or isinstance(v, int))
        if not ok:
            return None
    # Its thumbnail, if it is one (the table writes it into HTML: nothing else may pass).
    thumb = value.get("thumb")
    if isinstance(thumb, str) and len(thumb) <= MAX_THUMBNAIL_CHARS and _THUMBNAIL.fullmatch(thumb):
        entry["thumb"] = thumb
    return entry if entry["prompt"] else None


def history_after(history: Any, run: Any) -> list[dict[str, Any]]:
    """The history with `run` added first (the same run again moves to the top), at most
    HISTORY_LENGTH entries; malformed entries a client sent are dropped."""
    kept_entries = [e for e in (history_entry(v) for v in (history if isinstance(history, list) else [])
                                [:HISTORY_LENGTH * 2]) if e is not None]
    new = history_entry(run)
    if new is not None:
        kept_entries = [new] + [e for e in kept_entries if e != new]
    return kept_entries[:HISTORY_LENGTH]


HISTORY_HEADERS = ["Image", "Prompt", "Settings", "Sampler"]


def history_rows(history: Any) -> list[list[str]]:
    """The history as the page's table shows it (HISTORY_HEADERS; the page shows 60 characters of
    each): the first image (HTML); prompt; seed, steps, guidance, size and style; the sampler, with
    the Schedule type and the noise source where they are not the defaults."""
    rows = []
    for e in history_after(history, None):
        settings = (f"seed {e['seed']} · {e['steps']} steps · CFG {e['guidance']:g} · {e['size']}"
                    + (f" · {e['style']}" if e["style"] != "(No style)" else ""))
        sampler = (e["sampler"] + (f", {e['schedule']} schedule" if e["schedule"] != DEFAULT_SCHEDULE else "")
                   + (f" · {e['rng']} noise" if e["rng"] != DEFAULT_RNG else ""))
        image = (f'<img src="{e["thumb"]}" alt="seed {e["seed"]}" width="{THUMBNAIL_PIXELS}" '
                 f'height="{THUMBNAIL_PIXELS}" style="object-fit: contain">' if "thumb" in e else "")
        rows.append([image, e["prompt"] + (f"  —  not: {e['negative']}" if e["negative"] else ""), settings, sampler])
    return rows


def last_run(gallery: Sequence[tuple[str, str]], seeds: Sequence[int], summary: str) -> dict[str, Any]:
    """What the browser keeps of the last run: its files (as the server named them), captions,
    seeds and summary line."""
    return {"images": [[path, caption] for path, caption in gallery], "seeds": list(seeds), "summary": summary}


def restored_run(value: Any, holds: Any) -> tuple[list[tuple[str, str]], list[int], str] | None:
    """The gallery, seeds and summary of a kept last run (any client value), or None unless every
    file is one the server's store still holds (`holds(paths)`: files.ImageStore.holds)."""
    if not isinstance(value, dict):
        return None
    images, seeds, summary = value.get("images"), value.get("seeds"), value.get("summary")
    if not (isinstance(images, list) and 0 < len(images) <= 16 and isinstance(summary, str) and len(summary) < 2000
            and all(isinstance(i, list) and len(i) == 2 and all(isinstance(x, str) for x in i) for i in images)
            and isinstance(seeds, list) and all(type(x) is int for x in seeds)):
        return None
    if not holds([path for path, _ in images]):
        return None
    return [(path, caption[:100]) for path, caption in images], seeds, summary
