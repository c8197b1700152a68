"""The back end (`python -m sdxl_tpu serve --model tiny`) over plain HTTP on 127.0.0.1: its API,
its refusals (4xx naming the problem, 503 + Retry-After when full or draining), no recompiles,
and a drain on SIGTERM with work in flight."""

from __future__ import annotations

import base64
import http.client
import io
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from hostile_values import NOT_BOOL, NOT_CHOICE, NOT_NUMBER, NOT_TEXT
from images import block_mask, encoded, hostile_files, hostile_masks, picture
from reference import psnr, read_with_third_parties
from served_app import get, read_metrics, requests_total, start_backend, wait_for
from sdxl_tpu.routes.http_io import MAX_BODY_BYTES
from sdxl_tpu.request.names import RNGS, SAMPLERS, SCHEDULES
from sdxl_tpu.version import VERSION

QUEUE_SIZE = 1
A1111, OPENAI = "/sdapi/v1/txt2img", "/v1/images/generations"


@pytest.fixture(scope="module")
def backend(tmp_path_factory, compile_cache, tiny_controlnet, tiny_ip_adapter):
    """One back end for the module, with the ControlNet "edges" and the IP-Adapter "ip-adapter_sdxl";
    its last test stops it (SIGTERM)."""
    adapter, encoder = tiny_ip_adapter
    yield from start_backend(tmp_path_factory.mktemp("backend"), compile_cache,
                             extra_args=("--queue-size", str(QUEUE_SIZE), "--image-format", "webp",
                                         "--drain-seconds", "60", "--controlnet", str(tiny_controlnet),
                                         "--ip-adapter", str(adapter), "--image-encoder", str(encoder)))


