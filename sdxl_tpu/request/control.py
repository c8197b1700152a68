"""ControlNet units as a request gives them, checked: which loaded ControlNet, its image and
preprocessor, weight, the steps it acts on and guess mode; named as sd-webui-controlnet's API names
a unit's fields (model, module, weight, guidance_start, guidance_end, threshold_a, threshold_b,
resize_mode), with diffusers' guess_mode, and `preprocessed` (true: the image is the processed
control image already, as a front end sends it to its back ends; the module is then named for the
parameters only); and the one unit the page's fields (and the command line's options named as
they are) make. Plain Python: the generator turns each into a generate/control.ControlUnit."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import re
from dataclasses import dataclass, field
from typing import Any

from ..imaging.clip_image import IP_ADAPTER_MODULES, image_prompt
from ..imaging.control_image import CANNY_THRESHOLDS, PREPROCESSORS, control_image
from .errors import RequestError
from .fields import FIELD, FIELDS, MAX_WEIGHT
from .names import RESIZE_MODES
from .values import choice_input, json_type, not_a_choice, number_input

# A ControlNet's name, as program names and stored programs' files carry it.
NAME = re.compile(r"[A-Za-z0-9._-]+")
UNIT_KEYS = ("model", "image", "module", "weight", "guidance_start", "guidance_end", "threshold_a", "threshold_b",
             "resize_mode", "guess_mode", "enabled", "preprocessed")
MAX_UNITS = 3  # ControlNets in one call (each is another network on every step)
DEFAULT_RESIZE = RESIZE_MODES[1]  # sd-webui-controlnet's: Crop and resize


@dataclass(frozen=True)
class ControlRequest:
    """One checked unit; `image` is the control image as the ControlNet sees it at the request's
    size, (height, width, 3) uint8 (fitted and preprocessed)."""
    model: str
    module: str
    weight: float
    start: float
    end: float
    guess_mode: bool
    thresholds: tuple[int, int] | None  # Canny's (low, high); None for the other preprocessors
    # An IP-Adapter's unit: its image a prompt, (224, 224, 3) uint8 as the image encoder sees it.
    resize_mode: str = DEFAULT_RESIZE  # how the image was fitted to the size (names.RESIZE_MODES)
    image: Any = field(default=None, compare=False, repr=False)


def _unit(value: Any, i: int, size: tuple[int, int], available: Sequence[str],
          ip_adapters: Sequence[str]) -> ControlRequest | None:
    label = f"ControlNet unit {i}"
    if not isinstance(value, Mapping):
        raise RequestError(f"{label} must be an object with model and image, got {json_type(value)}.")
    if unknown := sorted(str(k) for k in value if k not in UNIT_KEYS):
        raise RequestError(f"{label}: unknown field {unknown[0]!r} (fields: {', '.join(UNIT_KEYS)}).")
    enabled = value.get("enabled", True)
    if not isinstance(enabled, bool):
        raise RequestError(f"{label} enabled must be true or false, got {json_type(enabled)}.")
    if not enabled:
        return None
    if not available:
        raise RequestError(f"{label}: no ControlNet is loaded.")
    if value.get("model") is None or value.get("image") is None:
        raise RequestError(f"{label} needs a model and an image.")
    if not isinstance(value["model"], str) or value["model"] not in available:
        raise RequestError(f"{label}: " + not_a_choice("ControlNet", value["model"], available))
    module = choice_input(value.get("module", "none"), f"{label} module", PREPROCESSORS + IP_ADAPTER_MODULES)
    adapter = value["model"] in ip_adapters
    if adapter != (module in IP_ADAPTER_MODULES) and module != "none":
        raise RequestError(f"{label}: module {module} is " + ("a ControlNet's preprocessor; the IP-Adapter "
                           f"{value['model']} takes {', '.join(IP_ADAPTER_MODULES)} or none" if adapter else
                           f"an IP-Adapter's; {value['model']} is a ControlNet"))
    number = lambda key, default, low, high, whole=False: (  # noqa: E731
        default if value.get(key) is None else number_input(value[key], f"{label} {key}", low, high, whole=whole))
    weight = float(number("weight", 1.0, 0.0, MAX_WEIGHT))
    start, end = float(number("guidance_start", 0.0, 0.0, 1.0)), float(number("guidance_end", 1.0, 0.0, 1.0))
    if start >= end:
        raise RequestError(f"{label}: guidance_start ({start}) must be below guidance_end ({end}).")
    guess_mode = value.get("guess_mode", False)
    if not isinstance(guess_mode, bool) or (guess_mode and adapter):
        raise RequestError(f"{label} guess_mode must be true or false, got {json_type(guess_mode)}." if not adapter
                           else f"{label}: guess mode is a ControlNet's, not the IP-Adapter's.")
    thresholds = None
    if module == "canny":
        thresholds = (int(number("threshold_a", CANNY_THRESHOLDS[0], 1, 255, True)),
                      int(number("threshold_b", CANNY_THRESHOLDS[1], 1, 255, True)))
    mode = choice_input(value.get("resize_mode", DEFAULT_RESIZE), f"{label} resize_mode", RESIZE_MODES)
    preprocessed = value.get("preprocessed", False)
    if not isinstance(preprocessed, bool):
        raise RequestError(f"{label} preprocessed must be true or false, got {json_type(preprocessed)}.")
    low, high = thresholds or CANNY_THRESHOLDS
    image = image_prompt(value["image"], f"{label} image") if adapter else control_image(
        value["image"], size, "none" if preprocessed else module, resize_mode=mode, low=low, high=high)
    return ControlRequest(value["model"], module, weight, start, end, guess_mode, thresholds, mode, image=image)


def control_requests(value: Any, size: tuple[int, int], available: Sequence[str],
                     ip_adapters: Sequence[str] = ()) -> tuple[ControlRequest, ...]:
    """The enabled units of `value` (a list of unit objects, or None), each checked and its image
    made at `size` (an IP-Adapter's: as its image encoder takes it); `available`: the ControlNets
    and IP-Adapters loaded, by name; `ip_adapters`: which of them are IP-Adapters (one a call)."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise RequestError(f"ControlNet must be a list of units, got {json_type(value)}.")
    if len(value) > MAX_UNITS:
        raise RequestError(f"ControlNet takes at most {MAX_UNITS} units, got {len(value)}.")
    units = tuple(unit for i, given in enumerate(value) if (unit := _unit(given, i, size, available, ip_adapters)))
    if sum(unit.model in ip_adapters for unit in units) > 1:
        raise RequestError("ControlNet: one IP-Adapter unit a request (its image prompt is one image).")
    return units


# The page's unit: its fields in request/fields.py's list (named control_*), the numbers among them.
FORM_FIELDS = tuple(f.name for f in FIELDS if f.name.startswith("control_"))
FORM_NUMBERS = tuple(name for name in FORM_FIELDS if FIELD[name].kind in ("number", "whole"))


def form_unit(v: Mapping[str, Any], available: Sequence[str], read_file: Callable[[Any, str], bytes] | None
              ) -> list[dict[str, Any]] | None:
    """The page's ControlNet fields (control_*, by name, defaults filled in) as a list of one unit,
    or None without its image; each field checked by its label all the same, as the page always
    sends them. `available`: the ControlNets loaded; `read_file(value, label)`: the image's bytes
    (None: this server takes no files)."""
    for name in FORM_NUMBERS:
        f = FIELD[name]
        number_input(v[name], f.label, *f.bounds, whole=f.kind == "whole")
    choice_input(v["control_module"], FIELD["control_module"].label, FIELD["control_module"].names)
    model, label = v["control_model"], FIELD["control_model"].label
    if model is not None:
        if not available:
            raise RequestError(f"{label}: no ControlNet is loaded.")
        choice_input(model, label, available)
    if v["control_image"] is None:
        return None
    if read_file is None:
        raise RequestError(f"{FIELD['control_image'].label}: this server takes no images.")
    # (none loaded: the unit's own check says so)
    image = read_file(v["control_image"], FIELD["control_image"].label)
    return [{"model": model or next(iter(available), None), "image": image, "module": v["control_module"],
             "weight": v["control_weight"], "guidance_start": v["control_start"], "guidance_end": v["control_end"],
             "threshold_a": v["control_low"], "threshold_b": v["control_high"]}]
