"""The JSON of Gradio's queue protocol as a client sends it, checked against the app's own
endpoints (their input counts), before guard.py lets it through: the envelope's keys and types,
`fn_index`, ids, `data`'s arity and nesting, file objects only where the input is an image (what
they name is checked where it is read: uploads.py); a refusal is a 4xx with a message."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..request.values import is_file_object, json_type


MAX_DEPTH = 8  # of JSON nesting inside `data`; the app's inputs are flat
ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a session hash or an event id
ENVELOPE_KEYS = {  # Gradio's PredictBody fields: key -> (JSON type check, what it must be)
    "session_hash": (lambda v: v is None or isinstance(v, str), "a string"),
    "event_id": (lambda v: v is None or isinstance(v, str) and ID.fullmatch(v), "an event id"),
    "oauth_token": (lambda v: v is None or isinstance(v, str), "a string"),
    "trigger_id": (lambda v: v is None or _is_int(v), "an integer"),
    "simple_format": (lambda v: isinstance(v, bool), "true or false"),
    "batched": (lambda v: v is None or isinstance(v, bool), "true or false"),
}


class Refused(Exception):
    """A request refused before it reaches Gradio: HTTP status and a message for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Endpoint:
    """One event handler of the Blocks as the queue protocol addresses it."""
    fn_index: int
    n_inputs: int
    api_name: str | None
    public: bool  # callable by name (call/<api_name>), not only by the page's fn_index
    select: bool  # a .select() listener: Gradio builds SelectData from event_data["index"/"value"]
    file_inputs: tuple[tuple[int, str], ...] = ()  # (position, label) of inputs that are images: a file object
    min_inputs: int | None = None  # fewer may be sent (an older client's): the rest are null; None: all
    # (position, label) of image editors (the page's mask painter): {background, layers, composite, id},
    # its images file objects
    editor_inputs: tuple[tuple[int, str], ...] = ()

    def files(self, data: list) -> list[tuple[int, str, Any]]:
        """(position, label, value) of every file object an image or editor input of `data` holds."""
        found = [(i, label, data[i]) for i, label in self.file_inputs if data[i] is not None]
        for i, label in self.editor_inputs:
            if isinstance(data[i], dict):
                found += [(i, label, v) for v in (data[i].get("background"), data[i].get("composite"),
                                                  *data[i].get("layers", ())) if v is not None]
        return found


def endpoints_of(config: Mapping[str, Any], shortest: Mapping[str, int] | None = None) -> dict[int, Endpoint]:
    """The Blocks' dependencies that run on the server and through the queue, by fn_index;
    `shortest`: for an API name, how few inputs a call may send (inputs added at the end since)."""
    components = {c["id"]: c for c in config.get("components", [])}
    out = {}
    for dep in config["dependencies"]:
        if not dep.get("backend_fn") or not dep.get("queue", True):
            continue  # JS-only events and queue-less ones (the guard closes run/predict) are not callable
        kind = lambda block: components.get(block, {}).get("type")
        images, editors = (tuple((i, components[block].get("props", {}).get("label") or "image")
                                 for i, block in enumerate(dep["inputs"]) if kind(block) == wanted)
                           for wanted in ("image", "imageeditor"))
        out[dep["id"]] = Endpoint(dep["id"], len(dep["inputs"]), dep.get("api_name"),
                                  dep.get("api_visibility") == "public",
                                  any(event == "select" for _, event in dep.get("targets", [])), images,
                                  (shortest or {}).get(dep.get("api_name")), editors)
    return out


def check_data(data: Any, endpoint: Endpoint, *, files: bool = False) -> list:
    """`data` has the endpoint's arity (a shorter call's missing inputs are returned as null),
    bounded nesting and no file objects but an image input's own (a file object is how a client asks
    Gradio to read a file; `files`: anywhere)."""
    if not isinstance(data, list):
        raise Refused(422, f"'data' must be a list of {endpoint.n_inputs} input values, got {json_type(data)}.")
    fewest = endpoint.n_inputs if endpoint.min_inputs is None else endpoint.min_inputs
    if not fewest <= len(data) <= endpoint.n_inputs:
        name = f"/{endpoint.api_name}" if endpoint.api_name else f"fn_index {endpoint.fn_index}"
        takes = f"{endpoint.n_inputs}" if fewest == endpoint.n_inputs else f"{fewest} to {endpoint.n_inputs}"
        raise Refused(422, f"{name} takes {takes} input values, got {len(data)}.")
    editors = dict(endpoint.editor_inputs)
    for index in editors:
        if index < len(data) and not _editor_value(data[index]):
            raise Refused(422, f"input {index + 1} must be null or an image editor's value (background, layers, "
                               "composite: uploaded files).")
    stack = [(value, 1, i) for i, value in enumerate(data)]
    while stack:  # iterative: Gradio walks inputs recursively, so depth is bounded here
        value, depth, index = stack.pop()
        if depth > MAX_DEPTH:
            raise Refused(422, f"input {index + 1} is nested too deeply.")
        if not files and is_file_object(value) and not (depth == 1 and index in dict(endpoint.file_inputs)) and not (
                index in editors and depth in (2, 3)):
            raise Refused(422, f"input {index + 1} is a file object; only an image input takes one.")
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, depth + 1, index) for child in children)
    return data + [None] * (endpoint.n_inputs - len(data))