def post(backend, body: bytes | str | dict, headers: dict[str, str] | None = None,
         timeout: float = 120, path: str = "/v1/generate") -> tuple[int, dict[str, str], bytes]:
    """POST /v1/generate (or `path`): (status, headers, body)."""
    data = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
    connection = http.client.HTTPConnection("127.0.0.1", backend["port"], timeout=timeout)
    try:
        connection.request("POST", path, body=data,
                           headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def metrics(backend) -> dict[str, float]:
    return read_metrics(backend["url"] + "/metrics")


def test_ready_after_warm_up_and_describes_itself(backend):
    assert backend["readiness"][0] == 503 and backend["readiness"][-1] == 200
    assert get(backend["url"] + "/healthz") == (200, '{"status":"alive"}')
    status, text = get(backend["url"] + "/v1/info")
    assert status == 200
    assert json.loads(text) == {"model": "tiny", "sizes": ["64x64"], "samplers": list(SAMPLERS),
                                "default_sampler": "Euler",
                                "preset": None, "presets": ["Quality", "Balanced", "Fast"], "images_per_call": 4,
                                "image_format": "webp", "max_prompt_chunks": 3, "schedules": list(SCHEDULES),
                                "default_schedule": "Checkpoint", "rngs": list(RNGS), "default_rng": "JAX",
                                "loras": [], "controlnets": ["edges", "ip-adapter_sdxl"],
                                "ip_adapters": ["ip-adapter_sdxl"], "embeddings": [], "skipped_embeddings": [],
                                "upscalers": [], "refiner": None}


def test_generate_answers_four_images_with_their_parameters(backend, tmp_path):
    from PIL import Image

    from sdxl_tpu.a1111.images import read_parameters

    status, headers, body = post(backend, {"prompt": "a cat, 夜の街 ✨", "negative_prompt": "blurry, größte",
                                           "seed": 7, "guidance_scale": 4.5, "steps": 2, "size": "64x64",
                                           "sampler": "DPM++ 2M Karras"})
    assert status == 200 and headers["content-type"] == "application/json", body
    answer = json.loads(body)
    assert set(answer) == {"images", "parameters", "seeds", "sampler", "schedule", "rng", "format", "timings"}
    expected = [f"a cat, 夜の街 ✨\nNegative prompt: blurry, größte\nSteps: 2, Sampler: DPM++ 2M Karras, "
                f"Schedule type: Checkpoint, CFG scale: 4.5, Seed: {seed}, Size: 64x64, Model: tiny, RNG: JAX, "
                f"Version: sdxl-tpu {VERSION}" for seed in (7, 8, 9, 10)]
    assert answer["parameters"] == expected and answer["seeds"] == [7, 8, 9, 10]
    blobs = [base64.b64decode(data, validate=True) for data in answer["images"]]
    images = [Image.open(io.BytesIO(blob)) for blob in blobs]
    assert [(i.format, i.size) for i in images] == [("WEBP", (64, 64))] * 4
    assert [read_parameters(i) for i in images] == expected  # embedded in each file
    # ... as readers nobody here wrote read them (A1111's own: piexif)
    assert read_with_third_parties(blobs[1], tmp_path) == {
        "prompt": "a cat, 夜の街 ✨", "negative": "blurry, größte", "sampler": "DPM++ 2M Karras",
        "scheduler": "Checkpoint", "steps": "2",
        "cfg_scale": "4.5", "seed": "8", "size": "64x64", "model": "tiny", "model_hash": None,
        "user_comment": expected[1]}
    assert answer["sampler"] == "DPM++ 2M Karras" and answer["format"] == "webp"
    assert (answer["schedule"], answer["rng"]) == ("Checkpoint", "JAX")  # left out: the server's defaults
    # An A1111 parameters text as a field: it fills what it says, the fields given win, the rest is noted.
    status, _, body = post(backend, {"parameters": "a fox <lora:x:1>\nNegative prompt: fog\nSteps: 2, "
                                                   "Sampler: Euler a, CFG scale: 3, Seed: 99, Size: 64x64, "
                                                   "Clip skip: 2, RNG: CPU",
                                     "seed": 5, "schedule": "Checkpoint"})
    answer = json.loads(body)
    assert status == 200 and answer["seeds"] == [5, 6, 7, 8], body[:500]
    assert answer["parameters"][0].splitlines() == [
        "a fox", "Negative prompt: fog",
        "Steps: 2, Sampler: Euler a, Schedule type: Checkpoint, CFG scale: 3, Seed: 5, Size: 64x64, Model: tiny, "
        f"RNG: CPU, Version: sdxl-tpu {VERSION}"]
    assert answer["notes"] == ["Not applied: <lora:x:1> (LoRAs are loaded with the model here, not per prompt).",
                               "Not used here: Clip skip."]
    assert (answer["sampler"], answer["schedule"], answer["rng"]) == ("Euler a", "Checkpoint", "CPU")
    assert set(answer["timings"]) == {"text_encoding", "denoising", "decoding", "total", "encoding"}
    assert all(v >= 0 for v in answer["timings"].values())
    # Only the prompt is needed: the rest takes the server's defaults (Euler, its one size).
    status, _, body = post(backend, {"prompt": "a dog", "steps": 1})
    answer = json.loads(body)
    assert status == 200 and len(answer["images"]) == 4 and answer["sampler"] == "Euler"
    assert all(0 <= s < 2**32 for s in answer["seeds"])
    # A prompt past the token budget is cut, not refused: 20,000 characters (about 5,000 tokens).
    status, _, body = post(backend, {"prompt": ("a dog, " * 3000)[:20_000], "negative_prompt": "ü" * 20_000,
                                     "steps": 1})
    assert status == 200 and len(json.loads(body)["images"]) == 4, body[:300]
    # Seed -1, as in A1111: a random seed each call; the parameters name the seeds used.
    answers = [json.loads(post(backend, {"prompt": "a dog", "steps": 1, "seed": -1})[2]) for _ in range(2)]
    assert answers[0]["seeds"] != answers[1]["seeds"] and all(0 <= s < 2**32 for a in answers for s in a["seeds"])
    assert all(f"Seed: {s}," in p for a in answers for s, p in zip(a["seeds"], a["parameters"], strict=True))


def test_progress_and_previews_are_streamed_as_server_sent_events(backend):
    """Each step's progress, a live preview of the four images every few steps (small JPEGs; for 3
    steps after steps 1 and 2), then the result; a caller who does not stream gets the same images."""
    from PIL import Image

    status, headers, body = post(backend, {"prompt": "a cat", "seed": 1, "steps": 3},
                                 headers={"Accept": "text/event-stream"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [(block.split("\n")[0][len("event: "):], json.loads(block.split("\n")[1][5:]))
              for block in body.decode().split("\n\n") if block.startswith("event:")]
    assert [(name, data["step"]) for name, data in events[:-1]] == [
        ("progress", 1), ("preview", 1), ("progress", 2), ("preview", 2), ("progress", 3)]
    assert all(data["steps"] == 3 for _, data in events[:-1])
    for _, preview in (e for e in events if e[0] == "preview"):
        assert len(preview["images"]) == 4
        for text in preview["images"]:
            with Image.open(io.BytesIO(base64.b64decode(text))) as image:
                assert image.format == "JPEG" and image.size == (8, 8)  # latent resolution: 64 / 8
    assert events[-1][0] == "result"
    result = events[-1][1]
    assert result["seeds"] == [1, 2, 3, 4] and len(result["images"]) == 4
    status, _, plain = post(backend, {"prompt": "a cat", "seed": 1, "steps": 3})
    assert status == 200 and json.loads(plain)["images"] == result["images"]


@pytest.mark.parametrize("body, status, message", [
    (b'{"prompt": "a cat",', 400, "The request body must be a JSON object: Expecting"),
    (b"\xff\xfe\x00", 400, "The request body must be a JSON object"),
    (b"[" * 20000, 400, "The request body must be a JSON object"),
    (b'["a cat"]', 400, "The request body must be a JSON object, got a list."),
    (b'"a cat"', 400, "The request body must be a JSON object, got text."),
    ({"prompt": "a cat", "stpes": 3}, 422, "Unknown field 'stpes'; the fields are: prompt, negative_prompt, seed,"),
    ({"prompt": "a cat", "scheduler": "Karras"}, 422, "Unknown field 'scheduler'; the fields are: prompt,"),
    ({"steps": 3}, 422, "The field 'prompt' is required."),
    ({"prompt": 5}, 422, "Prompt must be text, got a number."),
    ({"prompt": "a cat", "steps": "3"}, 422, "Steps must be a whole number between 1 and 50, got text."),
    ({"prompt": "a cat", "steps": 2.5}, 422, "Steps must be a whole number between 1 and 50."),
    ({"prompt": "a cat", "seed": True}, 422,
     "Seed must be a whole number between -1 (random) and 4294967295, got true/false."),
    ({"prompt": "a cat", "guidance_scale": [1, 2]}, 422, "Guidance scale: got 2 values for 4 images."),
    ({"prompt": "a cat", "size": "1024x1024"}, 422, "Size '1024x1024' is not available; choose one of: 64x64."),
    ({"prompt": "a cat", "sampler": "LMS"}, 422, "Sampler 'LMS' is not available; choose one of: Euler,"),
    ({"prompt": "a cat", "schedule": "Beta"}, 422,
     f"Schedule type 'Beta' is not available; choose one of: {', '.join(SCHEDULES)}."),
    ({"prompt": "a cat", "schedule": ["Karras"]}, 422, "Schedule type must be text, got a list;"),
    ({"prompt": "a cat", "rng": "NV"}, 422, "RNG 'NV' is not available; choose one of: JAX, CPU."),
    ({"prompt": "a cat", "rng": 0}, 422, "RNG must be text, got a number; choose one of: JAX, CPU."),
    ({"prompt": "a cat", "sampler": "DDIM", "schedule": "Karras"}, 422,
     "DDIM runs on its own timesteps: choose Schedule type Checkpoint or Automatic, not Karras."),
    ({"prompt": "a cat", "sampler": "DPM++ 2M Karras", "schedule": "Exponential"}, 422,
     "DPM++ 2M Karras names its schedule (Karras): for Schedule type Exponential choose DPM++ 2M."),
    ({"prompt": "x" * 25_000}, 422, "Prompt is 25,000 characters long; at most 20,"),
    (b'{"prompt": "a cat", "seed": NaN}', 422, "Seed must be a finite number"),
    ({"prompt": "a cat", "image": "A" * MAX_BODY_BYTES}, 413, f"The request body is over {MAX_BODY_BYTES:,} bytes"),
    ({"prompt": "x" * 1_100_000}, 422, "Prompt is 1,100,000 characters long; at most 20,"),
    ({"prompt": "a cat", "strength": 0.5}, 422, "Denoising strength applies to a starting image: give the image"),
    ({"prompt": "a cat", "image": "not base64!"}, 422, "Image must be a PNG, JPEG or WebP file as base64 text."),
    ({"prompt": "a cat", "image": ["iVBORw0KGgo="]}, 422, "Image must be an image file (PNG, JPEG or WebP)."),
    ({"prompt": "a cat", "image": "data:image/png,iVBORw0KGgo="}, 422, "Image: a data: URL must hold base64"),
    ({"prompt": "a cat", "image": base64.b64encode(b"<svg onload=alert(1)></svg>").decode()}, 422,
     "Image is not a PNG, JPEG or WebP image."),
    ({"prompt": "a cat", "image": base64.b64encode(encoded(picture(), "PNG")).decode(), "strength": 1.5}, 422,
     "Denoising strength must be a number between 0 and 1"),
    ({"prompt": "a cat", "image": base64.b64encode(encoded(picture(), "PNG")).decode(), "resize_mode": "Fit"}, 422,
     "Resize mode 'Fit' is not available; choose one of: Just resize, Crop and resize, Resize and fill."),
    ({"prompt": "a cat", "mask": base64.b64encode(encoded(picture(), "PNG")).decode()}, 422,
     "Mask applies to a starting image: give the image too."),
    ({"prompt": "a cat", "image": base64.b64encode(encoded(picture(), "PNG")).decode(), "mask_blur": 4}, 422,
     "Mask blur applies to a mask: give the mask too."),
    ({"prompt": "a cat", "image": base64.b64encode(encoded(picture(), "PNG")).decode(),
      "mask": base64.b64encode(encoded(picture(32, 32), "PNG")).decode()}, 422,
     "Mask is 32x32 pixels but the image is 64x64: they must be the same size (or the size to make, 64x64"),
    ({"prompt": "a cat", "image": base64.b64encode(encoded(picture(), "PNG")).decode(),
      "mask": base64.b64encode(encoded(picture(), "PNG")).decode(), "masked_content": "noise"}, 422,
     "Masked content 'noise' is not available; choose one of: fill, original, latent noise, latent nothing."),
    ({"prompt": "a cat", "mask_blurred": "yes"}, 422, "The field 'mask_blurred' must be true or false, got text."),
    ({"prompt": "a cat", "format": "gif"}, 422, "The field 'format' must be one of jpeg, png, webp, got 'gif'."),
    ({"prompt": "a cat", "format": ["png"]}, 422, "The field 'format' must be one of jpeg, png, webp"),
    ({"prompt": "a {red|blue", "seed": 1}, 422, "Prompt: The template has a { without its closing }"),
    ({"prompt": "a cat", "negative_prompt": "__secret__"}, 422,
     "Negative prompt: The template names the wildcard __secret__, which is not in the wildcards folder; its "
     "wildcards: none"),
    ({"prompt": "a __cat__", "dynamic_prompts": "random"}, 422,
     "Dynamic prompts 'random' is not available; choose one of: Off, Random, Combinatorial."),
    ({"parameters": ["a cat"]}, 422, "Parameters must be text, got a list."),
    ({"parameters": "Steps: 2, Seed: 1, Size: 64x64"}, 422, "Prompt is empty: please enter a prompt."),
    ({"parameters": "a cat\nSteps: 2, Seed: 1, Size: 64x64", "steps": 0}, 422, "Steps must be a whole number"),
])
def test_bad_requests_are_4xx_naming_the_problem(backend, body, status, message):
    before = metrics(backend)
    code, headers, answer = post(backend, body)
    assert code == status and headers["content-type"] == "application/json", answer
    assert json.loads(answer)["error"].startswith(message), answer
    assert b"Traceback" not in answer
    assert requests_total(metrics(backend), "user_error") - requests_total(before, "user_error") == 1


def test_generate_from_an_image(backend, tiny_pipeline):
    """img2img through the API: the starting image as base64 (bare, or a data: URL of another size
    that a resize mode fits), its strength in each image's parameters; the images are what the
    pipeline in this process makes of the same request, both through the back end's WebP encoder
    (lossy: about 23 dB from the pixels on the tiny model's noisy images)."""
    from PIL import Image

    from sdxl_tpu.a1111.images import encode

    as_webp = lambda image: np.asarray(Image.open(io.BytesIO(encode(image, "", "webp"))).convert("RGB"))
    start, wide = picture(), picture(128, 48)
    cases = [({"image": base64.b64encode(encoded(start, "PNG")).decode(), "strength": 0.5},
              dict(image=start, strength=0.5)),
             ({"image": "data:image/jpeg;base64," + base64.b64encode(encoded(wide, "JPEG", quality=100)).decode(),
               "resize_mode": "Crop and resize"},  # (strength left out: A1111's 0.75)
              dict(image=Image.open(io.BytesIO(encoded(wide, "JPEG", quality=100))), resize_mode="Crop and resize"))]
    made = []
    for fields, kwargs in cases:
        status, _, body = post(backend, {"prompt": "a cat", "seed": 3, "steps": 4, "sampler": "Euler",
                                         "guidance_scale": 5.0, **fields})
        assert status == 200, body[:500]
        answer = json.loads(body)
        strength = kwargs.get("strength", 0.75)
        assert all(f"Denoising strength: {strength:g}," in p for p in answer["parameters"])
        ours = tiny_pipeline.generate("a cat", seed=3, steps=4, size=(64, 64), sampler="Euler", guidance_scale=5.0,
                                      **kwargs)
        served = [np.asarray(Image.open(io.BytesIO(base64.b64decode(i))).convert("RGB")) for i in answer["images"]]
        for got, expected in zip(served, ours.images, strict=True):
            assert psnr(got, as_webp(expected)) > 40
        made.append(served[0])
    text_to_image = json.loads(post(backend, {"prompt": "a cat", "seed": 3, "steps": 4, "sampler": "Euler",
                                              "guidance_scale": 5.0})[2])
    first = np.asarray(Image.open(io.BytesIO(base64.b64decode(text_to_image["images"][0]))).convert("RGB"))
    assert psnr(made[0], first) < 20 and psnr(made[0], made[1]) < 20  # (the image, and which one, matters)


def test_fuzz_the_image_field(backend):
    """Hostile and broken files as the starting image: each one the decoder refuses is a 422 naming
    the image, never a 5xx; a few it takes (corruptions may leave an image) run."""
    from sdxl_tpu.request.errors import RequestError
    from sdxl_tpu.imaging.image_input import decode_image

    before = metrics(backend)
    refused = taken = 0
    for name, data in hostile_files():
        if data is None:  # (null in JSON: left out, from noise)
            continue
        try:
            decode_image(data)
        except RequestError:
            refused += 1
            value = base64.b64encode(data).decode() if isinstance(data, bytes) else data
            status, _, body = post(backend, {"prompt": "a cat", "steps": 1, "image": value})
            assert status == 422 and json.loads(body)["error"].startswith("Image "), (name, status, body[:300])
        else:
            if taken < 2:
                taken += 1
                value = base64.b64encode(data).decode()
                status, _, body = post(backend, {"prompt": "a cat", "steps": 1, "image": value})
                assert status == 200, (name, body[:300])
    assert refused > 200 and taken == 2
    assert requests_total(metrics(backend), "user_error") - requests_total(before, "user_error") == refused
    assert get(backend["url"] + "/healthz")[0] == 200


def test_fuzz_the_controlnet_units(backend):
    """Over 300 malformed or hostile ControlNet units, in POST /v1/generate and as sd-webui-controlnet's
    units in /sdapi/v1/txt2img, on a server with a ControlNet loaded (so every field is read): each
    a 422 naming the unit or what holds it, never a 5xx; the image corpus's refused files as control
    images; sd-webui-controlnet's lists answer."""
    from sdxl_tpu.request.errors import RequestError
    from sdxl_tpu.imaging.image_input import decode_image

    image = base64.b64encode(encoded(picture(), "PNG")).decode()
    good = {"model": "edges", "image": image, "module": "canny"}
    fields = {"model": NOT_CHOICE + ["edges/../../etc/passwd", "None"], "module": NOT_CHOICE + ["openpose"],
              "weight": NOT_NUMBER + [-0.1, 2.5], "guidance_start": NOT_NUMBER + [-1, 1.5, 1],
              "guidance_end": NOT_NUMBER + [0, 2], "threshold_a": NOT_NUMBER + [0, 256, 1.5],
              "threshold_b": NOT_NUMBER + [0, 300], "resize_mode": NOT_CHOICE, "guess_mode": NOT_BOOL,
              "enabled": NOT_BOOL, "preprocessed": NOT_BOOL, "image": NOT_TEXT + ["", "x", "/etc/passwd"],
              "unknown": ["x"]}
    units = [{**good, name: value} for name, values in fields.items() for value in values]
    for _, data in hostile_files():  # (the decoder's refusals, as control images)
        if isinstance(data, bytes):
            try:
                decode_image(data)
            except RequestError:
                units.append({**good, "image": base64.b64encode(data).decode()})
    # The IP-Adapter's unit: ControlNet-only settings, the image decoder's refusals, two image prompts.
    prompt_unit = {"model": "ip-adapter_sdxl", "image": image, "module": "ip-adapter_clip_sdxl"}
    units += [{**prompt_unit, "module": "canny"}, {**prompt_unit, "guess_mode": True},
              {**good, "module": "ip-adapter_clip_h"},
              *({**prompt_unit, "image": unit["image"]} for unit in units if unit["image"] != image)]
    lists = [5, "x", {}, [5], [good] * 4, [{"enabled": True}], [None], [prompt_unit, prompt_unit]]
    bodies = [(("/v1/generate", {"prompt": "a cat", "steps": 1, "controlnet": [unit]}), "ControlNet")
              for unit in units]
    bodies += [(("/v1/generate", {"prompt": "a cat", "steps": 1, "controlnet": value}), "ControlNet")
               for value in lists]
    a1111 = [{**good, "control_mode": mode} for mode in ("My prompt is more important", 2, "x", True)]
    a1111 += [{**good, "mask": image}, {**good, "resize_mode": 3}, {**good, "resize_mode": "Fit"},
              {**good, "input_image": None, "image": None}, {**good, "image": {"image": image, "mask": image}}]
    bodies += [((A1111, {"prompt": "a cat", "steps": 1, "width": 64, "height": 64,
                         "alwayson_scripts": {"controlnet": {"args": [unit]}}}), "ControlNet") for unit in a1111]
    bodies += [((A1111, {"prompt": "a cat", "steps": 1, "width": 64, "height": 64, "alwayson_scripts": scripts}),
                "alwayson_scripts") for scripts in ("x", [1], {"controlnet": 5}, {"controlnet": {"args": "x"}},
                                                     {"ADetailer": {"args": []}})]
    assert len(bodies) >= 300, len(bodies)
    before = metrics(backend)
    for (path, body), named in bodies:
        status, _, answer = post(backend, body, path=path)
        assert status == 422 and named in json.loads(answer)["error"], (body, status, answer[:300])
    assert metrics(backend)["sdxl_images_total"] == before["sdxl_images_total"]
    for name, key in (("model_list", "model_list"), ("module_list", "module_list"), ("version", "version")):
        status, text = get(f"{backend['url']}/controlnet/{name}")
        assert status == 200 and key in json.loads(text)
    assert json.loads(get(backend["url"] + "/controlnet/model_list")[1])["model_list"] == ["edges", "ip-adapter_sdxl"]
    assert get(backend["url"] + "/healthz")[0] == 200


def test_fuzz_the_mask_field(backend):
    """Hostile and broken masks (hostile_masks, over 300, those JSON can carry) with a good image:
    each one the request check refuses is a 422 naming the mask or its setting, never a 5xx; two it
    takes run; the server stays healthy."""
    from PIL import Image

    from sdxl_tpu.request.errors import RequestError
    from sdxl_tpu.request.request import Request

    def as_json(value):
        if isinstance(value, Image.Image):
            value = encoded(value, "PNG")
        return base64.b64encode(value).decode() if isinstance(value, bytes) else value

    image = base64.b64encode(encoded(picture(), "PNG")).decode()
    before, refused, taken = metrics(backend), 0, 0
    for name, mask, fields in hostile_masks():
        if isinstance(mask, np.ndarray):  # (no arrays in JSON)
            continue
        body = {"prompt": "a cat", "steps": 1, "size": "64x64", "image": image, "mask": as_json(mask), **fields}
        try:
            Request.of("a cat", size=(64, 64), image=picture(), mask=mask, **fields)
        except RequestError:
            refused += 1
            status, _, answer = post(backend, body)
            assert status == 422 and json.loads(answer)["error"].startswith(
                ("Mask", "Inpaint area", "Only masked padding", "Masked content")), (name, status, answer[:300])
        else:
            if taken < 2:
                taken += 1
                status, _, answer = post(backend, body)
                assert status == 200, (name, answer[:300])
    assert refused > 250 and taken == 2
    assert requests_total(metrics(backend), "user_error") - requests_total(before, "user_error") == refused
    assert get(backend["url"] + "/healthz")[0] == 200


def test_a1111_api_through_its_client(backend, tiny_pipeline):
    """AUTOMATIC1111's API as webuiapi calls it (every field with its default): the samplers,
    schedulers and model it lists; txt2img with a sampler and Schedule type, batch_size x n_iter
    (six images over two calls, seeds following on), PNGs carrying their parameters and the info
    A1111 answers with, the pipeline's own images; img2img with a mask; png-info on our own image;
    what cannot be honoured refused by name, a size not compiled with the sizes that are."""
    import webuiapi
    from PIL import Image

    from sdxl_tpu.a1111.images import read_parameters

    api = webuiapi.WebUIApi(host="127.0.0.1", port=backend["port"], sampler="Euler", steps=4)
    assert {"Euler", "Euler a", "DPM++ 2M"} <= {s["name"] for s in api.get_samplers()}
    assert {"karras", "uniform", "checkpoint"} <= {s["name"] for s in api.get_schedulers()}
    assert [m["title"] for m in api.get_sd_models()] == ["tiny"] and api.get_options()["sd_model_checkpoint"] == "tiny"
    made = api.txt2img(prompt="a lighthouse", negative_prompt="blurry", seed=11, cfg_scale=5.0, width=64,
                       height=64, scheduler="Karras", batch_size=2, n_iter=3)
    assert len(made.images) == 6 and made.info["all_seeds"] == list(range(11, 17))
    assert made.parameters["prompt"] == "a lighthouse" and made.info["sampler_name"] == "Euler"
    assert made.info["infotexts"][0].startswith("a lighthouse\nNegative prompt: blurry\nSteps: 4, Sampler: Euler, "
                                                "Schedule type: Karras, CFG scale: 5, Seed: 11, Size: 64x64")
    assert all(read_parameters(im) == text for im, text in zip(made.images, made.info["infotexts"], strict=True))
    ours = tiny_pipeline.generate("a lighthouse", "blurry", seed=11, guidance_scale=5.0, steps=4, size=(64, 64),
                                  sampler="Euler", schedule="Karras")
    for theirs, mine in zip(made.images, ours.images):  # (a PNG each: the pipeline's pixels)
        np.testing.assert_array_equal(np.asarray(theirs.convert("RGB")), np.asarray(mine))
    # img2img with a mask (A1111's API defaults: fill, Only masked without padding), one image.
    edited = api.img2img(images=[picture()], mask_image=block_mask(), inpainting_fill=1, inpaint_full_res=False,
                         denoising_strength=0.6, prompt="a red door", seed=3, cfg_scale=5.0, width=64, height=64,
                         scheduler="Checkpoint")
    mine = tiny_pipeline.generate("a red door", seed=3, guidance_scale=5.0, steps=4, size=(64, 64), sampler="Euler",
                                  image=picture(), mask_image=block_mask(), strength=0.6).images[0]
    assert len(edited.images) == 1 and "Denoising strength: 0.6, Mask blur: 4," in edited.info["infotexts"][0]
    np.testing.assert_array_equal(np.asarray(edited.images[0].convert("RGB")), np.asarray(mine))
    found = api.png_info(made.images[0])
    assert found.info == made.info["infotexts"][0] and found.json["parameters"]["Steps"] == "4"
    for kwargs, said in ((dict(width=512, height=512), "Size '512x512' is not available; choose one of: 64x64"),
                         (dict(restore_faces=True), "restore_faces true cannot be honoured here"),
                         (dict(alwayson_scripts={"ADetailer": {"args": [True]}}), "alwayson_scripts 'ADetailer'"),
                         (dict(override_settings={"sd_model_checkpoint": "juggernaut"}),
                          'Checkpoint "juggernaut" is not loaded here; this server runs tiny'),
                         (dict(override_settings={"randn_source": "NV"}), 'randn_source "NV" cannot be reproduced'),
                         (dict(sampler_name="Heun"), "Sampler 'Heun' is not available")):
        with pytest.raises(RuntimeError) as refused:
            api.txt2img(prompt="a cat", **{"width": 64, "height": 64, **kwargs})
        assert refused.value.args[0] == 422 and said in json.loads(refused.value.args[1])["error"], refused.value.args
    del Image


def test_controlnet_units_through_the_json_and_a1111_apis(backend):
    """A ControlNet unit in POST /v1/generate and the same unit as sd-webui-controlnet's client
    sends it (webuiapi's ControlNetUnit in alwayson_scripts): the same image, unlike the image
    without it; each image's parameters name the unit; /controlnet/model_list lists what is loaded;
    nothing compiles (the warm-up had each ControlNet's step); a bad unit is a 422 naming it."""
    import webuiapi
    from PIL import Image

    from sdxl_tpu.a1111.images import read_parameters

    before = metrics(backend)
    common = {"prompt": "a lighthouse", "seed": 5, "steps": 3, "size": "64x64", "guidance_scale": 5.0,
              "sampler": "Euler", "count": 1, "format": "png"}
    unit = {"model": "edges", "image": base64.b64encode(encoded(picture(96, 80), "PNG")).decode(), "module": "canny",
            "threshold_a": 100, "threshold_b": 200}
    images = {}
    for name, body in (("json", {**common, "controlnet": [unit]}), ("none", common)):
        status, _, answer = post(backend, body)
        assert status == 200, answer
        images[name] = Image.open(io.BytesIO(base64.b64decode(json.loads(answer)["images"][0])))
    api = webuiapi.WebUIApi(host="127.0.0.1", port=backend["port"], sampler="Euler", steps=3)
    assert api.controlnet_model_list() == ["edges", "ip-adapter_sdxl"]
    # (alwayson_scripts given: webuiapi puts the units into its default dict, which every later call
    # of this process would then send)
    made = api.txt2img(prompt="a lighthouse", seed=5, cfg_scale=5.0, width=64, height=64, scheduler="Checkpoint",
                       alwayson_scripts={}, controlnet_units=[
        webuiapi.ControlNetUnit(image=picture(96, 80), module="canny", model="edges [0f1e2d3c]", threshold_a=100,
                                threshold_b=200, resize_mode="Crop and Resize")])
    text = read_parameters(images["json"])
    assert 'ControlNet 0: "Module: canny, Model: edges, Weight: 1, Resize Mode: Crop and Resize, Threshold A: 100, ' \
        'Threshold B: 200, Guidance Start: 0, Guidance End: 1, Pixel Perfect: True, Control Mode: Balanced"' in text
    assert made.info["infotexts"][0] == text
    np.testing.assert_array_equal(np.asarray(made.image.convert("RGB")), np.asarray(images["json"].convert("RGB")))
    assert psnr(np.asarray(images["json"].convert("RGB")), np.asarray(images["none"].convert("RGB"))) < 30
    after = metrics(backend)
    assert (after["sdxl_compiles_total"], after["sdxl_programs_loaded_total"]) == (
        before["sdxl_compiles_total"], before["sdxl_programs_loaded_total"])
    for bad, said in (({**unit, "model": "depth"}, "ControlNet unit 0: ControlNet 'depth' is not available"),
                      ({**unit, "weight": "heavy"}, "ControlNet unit 0 weight"),
                      ({**unit, "image": "<svg onload=alert(1)>"}, "ControlNet image")):
        status, _, answer = post(backend, {**common, "controlnet": [bad]})
        assert status == 422 and said in json.loads(answer)["error"], answer


def test_ip_adapter_units_through_the_json_and_a1111_apis(backend):
    """The IP-Adapter's unit in POST /v1/generate, and as sd-webui-controlnet's client sends one
    (its ip-adapter module, the model with a hash): the same image, unlike the image without it or
    with another image prompt; the parameters name the unit; the lists name the adapter and its
    modules; nothing compiles (the warm-up had the image prompt's programs)."""
    import webuiapi
    from PIL import Image

    from sdxl_tpu.a1111.images import read_parameters

    before = metrics(backend)
    common = {"prompt": "a lighthouse", "seed": 5, "steps": 3, "size": "64x64", "guidance_scale": 5.0,
              "sampler": "Euler", "count": 1, "format": "png"}
    photo = picture(300, 200)
    unit = {"model": "ip-adapter_sdxl", "image": base64.b64encode(encoded(photo, "PNG")).decode(),
            "module": "ip-adapter_clip_sdxl", "weight": 0.8}
    images = {}
    other = {**unit, "image": base64.b64encode(encoded(Image.new("RGB", (64, 64), (20, 200, 40)), "PNG")).decode()}
    for name, body in (("json", {**common, "controlnet": [unit]}), ("none", common),
                       ("other", {**common, "controlnet": [other]})):
        status, _, answer = post(backend, body)
        assert status == 200, answer
        images[name] = Image.open(io.BytesIO(base64.b64decode(json.loads(answer)["images"][0])))
    api = webuiapi.WebUIApi(host="127.0.0.1", port=backend["port"], sampler="Euler", steps=3)
    assert api.controlnet_model_list() == ["edges", "ip-adapter_sdxl"]
    assert "ip-adapter_clip_sdxl_plus_vith" in api.controlnet_module_list()
    made = api.txt2img(prompt="a lighthouse", seed=5, cfg_scale=5.0, width=64, height=64, scheduler="Checkpoint",
                       alwayson_scripts={}, controlnet_units=[
        webuiapi.ControlNetUnit(image=photo, module="ip-adapter_clip_sdxl", model="ip-adapter_sdxl [7d943a46]",
                                weight=0.8, resize_mode="Crop and Resize")])
    text = read_parameters(images["json"])
    assert 'ControlNet 0: "Module: ip-adapter_clip_sdxl, Model: ip-adapter_sdxl, Weight: 0.8,' in text
    assert made.info["infotexts"][0] == text
    pixels = {name: np.asarray(image.convert("RGB")) for name, image in images.items()}
    np.testing.assert_array_equal(np.asarray(made.image.convert("RGB")), pixels["json"])
    assert psnr(pixels["json"], pixels["none"]) < 30 and psnr(pixels["json"], pixels["other"]) < 40
    after = metrics(backend)
    assert (after["sdxl_compiles_total"], after["sdxl_programs_loaded_total"]) == (
        before["sdxl_compiles_total"], before["sdxl_programs_loaded_total"])


def test_openai_images_api_through_its_client(backend, tiny_pipeline):
    """OpenAI's Images API as the official client calls it: the model listed; four images as
    base64 and two by URL (asked of "dall-e-3", as tools that know only OpenAI's names do), the
    pipeline's own pixel for pixel (this server's own fields, seed, steps
    and sampler, through extra_body); an edit whose mask's transparent part is repainted;
    errors in OpenAI's shape naming the parameter."""
    import urllib.request

    import openai
    from PIL import Image

    from sdxl_tpu.a1111.images import read_parameters

    client = openai.OpenAI(base_url=backend["url"] + "/v1", api_key="not-needed", max_retries=0)
    # (and OpenAI's own names for it, which tools that know no other send)
    assert [m.id for m in client.models.list()] == ["tiny", "dall-e-2", "dall-e-3", "gpt-image-1", "gpt-image-1-mini"]
    own = {"seed": 11, "steps": 4, "sampler": "Euler", "guidance_scale": 5.0}
    made = client.images.generate(prompt="a lighthouse", n=4, size="64x64", response_format="b64_json",
                                  extra_body=own)
    images = [Image.open(io.BytesIO(base64.b64decode(d.b64_json))) for d in made.data]
    ours = tiny_pipeline.generate("a lighthouse", seed=11, steps=4, sampler="Euler", guidance_scale=5.0, size=(64, 64))
    assert len(images) == 4 and "Seed: 11," in read_parameters(images[0]) and images[0].format == "PNG"
    for theirs, mine in zip(images, ours.images, strict=True):
        np.testing.assert_array_equal(np.asarray(theirs.convert("RGB")), np.asarray(mine))
    by_url = client.images.generate(prompt="a lighthouse", model="dall-e-3", n=2, size="64x64", response_format="url",
                                    extra_body=own)
    for item, mine in zip(by_url.data, ours.images[:2], strict=True):
        with urllib.request.urlopen(item.url, timeout=30) as response:
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            body = response.read()
        np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(body)).convert("RGB")), np.asarray(mine))
    # An edit: OpenAI's mask, transparent where the image is repainted.
    start, repaint = io.BytesIO(), io.BytesIO()
    picture().save(start, "PNG")
    alpha = np.where(np.asarray(block_mask()) > 0, 0, 255).astype(np.uint8)
    Image.fromarray(np.dstack([np.zeros((64, 64, 3), np.uint8), alpha]), "RGBA").save(repaint, "PNG")
    edited = client.images.edit(image=("start.png", start.getvalue(), "image/png"),
                                mask=("mask.png", repaint.getvalue(), "image/png"), prompt="a red door", n=1,
                                size="64x64", extra_body={**own, "seed": 3, "strength": 0.6,
                                                          "masked_content": "original"})
    mine = tiny_pipeline.generate("a red door", seed=3, steps=4, sampler="Euler", guidance_scale=5.0, size=(64, 64),
                                  image=picture(), mask_image=block_mask(), strength=0.6).images[0]
    edit = Image.open(io.BytesIO(base64.b64decode(edited.data[0].b64_json)))
    np.testing.assert_array_equal(np.asarray(edit.convert("RGB")), np.asarray(mine))
    for kwargs, error, said, param in (
            (dict(size="512x512"), openai.BadRequestError, "Size '512x512' is not available", None),
            (dict(model="sd3-medium"), openai.NotFoundError, "The model 'sd3-medium' does not exist here; this server "
             "runs 'tiny' (also by OpenAI's names: dall-e-2, dall-e-3, gpt-image-1, gpt-image-1-mini).", "model"),
            (dict(quality="hd"), openai.BadRequestError, "quality 'hd' cannot be honoured here", "quality"),
            (dict(n=11), openai.BadRequestError, "n must be a whole number from 1 to 10", "n")):
        with pytest.raises(error) as refused:
            client.images.generate(prompt="a cat", **{"size": "64x64", **kwargs})
        body = refused.value.body
        assert said in body["message"] and body["param"] == param and body["type"] == "invalid_request_error", body


