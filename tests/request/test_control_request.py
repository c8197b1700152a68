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
        {"model": "depth-xl", "image": _image(128), "guess_mode": True, "resize_mode": "Just resize"},
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


def test_a_request_spells_its_units_out_per_image_and_a_front_end_sends_them_processed():
    """Each image's info carries the units (a call's images share their settings, each request its
    images); a front end sends the processed image, its module named, and the back end takes it as
    it is: the same units."""
    from sdxl_tpu.server.remote import request_json

    unit = {"model": "canny-xl", "image": _image(), "module": "canny", "weight": 0.5, "threshold_a": 40,
            "threshold_b": 90, "resize_mode": "Crop and resize", "guidance_end": 0.7}
    request = Request.of("a cat", size="64x64", controlnet=[unit], controlnets=LOADED)
    infos = request.images(3)
    assert all(info.controls == request.controls for info in infos) and infos[2].controls[0].image is not None
    sent = request_json(request)["controlnet"]
    assert sent[0]["preprocessed"] is True and sent[0]["module"] == "canny"
    again = Request.of("a cat", size="64x64", controlnet=sent, controlnets=LOADED)
    assert again.controls == request.controls  # (the settings)
    np.testing.assert_array_equal(again.controls[0].image, request.controls[0].image)  # (not processed twice)
    # An IP-Adapter's unit: its image sent as the encoder's crop, read back the same; and the refiner's switch.
    prompt_unit = {"model": "ip-adapter_sdxl", "image": _image(), "module": "ip-adapter_clip_sdxl", "weight": 0.6}
    request = Request.of("a cat", size="64x64", controlnet=[prompt_unit], controlnets=(*LOADED, "ip-adapter_sdxl"),
                         ip_adapters=("ip-adapter_sdxl",))
    again = Request.of("a cat", size="64x64", controlnet=request_json(request)["controlnet"],
                       controlnets=(*LOADED, "ip-adapter_sdxl"), ip_adapters=("ip-adapter_sdxl",))
    assert again.controls == request.controls and request.controls[0].image.shape == (224, 224, 3)
    np.testing.assert_array_equal(again.controls[0].image, request.controls[0].image)
    assert request_json(Request.of("a cat", size="64x64", refiner_switch_at=0.7))["refiner_switch_at"] == 0.7


def test_sd_webui_controlnet_units_read_as_ours():
    """What A1111's clients send (webuiapi's ControlNetUnit, every field with its default; a model
    named "name [hash]") is the same unit as ours; what cannot be honoured is named."""
    import base64
    import io

    import webuiapi
    from PIL import Image

    from sdxl_tpu.a1111.a1111_api import generation_fields

    picture = Image.fromarray(_image())
    unit = webuiapi.ControlNetUnit(image=picture, module="canny", model="canny-xl [2b69fca4]", weight=0.8,
                                   threshold_a=60, threshold_b=160, guidance_end=0.9, resize_mode="Crop and Resize")
    idle = webuiapi.ControlNetUnit(enabled=False)
    body = {"prompt": "a cat", "width": 64, "height": 64,
            "alwayson_scripts": {"controlnet": {"args": [unit.to_dict(), idle.to_dict()]}}}
    fields, _, _ = generation_fields(body, img2img=False, model="tiny")
    theirs = Request.of("a cat", size="64x64", controlnet=fields["controlnet"], controlnets=LOADED).controls
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    ours = Request.of("a cat", size="64x64", controlnets=LOADED, controlnet=[
        {"model": "canny-xl", "image": base64.b64encode(buffer.getvalue()).decode(), "module": "canny",
         "weight": 0.8, "threshold_a": 60, "threshold_b": 160, "guidance_end": 0.9,
         "resize_mode": "Crop and resize"}]).controls
    assert theirs == ours and len(theirs) == 1
    np.testing.assert_array_equal(theirs[0].image, ours[0].image)
    for scripts, message in [
            ({"ADetailer": {"args": []}}, "alwayson_scripts 'ADetailer' is not offered"),
            ({"controlnet": {"args": "x"}}, "units in args"),
            ({"controlnet": {"args": [{**unit.to_dict(), "control_mode": "My prompt is more important"}]}},
             "control_mode 'My prompt is more important' is not offered"),
            ({"controlnet": {"args": [{**unit.to_dict(), "mask": "AAAA"}]}}, "ControlNet mask is not offered"),
            ({"controlnet": {"args": [{**unit.to_dict(), "resize_mode": 7}]}}, "resize_mode 7 is not one of")]:
        with pytest.raises(RequestError, match=message):
            generation_fields({**body, "alwayson_scripts": scripts}, img2img=False, model="tiny")


def test_the_parameters_text_names_each_unit_as_sd_webui_controlnet_does():
    from sdxl_tpu.a1111.infotext import parameters_text, parse

    request = Request.of("a cat", seed=3, size="64x64", controlnets=LOADED, controlnet=[
        {"model": "canny-xl", "image": _image(), "module": "canny", "weight": 0.8, "threshold_a": 60,
         "threshold_b": 160, "guidance_start": 0.1}, {"model": "depth-xl", "image": _image(), "guess_mode": True}])
    text = parameters_text(request.images(1)[0], "tiny")
    settings = parse(text).settings
    assert settings["ControlNet 0"] == ("Module: canny, Model: canny-xl, Weight: 0.8, Resize Mode: Crop and Resize, "
                                        "Threshold A: 60, Threshold B: 160, Guidance Start: 0.1, Guidance End: 1, "
                                        "Pixel Perfect: True, Control Mode: Balanced")
    assert settings["ControlNet 1"].startswith("Module: none, Model: depth-xl, Weight: 1, ")
    assert settings["ControlNet 1"].endswith("Guess Mode: True") and settings["Seed"] == "3"
