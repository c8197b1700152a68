"""The form's fields (request/fields.py) are the one list: everything that names a request's
parameters either derives from it or is checked against it here, so a field added there and
forgotten anywhere else fails a test that says where."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

from sdxl_tpu.request.fields import FIELDS, PASTED, PYTHON_NAMES

ROOT = Path(__file__).resolve().parents[2]
API = {f.api for f in FIELDS if f.api}


def keywords(function) -> set[str]:
    return {name for name, p in inspect.signature(function).parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name != "self"}


def test_a_request_takes_every_field_by_its_api_name():
    from sdxl_tpu.request.request import Request

    assert API <= keywords(Request.of), API - keywords(Request.of)


def test_pipeline_generate_takes_every_field():
    """Pipeline.generate's keywords are the fields' API names (PYTHON_NAMES where they differ),
    and the call's own: nothing missing, nothing extra."""
    from sdxl_tpu.generate.pipeline import Pipeline

    expected = {PYTHON_NAMES.get(name, name) for name in API} | {"latents", "progress", "wildcards"}
    assert keywords(Pipeline.generate) == expected, keywords(Pipeline.generate) ^ expected
    assert set(PYTHON_NAMES) <= API


def test_an_image_keeps_every_parameter_a_parameters_text_gives():
    """ImageInfo (what an image's infotext and history are written from) holds each field a pasted
    parameters text fills; the hires fix's settings in its Hires. (Its ControlNet units are written
    into the text but cannot be pasted back: a text holds no control image; its prompts' templates
    are written, and the paste fills the image's own prompts.)"""
    from sdxl_tpu.imaging.hires import Hires
    from sdxl_tpu.request.request import ImageInfo

    pasted = {f.api for f in FIELDS if PASTED in f.kept}
    info = {f.name for f in dataclasses.fields(ImageInfo)} - {"controls", "template", "negative_template"}
    assert {name for name in pasted if not name.startswith("hires_")} == info, \
        {name for name in pasted if not name.startswith("hires_")} ^ info
    hires = {f.name for f in dataclasses.fields(Hires)} - {"size"}
    assert {name.removeprefix("hires_") for name in pasted if name.startswith("hires_")} == hires


def test_the_command_line_has_an_option_for_each_field_named_as_the_form_names_it():
    from sdxl_tpu.cli.options import OPTIONS

    from sdxl_tpu.request.control import FORM_FIELDS

    generate = {o.name: o for o in OPTIONS if "generate" in o.commands}
    missing = [f.name for f in FIELDS if (f.api or f.name in FORM_FIELDS) and f.name not in generate]
    assert not missing, missing
    for f in FIELDS:
        if f.name in generate and f.choices and generate[f.name].choices is not None:
            assert tuple(generate[f.name].choices) == tuple(f.choices), f.name
        if f.name in FORM_FIELDS and f.default is not None:  # (the unit's: the page's defaults)
            assert generate[f.name].default == f.default, f.name


def test_the_back_ends_json_takes_every_field():
    from sdxl_tpu.routes.http_io import JSON_KEYS

    assert API <= set(JSON_KEYS)


def test_openai_bodies_take_every_field_but_those_of_its_own_shape():
    from sdxl_tpu.routes.openai_api import OPENAI_SHAPED, OWN_FIELDS

    assert set(OWN_FIELDS) | set(OPENAI_SHAPED) == API and set(OPENAI_SHAPED) <= API
    documented = (ROOT / "docs" / "openai.md").read_text()
    assert all(f"`{name}`" in documented for name in OWN_FIELDS), [n for n in OWN_FIELDS if f"`{n}`" not in documented]


def test_a1111s_api_maps_onto_every_field():
    """A txt2img body with a hires fix and an img2img body with a mask, each with everything
    A1111's API can say, give every field."""
    from sdxl_tpu.a1111.a1111_api import generation_fields

    txt2img = {"prompt": "a cat", "negative_prompt": "dog", "seed": 3, "steps": 8, "cfg_scale": 6,
               "width": 64, "height": 64, "sampler_name": "Euler", "scheduler": "Karras",
               "override_settings": {"randn_source": "CPU"}, "enable_hr": True, "hr_scale": 1.5,
               "hr_upscaler": "Latent", "hr_second_pass_steps": 4, "denoising_strength": 0.6,
               "alwayson_scripts": {"Dynamic Prompts v2.17.1": {"args": [True, True]}},
               "refiner_checkpoint": "sd_xl_refiner_1.0.safetensors [7440042bbd]", "refiner_switch_at": 0.7}
    img2img = {"prompt": "a cat", "init_images": ["x"], "denoising_strength": 0.5, "resize_mode": 1, "mask": "y",
               "mask_blur": 2, "inpainting_fill": 1, "inpaint_full_res": True, "inpaint_full_res_padding": 8}
    given = set(generation_fields(txt2img, False, "tiny", refiner="sd_xl_refiner_1.0")[0]) | set(
        generation_fields(img2img, True, "tiny")[0])
    assert API <= given, API - given