def test_a1111_progress_and_interrupt(backend):
    """/sdapi/v1/progress while a run of three calls goes (its step advancing, a preview), /interrupt stopping it:
    the run answers with the images finished before, at once, and the server takes the next."""
    import webuiapi

    api = webuiapi.WebUIApi(host="127.0.0.1", port=backend["port"], sampler="Euler", steps=30)
    answer: dict = {}
    assert api.get_progress()["state"]["job_count"] == 0  # (idle)
    runner = threading.Thread(target=lambda: answer.update(made=api.txt2img(prompt="a cat", seed=1, width=64,
                                                                            height=64, n_iter=12)))
    runner.start()
    wait_for(lambda: api.get_progress()["state"]["sampling_step"] >= 2, 60, "no step reported")
    seen = api.get_progress()
    assert 0 < seen["progress"] < 1 and seen["state"]["job_count"] == 3 and seen["state"]["sampling_steps"] == 30
    wait_for(lambda: api.get_progress()["current_image"], 60, "no preview")
    api.interrupt()
    runner.join(60)
    assert not runner.is_alive() and len(answer["made"].images) < 12
    assert api.txt2img(prompt="a cat", seed=1, width=64, height=64, steps=2).images


def test_routes_and_methods_it_does_not_serve_are_4xx(backend):
    for path in ("/", "/v1/generate/../../etc/passwd", "/gradio_api/file=/etc/passwd", "/docs"):
        status, text = get(backend["url"] + path)
        assert status == 404 and "Not found; this server answers" in text and "root:" not in text, (path, text)
    status, text = get(backend["url"] + "/v1/generate")
    assert status == 405 and json.loads(text)["error"] == "'GET' is not allowed on '/v1/generate'."