EDITOR_KEYS = {"background", "layers", "composite", "id"}
MAX_LAYERS = 4


def _editor_value(value: Any) -> bool:
    """Whether `value` is null or an image editor's value as Gradio's page sends it."""
    if value is None:
        return True
    if not isinstance(value, dict) or not set(value) <= EDITOR_KEYS:
        return False
    layers, ident = value.get("layers", []), value.get("id")
    return (all(v is None or is_file_object(v) for v in (value.get("background"), value.get("composite")))
            and isinstance(layers, list) and len(layers) <= MAX_LAYERS and all(is_file_object(v) for v in layers)
            and (ident is None or isinstance(ident, str) and len(ident) <= 100))


def check_envelope(body: Any, endpoints: dict[int, Endpoint], *, fn_index: int | None = None) -> dict:
    """A queue call's JSON body (Gradio's PredictBody), checked field by field. `fn_index` is given
    when the route names the endpoint (call/<api_name>)."""
    if not isinstance(body, dict):
        raise Refused(422, f"the request body must be a JSON object, got {json_type(body)}.")
    if fn_index is None:
        fn_index = check_fn_index(body.get("fn_index"), endpoints)
    elif body.get("fn_index") not in (None, fn_index):
        raise Refused(422, "'fn_index' does not match the endpoint named in the URL.")
    endpoint = endpoints[fn_index]
    for key, (ok, what) in ENVELOPE_KEYS.items():
        if key in body and not ok(body[key]):
            raise Refused(422, f"'{key}' must be {what}, got {json_type(body[key])}.")
    data = check_data(body.get("data"), endpoint)
    # event_data may be any JSON (a change event sends the new value); only handlers that ask for it
    # read it, and a gallery's select event names an image (no file is read), so only depth is bounded.
    event_data = body.get("event_data")
    if endpoint.select and not (isinstance(event_data, dict) and "index" in event_data and "value" in event_data):
        raise Refused(422, "'event_data' must be an object with 'index' and 'value' for a select event.")
    if event_data is not None:
        check_data([event_data], Endpoint(fn_index, 1, "event_data", False, False), files=True)
    return {**body, "fn_index": fn_index, "data": data}


def check_fn_index(value: Any, endpoints: dict[int, Endpoint]) -> int:
    if value is None:
        raise Refused(422, "'fn_index' is required.")
    if not _is_int(value):
        raise Refused(422, f"'fn_index' must be an integer, got {json_type(value)}.")
    if value not in endpoints:
        raise Refused(422, f"'fn_index' must be one of this app's endpoints: {', '.join(map(str, endpoints))}.")
    return value


def check_id(value: Any, name: str = "session_hash") -> str:
    if not isinstance(value, str) or not ID.fullmatch(value):
        raise Refused(422, f"'{name}' must be 1 to 64 letters, digits, '-' or '_'.")
    return value


def check_cached_file(path: str, cache_dir: Path) -> None:
    """file=<path> serves only regular files inside Gradio's cache folder, symlinks resolved."""
    if not path or not path.startswith("/") or "://" in path:
        raise Refused(403, "Only files this app wrote (its images) are served.")
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(cache_dir) or not real.is_file():
        raise Refused(404, "No such image (only files this app wrote are served, while they last).")


def parse_json(body: bytes | str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise Refused(400, "The request body is not valid JSON.") from None


def parse_json_object(body: bytes) -> dict:
    data = parse_json(body)
    if not isinstance(data, dict):
        raise Refused(422, f"the request body must be a JSON object, got {json_type(data)}.")
    return data
