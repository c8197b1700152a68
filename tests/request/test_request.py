"""The one request type and its rules (sdxl_tpu.request.request), shared by the API, the CLI and the
playground: the same value gets the same message wherever it comes in."""

from __future__ import annotations

import numpy as np
import pytest

from sdxl_tpu.server.form import validate
from sdxl_tpu.server.offer import provisional
from sdxl_tpu.server.settings import Settings
from sdxl_tpu.request.errors import RequestError
from sdxl_tpu.request.fields import MAX_SEED
from sdxl_tpu.request.load import LoadOptions
from sdxl_tpu.request.request import Request
from sdxl_tpu.request.values import parse_size, size_input

SIZES = [(64, 64), (96, 64)]


def test_a_request_spelled_out_per_image():
    request = Request.of(["a", "b"], "blurry", seed=MAX_SEED, guidance_scale=(1, 7.5), steps=3.0, size="96x64")
    assert request.steps == 3 and isinstance(request.steps, int) and request.size == (96, 64)
    images = request.images(2)
    assert [i.prompt for i in images] == ["a", "b"] and [i.negative_prompt for i in images] == ["blurry"] * 2
    assert [i.seed for i in images] == [MAX_SEED, 0]  # base + i, wrapping within 32 bits
    assert [i.guidance_scale for i in images] == [1.0, 7.5]
    with pytest.raises(RequestError, match=r"^Prompt: got 2 values for 4 images\.$"):
        request.images(4)
    assert Request.of("a", seed=[5, 9]).images(2)[1].seed == 9  # one seed per image, as given
    with pytest.raises(RequestError, match=r"^Guidance scale: a list of per-image values must not be empty\.$"):
        Request.of("a", guidance_scale=[])
    with pytest.raises(RequestError,
                       match=r"^Seed must be a whole number between -1 \(random\) and 4294967295, got a list\.$"):
        Request.of("a", seed=[5, 9], per_image=False)  # a form: one value per field


def test_random_seed_is_drawn_once_per_request():
    seeds = {Request.of("a").seed for _ in range(8)}
    assert len(seeds) > 1 and all(isinstance(s, int) and 0 <= s <= MAX_SEED for s in seeds)
    request = Request.of("a")
    assert request.images(2) == request.images(2)  # drawn when checked, not when spelled out


def test_seed_minus_one_is_a_random_seed_as_in_a1111():
    first, second = Request.of("a", seed=-1).seed, Request.of("a", seed=-1.0).seed
    assert first != second and all(0 <= s <= MAX_SEED for s in (first, second))  # (equal once in 2**32)
    fixed, drawn, other = Request.of("a", seed=[5, -1, -1]).images(3)  # per image: -1 draws that image's
    assert fixed.seed == 5 and drawn.seed != other.seed and min(drawn.seed, other.seed) >= 0
    with pytest.raises(RequestError, match=r"^Seed must be a whole number between -1 \(random\) and 4294967295\.$"):
        Request.of("a", seed=-2)


@pytest.mark.parametrize("value, size", [("1024x1024", (1024, 1024)), (" 96X64 ", (96, 64)), ((64, 96), (64, 96)),
                                         ([8, 16], (8, 16)), ((np.int64(64), 64), (64, 64))])
def test_sizes_as_text_or_pairs(value, size):
    assert parse_size(value) == size


@pytest.mark.parametrize("value, message", [
    ("64", "Size must look like WIDTHxHEIGHT (e.g. 1024x1024), got '64'."),
    ("١٠x١٠", "Size must look like WIDTHxHEIGHT"),  # non-ASCII digits are not sizes
    ("9" * 50 + "x1", "Size must look like WIDTHxHEIGHT"),
    ((True, 64), "Size must be WIDTHxHEIGHT text or a (width, height) pair, got a list."),
    (64, "Size must be WIDTHxHEIGHT text or a (width, height) pair, got a number."),
])
def test_sizes_refused_with_the_reason(value, message):
    with pytest.raises(RequestError) as info:
        parse_size(value)
    assert str(info.value).startswith(message)