def test_no_recompile_across_requests(backend):
    before = metrics(backend)
    image = base64.b64encode(encoded(picture(96, 80), "PNG")).decode()
    cases = ((1, "Euler", 5.0, {}), (4, "Euler a", 7.0, {}), (3, "DPM++ 2M", 0.0, {}),
             (4, "Euler", 5.0, {"image": image, "strength": 0.3}),  # (img2img: strength and resize mode too)
             (5, "DPM++ 2M", 0.0, {"image": image, "strength": 0.9, "resize_mode": "Resize and fill"}))
    for steps, sampler, guidance, start in cases:
        status, _, body = post(backend, {"prompt": f"a cat, {steps} steps", "steps": steps, "sampler": sampler,
                                         "guidance_scale": guidance, **start})
        assert status == 200, body
    after = metrics(backend)
    # The warm-up compiled its programs or loaded them from the store; requests did neither.
    assert before["sdxl_compiles_total"] + before["sdxl_programs_loaded_total"] > 0
    assert (after["sdxl_compiles_total"], after["sdxl_programs_loaded_total"]) == (
        before["sdxl_compiles_total"], before["sdxl_programs_loaded_total"])
    assert requests_total(after, "ok") - requests_total(before, "ok") == 5
    assert after["sdxl_images_total"] - before["sdxl_images_total"] == 20
    assert after["sdxl_pipeline_calls_total"] - before["sdxl_pipeline_calls_total"] == 5


