"""ControlNet units as a request gives them (sd-webui-controlnet's unit fields): checked one by one,
each bad field named with its unit, disabled units skipped, the images made at the request's size."""

from __future__ import annotations

import numpy as np
import pytest

from sdxl_tpu import RequestError
from sdxl_tpu.request.control import MAX_UNITS, control_requests
from sdxl_tpu.request.request import Request

LOADED = ["canny-xl", "depth-xl"]


def _image(value: int = 255) -> np.ndarray:
    image = np.zeros((48, 32, 3), np.uint8)
    image[10:30, 8:24] = value
    return image


def test_units_are_checked_and_their_images_made_at_the_size():
    units = control_requests([
        {"model": "canny-xl", "image": _image(), "module": "canny", "weight": 0.6, "guidance_start": 0.1,
         "guidance_end": 0.9, "threshold_a": 50, "threshold_b": 150, "resize_mode": "Crop and resize"},
        {"model": "depth-xl", "image": _image(128), "guess_mode": True},
        {"model": "canny-xl", "image": _image(), "enabled": False},  # (A1111's clients send their idle units)
    ], (64, 64), LOADED)
    assert [(u.model, u.module, u.weight, u.start, u.end, u.guess_mode, u.thresholds) for u in units] == [
        ("canny-xl", "canny", 0.6, 0.1, 0.9, False, (50, 150)), ("depth-xl", "none", 1.0, 0.0, 1.0, True, None)]
    assert units[0].image.shape == units[1].image.shape == (64, 64, 3)
    assert set(np.unique(units[0].image)) <= {0, 255} and units[0].image.any()  # edges
    assert (units[1].image[26, 32] == 128).all() and not units[1].image[:8].any()  # as given, fitted
    assert control_requests(None, (64, 64), []) == ()
    assert control_requests([{"enabled": False, "model": "x"}], (64, 64), []) == ()  # idle, none loaded: fine


@pytest.mark.parametrize("value, message", [
    ("canny", "must be a list of units"),
    ([{}] * (MAX_UNITS + 1), f"at most {MAX_UNITS} units"),
    (["canny"], "unit 0 must be an object"),
    ([{"model": "canny-xl", "image": "x", "strength": 1}], "unit 0: unknown field 'strength'"),
    ([{"model": "canny-xl"}], "unit 0 needs a model and an image"),
    ([{"model": "openpose-xl", "image": _image()}], "'openpose-xl' is not available; choose one of: canny-xl"),
    ([{"model": ["canny-xl"], "image": _image()}], "ControlNet must be text, got a list"),
    ([{"model": "canny-xl", "image": _image(), "weight": 3}], "unit 0 weight"),
    ([{"model": "canny-xl", "image": _image(), "guidance_start": 0.5, "guidance_end": 0.5}], "must be below"),
    ([{"model": "canny-xl", "image": _image(), "module": "openpose"}], "unit 0 module"),
    ([{"model": "canny-xl", "image": _image(), "module": "canny", "threshold_a": 0}], "unit 0 threshold_a"),
    ([{"model": "canny-xl", "image": _image(), "guess_mode": "yes"}], "guess_mode must be true or false"),
    ([{"model": "canny-xl", "image": _image(), "enabled": 1}], "enabled must be true or false"),
    ([{"model": "canny-xl", "image": b"<svg/>"}], "ControlNet image is not a PNG, JPEG or WebP"),
    ([{}, {"model": "depth-xl", "image": _image(), "resize_mode": "Stretch"}], "unit 1 resize_mode"),
])
def test_bad_units_are_named(value, message):
    with pytest.raises(RequestError, match=message):
        control_requests(value, (64, 64), LOADED) if message != "unit 1 resize_mode" else control_requests(
            [{"model": "canny-xl", "image": _image()}, value[1]], (64, 64), LOADED)


def test_a_request_carries_its_units():
    request = Request.of("a cat", size="64x64", controlnet=[{"model": "canny-xl", "image": _image()}],
                         controlnets=LOADED)
    assert len(request.controls) == 1 and request.controls[0].image.shape == (64, 64, 3)
    with pytest.raises(RequestError, match="no ControlNet is loaded"):
        Request.of("a cat", size="64x64", controlnet=[{"model": "canny-xl", "image": _image()}])
    with pytest.raises(RequestError, match="Hires. fix with ControlNet"):
        Request.of("a cat", size="64x64", hires=True, hires_scale=2.0,
                   controlnet=[{"model": "canny-xl", "image": _image()}], controlnets=LOADED)
