"""Pasted AUTOMATIC1111 parameters: read as A1111 reads them, turned into this server's fields,
and anything else listed, never fatal; untrusted text gets a message, not an error."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from sdxl_tpu.server.form import validate
from sdxl_tpu.server.offer import provisional
from sdxl_tpu.page.page import PASTED_INTO, pasted_form
from sdxl_tpu.server.settings import Settings
from sdxl_tpu.a1111.infotext import Stamp, parameters_text, parse, request_fields
from sdxl_tpu.request.load import LoadOptions
from sdxl_tpu.request.names import RNGS, SAMPLERS, SCHEDULES, resolve_schedule
from sdxl_tpu.request.request import ImageInfo

SIZES = [(1024, 1024), (1152, 896)]
# As A1111 1.10's PNG Info shows an SDXL image (its schedule apart from the sampler, a quoted value).
GPU_NOISE = ("Not reproducible here: A1111's default noise source (GPU), so RNG JAX is used; A1111's CPU noise is "
             "(RNG CPU).")
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
    assert fields == {"prompt": "masterpiece, a (red:1.2) fox in the snow, night sky",
                      "negative_prompt": "blurry, lowres",
                      "steps": 30, "guidance_scale": 6.5, "seed": 1234567890, "size": (1152, 896),
                      "sampler": "DPM++ 2M", "schedule": "Karras", "rng": "JAX"}
    assert notes == ["Not applied: <lora:detail:0.6> (LoRAs are loaded with the model here, not per prompt).",
                     GPU_NOISE, "Not used here: Model hash, Model, Lora hashes, Version."]


def test_the_loras_written_are_those_fused_not_those_typed():
    """A <lora:...> tag typed in the prompt is not applied (LoRAs are fused at start), so the text
    does not say it; each LoRA fused is written once, at its scale."""
    info = ImageInfo(seed=7, prompt="a cat <lora:style:0.5> on a mat <lora:foo:1>", negative_prompt="",
                     guidance_scale=5.0, steps=20, size=(1024, 1024), sampler="Euler")
    text = parameters_text(info, Stamp("tiny", loras=(("style", 0.8, "0123456789ab"),)))
    assert text.splitlines()[0] == "a cat on a mat <lora:style:0.8>" and text.count("<lora:") == 1
    assert parameters_text(info, "tiny").splitlines()[0] == "a cat on a mat"


def test_our_own_parameters_text_reads_back_exactly():
    info = ImageInfo(seed=7, prompt="a cät 🐈, (neon:1.3)", negative_prompt="模糊", guidance_scale=5.5, steps=20,
                     size=(1024, 1024), sampler="Euler a")
    fields, notes = request_fields(parse(parameters_text(info, Stamp("tiny"))), SIZES, list(SAMPLERS))
    assert fields == {"prompt": info.prompt, "negative_prompt": "模糊", "steps": 20, "guidance_scale": 5.5, "seed": 7,
                      "size": (1024, 1024), "sampler": "Euler a", "schedule": "Checkpoint", "rng": "JAX"}
    assert notes == ["Not used here: Model, Version."]
    for sampler, schedule, rng, read in [("DPM++ 2M", "Karras", "CPU", "Karras"),
                                         ("Euler", "SGM Uniform", "JAX", "SGM Uniform"),
                                         ("DPM++ 2M SDE", "Automatic", "CPU", "Exponential")]:  # (Automatic: as it ran)
        info = ImageInfo(seed=7, prompt="a cat", negative_prompt="", guidance_scale=5.0, steps=20, size=(1024, 1024),
                         sampler=sampler, schedule=schedule, rng=rng)
        fields, notes = request_fields(parse(parameters_text(info, Stamp("tiny"))), SIZES, list(SAMPLERS))
        assert (fields["sampler"], fields["schedule"], fields["rng"]) == (sampler, read, rng)
        assert notes == ["Not used here: Model, Version."]
    # Our texts from before the Schedule type and RNG were written: the checkpoint's schedule, JAX noise.
    old = ("a cat\nSteps: 20, Sampler: Euler a, CFG scale: 5, Seed: 7, Size: 1024x1024, Model: tiny, "
           "Version: sdxl-tpu 0.1.0")
    fields, notes = request_fields(parse(old), SIZES, list(SAMPLERS))
    assert (fields["sampler"], fields["schedule"], fields["rng"]) == ("Euler a", "Checkpoint", "JAX")
    assert notes == ["Not used here: Model, Version."]


def test_what_cannot_be_used_is_named_not_fatal():
    text = "a cat\nSteps: 500, Sampler: Heun, CFG scale: lots, Seed: -2, Size: 512x512, Clip skip: 2, RNG: NV"
    fields, notes = request_fields(parse(text), SIZES, list(SAMPLERS))
    assert fields == {"prompt": "a cat", "negative_prompt": "", "schedule": "Automatic", "rng": "JAX"}
    assert notes == [
        "Not used: Steps: '500' (Steps must be a whole number between 1 and 50).",
        "Not used: CFG scale: 'lots' (not a number).",
        "Not used: Seed: '-2' (Seed must be a whole number between -1 (random) and 4294967295).",
        "Not used: Size: '512x512' (this server offers 1024x1024, 1152x896).",
        f"Not used: Sampler: 'Heun' (this server offers {', '.join(SAMPLERS)}).",
        "Not reproducible here: A1111's RNG NV (NVIDIA's GPU noise), so RNG JAX is used; "
        "A1111's CPU noise is (RNG CPU).",
        "Not used here: Clip skip."]
    # Fewer than three settings on the last line: it is prompt text, as A1111 decides.
    assert parse("a cat\nSteps: 20, Seed: 3").prompt == "a cat\nSteps: 20, Seed: 3"


def test_a_pasted_seed_of_minus_one_is_read_as_random_seeds():
    """A1111 writes no -1 in its images, but people paste "Seed: -1" (its random seed) from
    their own notes: the form gets -1, so each run draws a seed; the images name the seeds used."""
    text = "a cat\nSteps: 20, Sampler: Euler, CFG scale: 5, Seed: -1, Size: 1024x1024"
    fields, notes = request_fields(parse(text), SIZES, list(SAMPLERS))
    assert fields["seed"] == -1 and not [n for n in notes if "Seed" in n]
    form, _ = pasted_form(text, SIZES, list(SAMPLERS))
    assert (form["seed"], form["randomize"]) == (-1, False)
    offer = provisional(Settings(load=LoadOptions(model="tiny", sizes=SIZES)))
    first, second = (validate({**form, "style": "(No style)"}, offer) for _ in range(2))
    assert first.seed != second.seed  # (equal once in 2**32)
    info = first.images(1)[0]
    assert f"Seed: {info.seed}, " in parameters_text(info, "tiny") and info.seed >= 0


def test_the_page_fills_its_form_and_says_what_it_did():
    form, notes = pasted_form(A1111_TEXT, SIZES, list(SAMPLERS))
    assert form == {"prompt": "masterpiece, a (red:1.2) fox in the snow, night sky", "negative": "blurry, lowres",
                    "seed": 1234567890, "randomize": False, "guidance": 6.5, "steps": 30, "sampler": "DPM++ 2M",
                    "schedule": "Karras", "size": "1152x896", "rng": "JAX"}
    assert set(form) <= set(PASTED_INTO)
    assert notes.startswith("Filled: prompt, negative, seed, guidance, steps, size, sampler, schedule, rng. "
                            "Not applied: <lora:")
    # A prompt alone (no settings line) fills the prompt only: the form keeps its schedule and noise.
    assert pasted_form("a cat, night", SIZES, list(SAMPLERS)) == ({"prompt": "a cat, night", "negative": ""},
                                                                  "Filled: prompt, negative.")
    assert pasted_form("Steps: x, Foo: 1, Bar: 2", SIZES, list(SAMPLERS))[1].startswith("⚠️ Nothing to use")
    assert pasted_form("", SIZES, list(SAMPLERS))[0] == {}
    assert pasted_form(["a"], SIZES, list(SAMPLERS)) == ({}, "⚠️ Parameters must be text, got a list.")
    assert pasted_form("a\ud800b", SIZES, list(SAMPLERS))[1].startswith("⚠️ Parameters contain a lone surrogate")
    assert pasted_form("x" * 60_001, SIZES, list(SAMPLERS))[1] == (
        "⚠️ Parameters are 60,001 characters long; at most 60,000 are read.")


def test_the_longest_text_read_is_read_at_once():
    """Every start of a word scanned the rest of its line for a key's colon: 60,000 characters of
    words took half a minute (the longest text read: two prompts and a settings line)."""
    import time

    for line in ("word " * 12_000, "a" * 60_000, 'Steps: "' + "a " * 29_995):
        start = time.perf_counter()
        assert parse(line[:60_000]).settings == {}
        assert time.perf_counter() - start < 2, line[:20]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.text(st.sampled_from('abc:,"\\\n()<>-0123456789.x Negative prompt:'),
                                                  max_size=300),
                 st.lists(st.sampled_from(["a cat\n", "Steps: 3, ", "Sampler: ", "DDIM", "DPM++ 2M", "Euler a",
                                           " Karras", "Schedule type: ", "karras", "SGM Uniform", "Exponential",
                                           "Checkpoint", "RNG: ", "CPU", "NV", "Version: sdxl-tpu 0.1.0", ", ",
                                           "Seed: 5, "]),
                          max_size=20).map("".join),
                 st.none(), st.integers(), st.lists(st.text(max_size=5), max_size=3)))
def test_any_paste_gives_fields_or_a_message(text):
    form, notes = pasted_form(text, SIZES, list(SAMPLERS))
    assert isinstance(notes, str) and notes
    assert set(form) <= set(PASTED_INTO)
    if form:
        assert isinstance(form["prompt"], str) and form.get("size", "1024x1024") in ("1024x1024", "1152x896")
        assert form.get("sampler", "Euler") in SAMPLERS
        assert form.get("schedule", "Checkpoint") in SCHEDULES and form.get("rng", "JAX") in RNGS
        if "sampler" in form and "schedule" in form:
            resolve_schedule(form["sampler"], form["schedule"])  # a combination that runs


def settings_of(line: str, samplers=SAMPLERS) -> tuple[dict, list[str]]:
    """The sampler, schedule and rng a settings line gives, and the notes about them."""
    fields, notes = request_fields(parse(f"a cat\nSteps: 20, Seed: 1, {line}"), SIZES, list(samplers))
    return {k: fields[k] for k in ("sampler", "schedule", "rng") if k in fields}, notes


@pytest.mark.parametrize("line, expected", [
    # Without a Schedule type: A1111's Automatic (it writes none for that); ours meant the checkpoint's.
    ("Sampler: Euler a", {"sampler": "Euler a", "schedule": "Automatic"}),
    ("Sampler: Euler a, Version: sdxl-tpu 0.1.0", {"sampler": "Euler a", "schedule": "Checkpoint"}),
    ("Sampler: DPM++ 2M, Schedule type: Karras", {"sampler": "DPM++ 2M", "schedule": "Karras"}),
    # Old A1111 names (before 1.9): a sampler of its own here; or the sampler with the schedule it names.
    ("Sampler: DPM++ 2M Karras", {"sampler": "DPM++ 2M Karras", "schedule": "Automatic"}),
    ("Sampler: DPM++ 2M SDE Karras", {"sampler": "DPM++ 2M SDE Karras", "schedule": "Automatic"}),
    ("Sampler: DPM++ 2M SDE Exponential", {"sampler": "DPM++ 2M SDE", "schedule": "Exponential"}),
    # Any case, and ComfyUI's names of the same schedules.
    ("Sampler: Euler, Schedule type: karras", {"sampler": "Euler", "schedule": "Karras"}),
    ("Sampler: Euler, Schedule type: EXPONENTIAL", {"sampler": "Euler", "schedule": "Exponential"}),
    ("Sampler: Euler, Schedule type: sgm_uniform", {"sampler": "Euler", "schedule": "SGM Uniform"}),
    ("Sampler: Euler, Schedule type: normal", {"sampler": "Euler", "schedule": "Uniform"}),
    ("Sampler: DDIM, Schedule type: Automatic", {"sampler": "DDIM", "schedule": "Automatic"}),
    ("Schedule type: SGM Uniform", {"schedule": "SGM Uniform"}),
])
def test_the_schedule_is_read_as_its_author_ran_it(line, expected):
    fields, notes = settings_of(line)
    assert {k: v for k, v in fields.items() if k != "rng"} == expected
    assert [n for n in notes if not n.startswith("Not reproducible")] == (
        ["Not used here: Version."] if "Version" in line else [])


@pytest.mark.parametrize("line, expected, note", [
    ("Sampler: DDIM, Schedule type: Karras", {"sampler": "DDIM"},
     "Not used: Schedule type: 'Karras' (DDIM runs on its own timesteps: choose Schedule type Checkpoint or Automatic, "
     "not Karras)."),
    ("Sampler: DPM++ 2M Karras, Schedule type: Exponential", {"sampler": "DPM++ 2M Karras"},
     "Not used: Schedule type: 'Exponential' (DPM++ 2M Karras names its schedule (Karras): for Schedule type "
     "Exponential choose DPM++ 2M)."),
    ("Sampler: Euler, Schedule type: Beta", {"sampler": "Euler"},
     f"Not used: Schedule type: 'Beta' (this server offers {', '.join(SCHEDULES)})."),
    ("Sampler: Euler, Schedule type: simple", {"sampler": "Euler"},  # (ComfyUI's own: not one of these)
     f"Not used: Schedule type: 'simple' (this server offers {', '.join(SCHEDULES)})."),
    ("Sampler: Heun, Schedule type: Karras", {"schedule": "Karras"},
     f"Not used: Sampler: 'Heun' (this server offers {', '.join(SAMPLERS)})."),
])
def test_a_schedule_that_cannot_run_is_named_and_the_form_keeps_its_own(line, expected, note):
    fields, notes = settings_of(line)
    assert {k: v for k, v in fields.items() if k != "rng"} == expected
    assert note in notes


@pytest.mark.parametrize("line, rng, note", [
    ("RNG: CPU", "CPU", None),
    ("RNG: cpu", "CPU", None),
    ("RNG: JAX, Version: sdxl-tpu 0.1.0", "JAX", None),
    ("Version: sdxl-tpu 0.1.0", "JAX", None),  # ours, from before RNG was written: JAX noise
    ("Sampler: Euler", "JAX", GPU_NOISE),  # A1111's default: GPU noise, which no CPU or TPU makes
    ("RNG: GPU", "JAX", GPU_NOISE),
    ("RNG: NV", "JAX", "Not reproducible here: A1111's RNG NV (NVIDIA's GPU noise), so RNG JAX is used; A1111's "
                       "CPU noise is (RNG CPU)."),
    ("RNG: Philox", "JAX", "Not used: RNG: 'Philox' (this server offers JAX, CPU; JAX is used)."),
])
def test_the_noise_source_is_read_or_said_to_be_out_of_reach(line, rng, note):
    fields, notes = settings_of(line)
    assert fields["rng"] == rng
    assert [n for n in notes if "RNG" in n] == ([note] if note else [])


def test_image_settings_paste_back_and_are_dropped_where_the_request_cannot_use_them():
    """Denoising strength, Mask blur, Masked content and the hires fix's keys, as A1111 writes them
    and as our images carry them, fill their fields; with a hires fix the strength is its pass's. A
    request without an image (or mask) drops img2img's (inpainting's) settings, one with an image
    a pasted hires fix."""
    from sdxl_tpu.imaging.hires import Hires
    from sdxl_tpu.a1111.infotext import usable

    info = ImageInfo(seed=3, prompt="a cat", negative_prompt="", guidance_scale=5.0, steps=20, size=(1024, 1024),
                     sampler="Euler", strength=0.6, mask_blur=8, masked_content="latent noise")
    fields, notes = request_fields(parse(parameters_text(info, Stamp("tiny"))), SIZES, list(SAMPLERS))
    assert (fields["strength"], fields["mask_blur"], fields["masked_content"]) == (0.6, 8, "latent noise")
    assert "Not used here: Model, Version." in notes, notes  # (nothing of the image's settings)
    hires = ImageInfo(seed=3, prompt="a cat", negative_prompt="", guidance_scale=5.0, steps=20, size=(1024, 1024),
                      sampler="Euler", hires=Hires(1.5, "Lanczos", 10, 0.45, (1536, 1536)))
    fields, _ = request_fields(parse(parameters_text(hires, Stamp("tiny"))), SIZES, list(SAMPLERS))
    assert {k: fields[k] for k in fields if k.startswith("hires")} == {
        "hires": True, "hires_scale": 1.5, "hires_upscaler": "Lanczos", "hires_steps": 10, "hires_strength": 0.45}
    assert "strength" not in fields
    a1111 = "a dog\nSteps: 20, Sampler: Euler, Seed: 1, Denoising strength: 0.7, Hires upscale: 2, " \
            "Hires upscaler: R-ESRGAN 4x+"
    fields, notes = request_fields(parse(a1111), SIZES, list(SAMPLERS))
    assert fields["hires_scale"] == 2.0 and "hires_upscaler" not in fields
    assert any(n.startswith("Not used: Hires upscaler: 'R-ESRGAN 4x+'") for n in notes), notes
    pasted = {"strength": 0.6, "mask_blur": 8, "hires": True, "hires_scale": 2.0, "steps": 3}
    assert usable(pasted, {}) == {"hires": True, "hires_scale": 2.0, "steps": 3}
    assert usable(pasted, {"image": "x"}) == {"strength": 0.6, "steps": 3}
    assert usable(pasted, {"image": "x", "mask": "y"}) == {"strength": 0.6, "mask_blur": 8, "steps": 3}