def test_full_queue_answers_503_with_retry_after_at_once(backend):
    before = metrics(backend)
    long = {"prompt": "a cat", "steps": 50}
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(post, backend, long)
        time.sleep(0.3)  # the first is running (a call starts within 20 ms; 50 steps take seconds)
        waiting = pool.submit(post, backend, long)
        wait_for(lambda: metrics(backend)["sdxl_queue_depth"] == QUEUE_SIZE, 30, "the second request did not queue")
        start = time.monotonic()
        status, headers, body = post(backend, {"prompt": "a dog", "steps": 1})
        refused_in = time.monotonic() - start
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert "busy" in json.loads(body)["error"]
        assert refused_in < 1.0, f"refusing took {refused_in:.2f} s"
        # The other tools' APIs share the queue: A1111's says 503, OpenAI's 429 ("slow down"), both when to retry.
        for path, body, code in ((A1111, {"prompt": "a dog", "steps": 1, "width": 64, "height": 64}, 503),
                                 (OPENAI, {"prompt": "a dog", "size": "64x64", "steps": 1}, 429)):
            status, headers, said = post(backend, body, path=path)
            assert status == code and int(headers["retry-after"]) >= 1 and "busy" in said.decode(), (path, said)
        assert running.result(120)[0] == 200 and waiting.result(120)[0] == 200  # accepted work is served
    after = metrics(backend)
    assert requests_total(after, "queue_full") - requests_total(before, "queue_full") == 3
    for route in ("/v1/generate", A1111, OPENAI):  # (counted by route)
        assert requests_total(after, "queue_full", route) - requests_total(before, "queue_full", route) == 1
    assert requests_total(after, "ok") - requests_total(before, "ok") == 2


