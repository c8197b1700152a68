"""PNG Info: the parameters of any image people bring (ours, AUTOMATIC1111's PNG and JPEG,
ComfyUI's workflow, Fooocus' JSON) as an A1111 parameters text that the paste path reads; files
that are not images, or carry hostile metadata, get a message, never a crash."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from parameters_texts import A1111, a1111_jpeg, comfyui_png, png_with_text
from sdxl_tpu.request.errors import RequestError
from sdxl_tpu.a1111.images import encode
from sdxl_tpu.a1111.infotext import parse, request_fields
from sdxl_tpu.a1111.png_info import png_info

def fooocus_png() -> bytes:
    parameters = {"prompt": "a red fox in the snow", "negative_prompt": "lowres", "steps": 30,
                  "sampler": "dpmpp_2m_sde_gpu", "scheduler": "karras", "guidance_scale": 4.0, "seed": "1234567",
                  "sharpness": 2.0,
                  "base_model": "juggernautXL_v8Rundiffusion", "base_model_hash": "aeb7e9e689",
                  "resolution": "(1024, 1024)", "version": "Fooocus v2.5.5"}
    return png_with_text({"parameters": json.dumps(parameters), "fooocus_scheme": "fooocus"})


def test_our_images_and_a1111s_are_read_as_written():
    image = Image.new("RGB", (64, 64), (1, 2, 3))
    for fmt in ("png", "jpeg", "webp"):
        found = png_info(encode(image, A1111, fmt))
        assert (found.text, found.source) == (A1111, "AUTOMATIC1111's parameters"), fmt
    assert png_info(png_with_text({"parameters": A1111})).text == A1111
    assert png_info(a1111_jpeg(A1111)).text == A1111


def test_comfyui_and_fooocus_images_become_a1111_parameters_the_paste_path_takes():
    found = png_info(comfyui_png())
    assert found.source == "ComfyUI's metadata (its first sampler)"
    assert found.text == ("a castle on a hill, sunset\nNegative prompt: blurry, watermark\nSteps: 20, "
                          "Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 8.0, Seed: 156680208700286, "
                          "Size: 64x64, Model: sd_xl_base_1.0.safetensors, RNG: CPU")
    fields, notes = request_fields(parse(found.text), [(64, 64)], ["Euler", "DPM++ 2M"])
    assert {k: fields[k] for k in ("prompt", "steps", "sampler", "schedule", "guidance_scale", "rng", "size")} == {
        "prompt": "a castle on a hill, sunset", "steps": 20, "sampler": "DPM++ 2M", "schedule": "Karras",
        "guidance_scale": 8.0, "rng": "CPU", "size": (64, 64)}
    assert any("Seed" in note for note in notes)  # ComfyUI's 64-bit seed: said, not used
    assert png_info(comfyui_png(sampler="euler", scheduler="normal", seed=5)).text.splitlines()[-1].startswith(
        "Steps: 20, Sampler: Euler, Schedule type: Uniform, CFG scale: 8.0, Seed: 5,")
    found = png_info(fooocus_png())
    assert found.text == ("a red fox in the snow\nNegative prompt: lowres\nSteps: 30, Sampler: DPM++ 2M SDE, "
                          "Schedule type: Karras, CFG scale: 4.0, Seed: 1234567, Size: 64x64, "
                          "Model: juggernautXL_v8Rundiffusion, RNG: CPU")


@pytest.mark.parametrize("data", [
    png_with_text({}),  # no metadata
    png_with_text({"prompt": "{not json", "workflow": "[1, 2"}),  # broken ComfyUI
    png_with_text({"prompt": "[" * 100_000 + "]" * 100_000, "workflow": "{}"}),  # nested past the parser's depth
    png_with_text({"prompt": json.dumps({"3": {"class_type": "KSampler", "inputs": {"positive": ["3", 0]}}}),
                   "workflow": json.dumps({"links": [[1, 3, 0, 3, 0, "CONDITIONING"]]})}),  # a node linked to itself
    png_with_text({"parameters": "{\"prompt\": 1}", "fooocus_scheme": "fooocus"}),  # Fooocus' keys missing
])
def test_images_without_readable_parameters_say_so(data):
    assert png_info(data).text is None


def test_files_that_are_not_images_are_refused_by_name():
    for data, message in [(b"<svg onload=alert(1)>", "PNG Info is not a PNG, JPEG or WebP image."),
                          (b"", "PNG Info is empty.")]:
        with pytest.raises(RequestError, match=message):
            png_info(data, "PNG Info")
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)
    assert png_info(encode(Image.fromarray(noise), "", "png")).text is None  # (an empty text says nothing)
