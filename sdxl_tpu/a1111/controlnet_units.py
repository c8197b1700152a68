"""sd-webui-controlnet's API in this project's terms: its units as A1111 clients send them in
`alwayson_scripts.controlnet.args` (webuiapi's ControlNetUnit, painting plug-ins) -> the units
request/control.py checks; its model and module lists (/controlnet/*). Plain Python.

What changes the image here and only its default can have is refused by name (a unit's mask, a
control mode other than Balanced); what changes nothing here is taken (low VRAM, the preprocessor's
resolution: the preprocessors run at the image's own size, sd-webui-controlnet's Pixel Perfect)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..imaging.clip_image import IP_ADAPTER_MODULES
from ..imaging.control_image import PREPROCESSORS
from ..request.errors import RequestError
from ..request.names import RESIZE_MODES
from ..request.values import json_type, shown

# Its resize modes (names, old names, and the numbers its API also takes) -> ours.
RESIZE_NAMES = {"just resize": RESIZE_MODES[0], "crop and resize": RESIZE_MODES[1], "resize and fill": RESIZE_MODES[2],
                "scale to fit (inner fit)": RESIZE_MODES[1], "envelope (outer fit)": RESIZE_MODES[2],
                0: RESIZE_MODES[0], 1: RESIZE_MODES[1], 2: RESIZE_MODES[2]}
# Its preprocessor names -> ours (the others it has need models of their own: not offered).
MODULE_NAMES = {"none": "none", "canny": "canny", "invert": "invert", "invert (from white bg & black line)": "invert"}
BALANCED = ("Balanced", 0)
TAKEN = {"low_vram", "lowvram", "processor_res", "pixel_perfect", "hr_option", "save_detected_map", "is_ui",
         "input_mode", "batch_images", "use_preview_as_input", "generated_image", "advanced_weighting"}
HASHED = re.compile(r"(.+?) \[[0-9a-fA-F]{6,}\]")  # A1111 shows a model as "name [hash]"


def controlnet_args(scripts: Any) -> list[dict[str, Any]] | None:
    """The units of `alwayson_scripts` ({"controlnet": {"args": [unit, ...]}}; None or {}: none) as
    request/control.py takes them; any other extension is refused by name."""
    if scripts is None or scripts == {}:
        return None
    if not isinstance(scripts, Mapping):
        raise RequestError(f"alwayson_scripts must be an object, got {json_type(scripts)}.")
    others = [name for name in scripts if str(name).lower() != "controlnet"]
    if others:
        raise RequestError(f"alwayson_scripts {shown(others[0])} is not offered here; only ControlNet "
                           "(sd-webui-controlnet's units) and Dynamic Prompts are.")
    entry = next(iter(scripts.values()))
    args = entry.get("args") if isinstance(entry, Mapping) else None
    if not isinstance(args, list):
        raise RequestError("alwayson_scripts controlnet must be an object with its units in args (a list).")
    return [_unit(unit, i) for i, unit in enumerate(args)]


def _unit(unit: Any, i: int) -> dict[str, Any]:
    label = f"ControlNet unit {i}"
    if not isinstance(unit, Mapping):
        raise RequestError(f"{label} must be an object, got {json_type(unit)}.")
    ours = {k: v for k, v in unit.items() if k not in TAKEN and k not in ("input_image", "mask", "control_mode",
                                                                        "guessmode", "mask_image")}
    image = unit.get("image", unit.get("input_image"))
    mask = unit.get("mask", unit.get("mask_image"))
    if isinstance(image, Mapping):  # (its older form: {"image": ..., "mask": ...})
        image, mask = image.get("image"), image.get("mask", mask)
    if mask not in (None, ""):
        raise RequestError(f"{label}: a ControlNet mask is not offered here; send the image alone.")
    ours["image"] = image if image != "" else None
    mode = unit.get("control_mode", unit.get("guessmode", "Balanced"))
    if mode not in (*BALANCED, None) or isinstance(mode, bool):
        raise RequestError(f"{label} control_mode {shown(mode)} is not offered here: Balanced only "
                           "(guess_mode: true for diffusers' guess mode).")
    model = unit.get("model")
    if isinstance(model, str):
        model = None if model in ("", "None") else (HASHED.fullmatch(model) or [model, model])[1]
    ours["model"] = model
    module = unit.get("module", "none")
    if isinstance(module, str):
        ours["module"] = MODULE_NAMES.get(module.lower(), module)
    resize = unit.get("resize_mode")
    if resize is not None:
        key = resize.lower() if isinstance(resize, str) else resize if type(resize) is int else None
        if key not in RESIZE_NAMES:
            what = resize if type(resize) is int else shown(resize)
            raise RequestError(f"{label} resize_mode {what} is not one of: Just Resize, Crop and Resize, "
                               "Resize and Fill.")
        ours["resize_mode"] = RESIZE_NAMES[key]
    for key in ("threshold_a", "threshold_b"):  # (it sends them with every unit, as floats; -1 or 64 when unused)
        value = ours.get(key)
        if value == -1 or ours.get("module") != "canny":
            ours.pop(key, None)
        elif isinstance(value, float) and value.is_integer():
            ours[key] = int(value)
    return ours


def module_list() -> dict[str, Any]:
    """GET /controlnet/module_list: the preprocessors offered (an IP-Adapter's too), with
    sd-webui-controlnet's detail."""
    sliders = {"canny": [{"name": "Preprocessor resolution", "value": 512, "min": 64, "max": 2048},
                         {"name": "Canny Low Threshold", "value": 100, "min": 1, "max": 255},
                         {"name": "Canny High Threshold", "value": 200, "min": 1, "max": 255}]}
    modules = PREPROCESSORS + IP_ADAPTER_MODULES
    return {"module_list": list(modules),
            "module_detail": {m: {"model_free": False, "sliders": sliders.get(m, [])} for m in modules}}


def model_list(names: Sequence[str]) -> dict[str, Any]:
    """GET /controlnet/model_list: the ControlNets and the IP-Adapter loaded."""
    return {"model_list": list(names)}