@pytest.mark.parametrize("path, body", [
    ("/sdapi/v1/txt2img", {"prompt": "a cat", "steps": 40, "width": 64, "height": 64, "n_iter": 40}),
    ("/v1/images/generations", {"prompt": "a cat", "size": "64x64", "steps": 40, "n": 10})])
def test_a_caller_who_leaves_stops_its_work(backend, path, body):
    """An A1111 or OpenAI caller that goes away mid-run (its connection closed) stops the work:
    counted cancelled on its route, the queue free for the next request at once."""
    before = metrics(backend)
    data = json.dumps(body).encode()
    connection = http.client.HTTPConnection("127.0.0.1", backend["port"], timeout=60)
    connection.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    wait_for(lambda: metrics(backend)["sdxl_pipeline_calls_total"] > before["sdxl_pipeline_calls_total"], 60,
             "the first call did not finish")
    connection.close()  # (gone, with calls left to make)
    wait_for(lambda: requests_total(metrics(backend), "cancelled", path) > requests_total(before, "cancelled", path),
             30, "the work did not stop")
    after = metrics(backend)
    assert after["sdxl_pipeline_calls_total"] - before["sdxl_pipeline_calls_total"] < 3, "the calls went on"
    assert post(backend, {"prompt": "a dog", "steps": 1})[0] == 200


