"""Pasted AUTOMATIC1111 parameters: read as A1111 reads them, turned into this server's fields,
and anything else listed, never fatal; untrusted text gets a message, not an error."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sdxl_tpu.images import Stamp, parameters_text
from sdxl_tpu.infotext import parse, request_fields
from sdxl_tpu.page import PASTED_FIELDS, pasted_form
from sdxl_tpu.request import ImageInfo
from sdxl_tpu.scheduler import SAMPLERS

SIZES = [(1024, 1024), (1152, 896)]
# As A1111 1.10's PNG Info shows an SDXL image (its schedule apart from the sampler, a quoted value).
A1111_TEXT = """masterpiece, a (red:1.2) fox in the snow, <lora:detail:0.6>
night sky
Negative prompt: blurry, lowres
Steps: 30, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 6.5, Seed: 1234567890, Size: 1152x896, \
Model hash: 31e35c80fc, Model: sd_xl_base_1.0, Lora hashes: "detail: 0123456789ab", Version: v1.10.1"""


def test_a1111_text_fills_the_fields_and_lists_the_rest():
    parsed = parse(A1111_TEXT)
    assert parsed.prompt == "masterpiece, a (red:1.2) fox in the snow, <lora:detail:0.6>\nnight sky"
    assert parsed.negative_prompt == "blurry, lowres"
    assert parsed.settings["Lora hashes"] == "detail: 0123456789ab"  # quoted: its comma is no separator
    fields, notes = request_fields(parsed, SIZES, list(SAMPLERS))
    assert fields == {"prompt": "masterpiece, a (red:1.2) fox in the snow, night sky", "negative_prompt": "blurry, lowres",
                      "steps": 30, "guidance_scale": 6.5, "seed": 1234567890, "size": (1152, 896),
                      "sampler": "DPM++ 2M Karras"}
    assert notes == ["Not applied: <lora:detail:0.6> (LoRAs are loaded with the model here, not per prompt).",
                     "Not used here: Model hash, Model, Lora hashes, Version."]


def test_our_own_parameters_text_reads_back_exactly():
    info = ImageInfo(seed=7, prompt="a cät 🐈, (neon:1.3)", negative_prompt="模糊", guidance_scale=5.5, steps=20,
                     size=(1024, 1024), sampler="Euler a")
    fields, notes = request_fields(parse(parameters_text(info, Stamp("tiny"))), SIZES, list(SAMPLERS))
    assert fields == {"prompt": info.prompt, "negative_prompt": "模糊", "steps": 20, "guidance_scale": 5.5, "seed": 7,
                      "size": (1024, 1024), "sampler": "Euler a"}
    assert notes == ["Not used here: Model, Version."]


def test_what_cannot_be_used_is_named_not_fatal():
    text = "a cat\nSteps: 500, Sampler: DDIM, CFG scale: lots, Seed: -1, Size: 512x512, Clip skip: 2"
    fields, notes = request_fields(parse(text), SIZES, list(SAMPLERS))
    assert fields == {"prompt": "a cat", "negative_prompt": ""}
    assert notes == [
        "Not used: Steps: '500' (Steps must be a whole number between 1 and 50).",
        "Not used: CFG scale: 'lots' (not a number).",
        "Not used: Seed: '-1' (Seed must be a whole number between 0 and 4294967295).",
        "Not used: Size: '512x512' (this server offers 1024x1024, 1152x896).",
        "Not used: Sampler: 'DDIM' (this server offers Euler, Euler a, DPM++ 2M, DPM++ 2M Karras).",
        "Not used here: Clip skip."]
    # Fewer than three settings on the last line: it is prompt text, as A1111 decides.
    assert parse("a cat\nSteps: 20, Seed: 3").prompt == "a cat\nSteps: 20, Seed: 3"


def test_the_page_fills_its_form_and_says_what_it_did():
    form, notes = pasted_form(A1111_TEXT, SIZES, list(SAMPLERS))
    assert form == {"prompt": "masterpiece, a (red:1.2) fox in the snow, night sky", "negative": "blurry, lowres",
                    "seed": 1234567890, "randomize": False, "guidance": 6.5, "steps": 30, "sampler": "DPM++ 2M Karras",
                    "size": "1152x896"}
    assert set(form) <= set(PASTED_FIELDS)
    assert notes.startswith("Filled: prompt, negative, seed, guidance, steps, sampler, size. Not applied: <lora:")
    assert pasted_form("", SIZES, list(SAMPLERS))[0] == {}
    assert pasted_form(["a"], SIZES, list(SAMPLERS)) == ({}, "⚠️ Parameters must be text, got a list.")
    assert pasted_form("a\ud800b", SIZES, list(SAMPLERS))[1].startswith("⚠️ Parameters contain a lone surrogate")
    assert pasted_form("x" * 7000, SIZES, list(SAMPLERS))[1] == (
        "⚠️ Parameters are 7,000 characters long; at most 6,000 are read.")


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.text(st.sampled_from('abc:,"\\\n()<>-0123456789.x Negative prompt:'),
                                                  max_size=300),
                 st.none(), st.integers(), st.lists(st.text(max_size=5), max_size=3)))
def test_any_paste_gives_fields_or_a_message(text):
    form, notes = pasted_form(text, SIZES, list(SAMPLERS))
    assert isinstance(notes, str) and notes
    assert set(form) <= set(PASTED_FIELDS)
    if form:
        assert isinstance(form["prompt"], str) and form.get("size", "1024x1024") in ("1024x1024", "1152x896")
        assert form.get("sampler", "Euler") in SAMPLERS