def test_only_available_sizes_are_accepted():
    assert size_input("96x64", SIZES) == (96, 64) and size_input((64, 64), SIZES) == (64, 64)
    for value, message in [("128x128", "Size '128x128' is not available; choose one of: 64x64, 96x64."),
                           ((128, 128), "Size 128x128 is not available; choose one of: 64x64, 96x64."),
                           (["64x64"], "Size must be text, got a list; choose one of: 64x64, 96x64.")]:
        with pytest.raises(RequestError) as info:
            size_input(value, SIZES)
        assert str(info.value) == message


@pytest.mark.parametrize("field, value", [("seed", -2), ("seed", 1.5), ("seed", "7"), ("seed", True),
                                          ("guidance_scale", float("nan")), ("guidance_scale", 21),
                                          ("steps", 0), ("steps", 51), ("steps", 2.5), ("size", "1024x1024"),
                                          ("prompt", 7), ("prompt", "\t"), ("negative_prompt", 3),
                                          ("sampler", "Heun"), ("sampler", 2), ("sampler", ["Euler"]),
                                          ("schedule", "Beta"), ("schedule", "karras"), ("schedule", 1),
                                          ("rng", "NV"), ("rng", ["CPU"]), ("pair", ("DDIM", "Karras")),
                                          ("pair", ("DPM++ 2M SDE Karras", "Exponential"))])
def test_the_playground_and_the_api_give_the_same_message(field, value):
    api = dict(prompt="a cat", negative_prompt="", seed=3, guidance_scale=5.0, steps=20, size="64x64", sampler=None,
               schedule=None, rng=None)
    ui = dict(prompt="a cat", negative="", style="(No style)", seed=3, randomize=False, guidance=5.0, steps=20,
              size="64x64", sampler=None, schedule=None, rng=None)
    if field == "pair":  # a sampler and a Schedule type, each valid, together not
        api["sampler"], api["schedule"] = ui["sampler"], ui["schedule"] = value
    else:
        api[field] = value
        ui[{"negative_prompt": "negative", "guidance_scale": "guidance"}.get(field, field)] = value
    with pytest.raises(RequestError) as from_api:
        Request.of(api.pop("prompt"), api.pop("negative_prompt"), sizes=SIZES, **api)
    with pytest.raises(RequestError) as from_ui:
        validate(ui, provisional(Settings(load=LoadOptions(model="tiny", sizes=SIZES))))
    assert str(from_ui.value) == str(from_api.value)


def test_a_starting_image_in_each_form_a_client_sends_it():
    """PIL, an array, a file's bytes, base64 bare or in a data: URL (line breaks too): one fitted
    image at the request's size; the strength defaults to A1111's 0.75; the image is no part of a
    request's equality (its fields are)."""
    import base64
    import io

    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (64, 96, 3), np.uint8)
    png = io.BytesIO()
    Image.fromarray(pixels).save(png, "PNG")
    text = base64.b64encode(png.getvalue()).decode()
    forms = [Image.fromarray(pixels), pixels, png.getvalue(), text, "data:image/webp;base64," + text,
             "\n".join(text[i:i + 76] for i in range(0, len(text), 76))]
    for form in forms:
        request = Request.of("a cat", seed=1, size="96x64", image=form)
        assert request.strength == 0.75 and request.image.dtype == np.uint8
        np.testing.assert_array_equal(request.image, pixels)  # (already its size: as it is)
        assert request == Request.of("a cat", seed=1, size="96x64", strength=0.75, image=np.zeros_like(pixels))
    fitted = Request.of("a cat", size="64x64", image=pixels, resize_mode="Crop and resize", strength=0).image
    assert fitted.shape == (64, 64, 3)
    for form, message in ((np.zeros((64, 64), np.uint8), r"Image as an array must be \(height, width, 3\) uint8"),
                          ("data:;base64", "Image: a data: URL must hold base64"), ("", "Image is empty.")):
        with pytest.raises(RequestError, match=message):
            Request.of("a cat", size="64x64", image=form)


def test_a_resize_mode_is_checked_with_or_without_an_image():
    """Without an image a resize mode is unused, yet a wrong one is still refused by name (no bad
    value passes silently); the command line's default one is taken."""
    with pytest.raises(RequestError, match="Resize mode"):
        Request.of("a cat", size=(64, 64), sizes=[(64, 64)], resize_mode="nope")
    assert Request.of("a cat", size=(64, 64), sizes=[(64, 64)], resize_mode="Just resize").image is None