def test_sigterm_drains_accepted_work_then_exits_zero(backend):
    proc, long = backend["proc"], {"prompt": "a cat", "steps": 50, "seed": 3}
    results: dict[str, tuple] = {}
    threads = [threading.Thread(target=lambda name=name: results.__setitem__(name, post(backend, long)))
               for name in ("running", "queued")]
    for thread in threads:
        thread.start()
        time.sleep(0.3)
    wait_for(lambda: metrics(backend)["sdxl_queue_depth"] == 1, 30, "the second request did not queue")
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: get(backend["url"] + "/readyz")[0] == 503, 5, "readyz did not turn 503")
    not_ready_after = time.monotonic() - sent
    assert json.loads(get(backend["url"] + "/readyz")[1])["status"] == "draining"
    status, headers, body = post(backend, {"prompt": "a dog", "steps": 1})  # new work: refused at once
    assert status == 503 and headers["retry-after"] and "shutting down" in json.loads(body)["error"]
    for path, body in ((A1111, {"prompt": "a dog", "steps": 1, "width": 64, "height": 64}),
                       (OPENAI, {"prompt": "a dog", "size": "64x64", "steps": 1})):  # (on every route)
        status, headers, said = post(backend, body, path=path)
        assert status == 503 and headers["retry-after"] and "shutting down" in said.decode(), (path, said)
    draining = metrics(backend)
    assert draining["sdxl_ready"] == 0 and requests_total(draining, "draining") == 3
    for thread in threads:
        thread.join(120)
    finished = time.monotonic() - sent
    assert [results[name][0] for name in ("running", "queued")] == [200, 200]
    assert all(len(json.loads(results[name][2])["images"]) == 4 for name in results)
    code = proc.wait(timeout=60)
    exited = time.monotonic() - sent
    print(f"back end SIGTERM with 2 requests accepted: not ready after {not_ready_after:.2f} s, "
          f"accepted requests done after {finished:.2f} s, exit {code} after {exited:.2f} s")
    assert not_ready_after < 1.0 and code == 0 and exited - finished < 15
    log = backend["log"].read_text()
    assert "drained" in log and "Traceback" not in log