def test_every_pasted_field_comes_back_from_an_images_parameters_text():
    """An inpainting's and a hires fix's parameters text (what an image carries), read back: each
    field marked PASTED, with its value."""
    from sdxl_tpu.a1111.infotext import parameters_text, parse, request_fields
    from sdxl_tpu.imaging.hires import Hires
    from sdxl_tpu.request.request import ImageInfo

    common = dict(seed=7, prompt="a cat", negative_prompt="a dog", guidance_scale=6.5, steps=12, size=(64, 64),
                  sampler="Euler", schedule="Karras", rng="CPU")
    inpainting = ImageInfo(**common, strength=0.6, mask_blur=3, masked_content="fill", inpaint_area="Only masked",
                           mask_padding=16, refiner_switch_at=0.7)
    hires = ImageInfo(**common, hires=Hires(scale=1.5, upscaler="Lanczos", steps=5, strength=0.55, size=(96, 96)))
    read = {}
    for info in (inpainting, hires):
        fields, notes = request_fields(parse(parameters_text(info, "tiny")), [(64, 64), (96, 96)], ["Euler"])
        assert notes == ["Not used here: Model, Version."], notes  # (what ran it, not a field)
        read[info.hires is None] = fields
    pasted = {f.api for f in FIELDS if PASTED in f.kept}
    assert pasted <= set(read[True]) | set(read[False]), pasted - set(read[True]) - set(read[False])
    for name, value in {**common, "size": (64, 64)}.items():
        assert read[True][name] == value, name
    assert [read[True][k] for k in ("strength", "mask_blur", "masked_content", "inpaint_area", "mask_padding",
                                    "refiner_switch_at")] == [0.6, 3, "fill", "Only masked", 16, 0.7]
    assert [read[False][k] for k in ("hires", "hires_scale", "hires_upscaler", "hires_steps", "hires_strength")] == \
        [True, 1.5, "Lanczos", 5, 0.55]


THROWAWAY = r"""
import json, sys
from dataclasses import replace
from sdxl_tpu.request import fields as F

# A field added as docs/contributing.md says, its entry alone: an A1111 setting kept by the history
# and a pasted parameters text (before anything that reads the list is imported).
clip_skip = F.Field("clip_skip", "Clip skip", "whole", 1, api="clip_skip", optional=True, limits=(1, 12),
                    kept=frozenset({F.HISTORY, F.PASTED}), infotext="Clip skip", about="CLIP layers skipped.")
F.FIELDS = (*F.FIELDS, clip_skip)
F.FIELD, F.FORM, F.BY_API = {f.name: f for f in F.FIELDS}, tuple(f.name for f in F.FIELDS), {
    f.api: f for f in F.FIELDS if f.api}
from sdxl_tpu.routes import http_io, openai_api
from sdxl_tpu.a1111 import infotext
from sdxl_tpu.server import form
taken = {"back end's JSON": "clip_skip" in http_io.JSON_KEYS,
         "OpenAI's extra fields": "clip_skip" in openai_api.OWN_FIELDS,
         "parameters text keys": "Clip skip" in infotext.USED, "history": "clip_skip" in F.kept(F.HISTORY),
         "form's values": form.form_values(list(F.FORM))["clip_skip"] == "clip_skip"}
# What is not derived: each check of test_fields fails, and says which field.
import test_fields
caught = {}
for name in dir(test_fields):
    if name.startswith("test_") and name != "test_a_throwaway_field_is_taken_where_derived_and_named_where_not":
        try:
            getattr(test_fields, name)()
            caught[name] = None
        except AssertionError as e:
            caught[name] = str(e)
print(json.dumps({"taken": taken, "caught": caught}))
"""


def test_a_throwaway_field_is_taken_where_derived_and_named_where_not():
    """A field added to fields.py alone (in a process of its own): what derives from the list takes
    it; each place that must be written by hand fails its check here, naming the field."""
    path = ":".join(map(str, (ROOT, ROOT / "tests" / "request", ROOT / "tests" / "helpers")))
    done = subprocess.run([sys.executable, "-c", THROWAWAY], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(report["taken"].values()), report["taken"]
    must_fail = ("test_a_request_takes_every_field_by_its_api_name", "test_pipeline_generate_takes_every_field",
                 "test_an_image_keeps_every_parameter_a_parameters_text_gives",
                 "test_the_command_line_has_an_option_for_each_field_named_as_the_form_names_it",
                 "test_a1111s_api_maps_onto_every_field",
                 "test_openai_bodies_take_every_field_but_those_of_its_own_shape",
                 "test_every_pasted_field_comes_back_from_an_images_parameters_text")
    for name in must_fail:
        assert report["caught"][name] is not None and "clip_skip" in report["caught"][name], (name, report["caught"])
    assert report["caught"]["test_the_back_ends_json_takes_every_field"] is None  # (derived: nothing to write)
