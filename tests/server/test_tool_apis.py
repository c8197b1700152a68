"""The APIs other tools speak, on the app a Space runs (`python app.py`, the shared app_server:
MCP on, an API key set), through the clients people use: webuiapi (A1111's), the official openai
client and the official mcp client. What they get is what /generate makes from the same
settings and seeds: the same parameters text, the pipeline's pixels."""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import io
import json
import re

import numpy as np
import pytest
from PIL import Image

from embedding_files import GOOD, SKIPPED
from upscaler_files import GENERAL
from hostile_values import NOT_ANY, NOT_BOOL, NOT_CHOICE, NOT_JSON, NOT_NUMBER, NOT_TEXT
from images import block_mask, encoded, hostile_files, picture
from raw_http import AppLog, Http
from served_app import API_KEY, read_metrics, requests_total
from sdxl_tpu.a1111.images import read_parameters

PROMPT, NEGATIVE, SEED, STEPS = "a lighthouse", "blurry", 41, 3


@pytest.fixture(scope="module")
def from_generate(app_server):
    """/generate's four images (through gradio_client) and the tiny pipeline's pixels for them."""
    from gradio_client import Client

    client = Client(app_server["url"] + "/", verbose=False)
    gallery, _ = client.predict(PROMPT, NEGATIVE, "(No style)", SEED, False, 5.0, STEPS, "64x64", "Euler",
                                api_name="/generate")
    return [read_parameters(Image.open(item["image"])) for item in gallery]


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def test_a1111_api_on_the_app_behind_its_key(app_server, from_generate, tiny_pipeline):
    """webuiapi against the app: refused without the key (401, said), then with it as HTTP basic's
    password (A1111's --api-auth) four images whose parameters are /generate's and whose pixels are
    the pipeline's, counted under their route."""
    import webuiapi

    api = webuiapi.WebUIApi(host="127.0.0.1", port=app_server["port"], sampler="Euler", steps=STEPS)
    for user, password in ((None, None), ("me", "wrong")):
        if user:
            api.set_auth(user, password)
        with pytest.raises(RuntimeError) as refused:
            api.txt2img(prompt=PROMPT, width=64, height=64)
        assert refused.value.args[0] == 401 and "API key" in refused.value.args[1]
    before = read_metrics(app_server["url"] + "/metrics")
    api.set_auth("me", API_KEY)
    made = api.txt2img(prompt=PROMPT, negative_prompt=NEGATIVE, seed=SEED, cfg_scale=5.0, width=64, height=64,
                       batch_size=4, scheduler="Checkpoint")
    assert [read_parameters(image) for image in made.images] == from_generate
    ours = tiny_pipeline.generate(PROMPT, NEGATIVE, seed=SEED, guidance_scale=5.0, steps=STEPS, size=(64, 64),
                                  sampler="Euler")
    for theirs, mine in zip(made.images, ours.images, strict=True):
        np.testing.assert_array_equal(pixels(theirs), np.asarray(mine))
    after = read_metrics(app_server["url"] + "/metrics")
    assert requests_total(after, "ok", "/sdapi/v1/txt2img") - requests_total(before, "ok", "/sdapi/v1/txt2img") == 1


def test_dynamic_prompts_draw_each_image_from_its_seed_and_the_servers_wildcards(app_server, wildcards_folder,
                                                                                tiny_pipeline):
    """A template with variants and the server's wildcards (sd-dynamic-prompts' syntax): through
    A1111's API each image gets the prompt its seed draws (as the module draws it from the same
    folder), its parameters keep the template, its pixels are the pipeline's for that prompt; through
    /generate, Combinatorial makes the combinations in order and Off keeps the text; a wildcard the
    server does not have is refused by name, before any work."""
    import webuiapi
    from gradio_client import Client

    from sdxl_tpu.a1111.dynamic_prompts import Wildcards, combinations, draw

    template, negative = "a {red|green|blue} __animals/cat__ in __color__", "{blurry|dark}"
    folder = Wildcards(wildcards_folder)
    api = webuiapi.WebUIApi(host="127.0.0.1", port=app_server["port"], sampler="Euler", steps=STEPS)
    api.set_auth("me", API_KEY)
    made = api.txt2img(prompt=template, negative_prompt=negative, seed=SEED, cfg_scale=5.0, width=64, height=64,
                       batch_size=4, scheduler="Checkpoint")
    prompts = [draw(template, SEED + i, folder) for i in range(4)]
    negatives = [draw(negative, SEED + i, folder) for i in range(4)]
    assert len(set(prompts)) > 1 and "__" not in "".join(prompts)  # (the seeds draw differently here)
    for image, prompt, negative_prompt in zip(made.images, prompts, negatives, strict=True):
        text = read_parameters(image)
        assert text.startswith(f"{prompt}\nNegative prompt: {negative_prompt}\n"), text
        assert f"Template: {template}, Negative Template: {negative}, Version:" in text, text  # (no comma: bare)
    assert made.info["all_prompts"] == prompts
    ours = tiny_pipeline.generate(template, negative, seed=SEED, guidance_scale=5.0, steps=STEPS, size=(64, 64),
                                  sampler="Euler", wildcards=wildcards_folder)
    for theirs, mine in zip(made.images, ours.images, strict=True):
        np.testing.assert_array_equal(pixels(theirs), np.asarray(mine))

    client = Client(app_server["url"] + "/", verbose=False)
    for mode, expected in (("Combinatorial", combinations("{red|blue} __animals/cat__", folder)[:4]),
                           ("Off", ["{red|blue} __animals/cat__"] * 4)):
        gallery, _ = client.predict("{red|blue} __animals/cat__", seed=SEED, steps=1, size="64x64",
                                    dynamic_prompts=mode, api_name="/generate")
        assert [read_parameters(Image.open(item["image"])).split("\n")[0] for item in gallery] == expected, mode
    with pytest.raises(RuntimeError) as refused:
        api.txt2img(prompt="a __animals/dog__", width=64, height=64, steps=1)
    assert refused.value.args[0] == 422 and "__animals/dog__" in refused.value.args[1], refused.value.args
    assert "__animals/cat__" in refused.value.args[1] and "__color__" in refused.value.args[1]


def test_embeddings_listed_as_a1111_lists_them_and_named_in_the_parameters(app_server, embeddings_folder):
    """/sdapi/v1/embeddings through webuiapi: the server's folder as A1111 answers for it (those
    loaded with their vectors, the files skipped); an image whose prompts name two carries their
    "TI hashes"."""
    import webuiapi

    api = webuiapi.WebUIApi(host="127.0.0.1", port=app_server["port"], sampler="Euler", steps=1)
    api.set_auth("me", API_KEY)
    listed = api.get_embeddings()
    assert {name: e["vectors"] for name, e in listed["loaded"].items()} == GOOD
    assert set(listed["skipped"]) == set(SKIPPED) and "pickle" in listed["skipped"]["pickled"]["reason"]
    made = api.txt2img(prompt="a photo of myemb cat", negative_prompt="onevec", seed=SEED, width=64, height=64)
    short = {name: hashlib.sha256(next(embeddings_folder.rglob(f"{name}.safetensors")).read_bytes()).hexdigest()[:12]
             for name in GOOD}
    assert f'TI hashes: "myemb: {short["myemb"]}, onevec: {short["onevec"]}"' in read_parameters(made.image)


def test_upscalers_as_a1111_lists_and_runs_them(app_server, upscalers_folder):
    """/sdapi/v1/upscalers and /sdapi/v1/extra-single-image through webuiapi: the server's upscaler
    model by A1111's name (no file path said), an Extras upscale whose pixels are the model's own
    (read here from the same file), by a factor and to a size, Lanczos as A1111's, the parts not
    offered refused by name; and a hires fix through it, named in the parameters."""
    import webuiapi

    from sdxl_tpu.generate.upscaling import TiledUpscaler
    from sdxl_tpu.imaging.upscale import upscale_by
    from sdxl_tpu.weights.upscalers import load_upscaler

    api = webuiapi.WebUIApi(host="127.0.0.1", port=app_server["port"], sampler="Euler", steps=STEPS)
    api.set_auth("me", API_KEY)
    listed = api.get_upscalers()
    assert [u["name"] for u in listed] == ["None", "Lanczos", GENERAL]
    assert all(u["model_path"] is None for u in listed)
    image = picture(80, 56)
    made = api.extra_single_image(image, upscaler_1=GENERAL, upscaling_resize=2).image
    model = TiledUpscaler(load_upscaler(upscalers_folder / "realesr-general-x4v3.pth"), GENERAL)
    assert made.size == (160, 112)
    np.testing.assert_array_equal(pixels(made), pixels(model.upscale(image, 2)))
    cropped = api.extra_single_image(image, resize_mode=1, upscaling_resize_w=128, upscaling_resize_h=128,
                                     upscaler_1=GENERAL).image
    assert cropped.size == (128, 128)  # (covered: 80x56 times 128 / 56, then cut at the centre)
    lanczos = api.extra_single_image(image, upscaler_1="Lanczos", upscaling_resize=1.5).image
    np.testing.assert_array_equal(pixels(lanczos), pixels(upscale_by(image, 1.5, lambda im: im.resize(
        (int(im.width * 1.5), int(im.height * 1.5)), resample=Image.Resampling.LANCZOS))))
    assert pixels(api.extra_single_image(image, upscaler_1="None").image).tolist() == pixels(image).tolist()
    for given, named in (({"gfpgan_visibility": 1}, "gfpgan_visibility"), ({"upscaler_1": "4x-UltraSharp"},
                                                                           "upscaler_1"),
                         ({"upscaler_1": GENERAL, "upscaling_resize": 4, "image": picture(2048, 1100)}, "4096x4096")):
        with pytest.raises(RuntimeError) as refused:
            api.extra_single_image(**{"image": image, **given})
        assert refused.value.args[0] == 422 and named in refused.value.args[1], refused.value.args
    hires = api.txt2img(prompt=PROMPT, seed=SEED, width=64, height=64, enable_hr=True, hr_scale=1.5,
                        hr_upscaler=GENERAL, hr_second_pass_steps=2, denoising_strength=0.5)
    assert hires.image.size == (96, 96)
    assert f"Hires upscaler: {GENERAL}," in read_parameters(hires.image)


def test_the_refiner_through_a1111s_refiner_checkpoint(app_server):
    """A1111's refiner_checkpoint (its name, "name [hash]" or its file's) and refiner_switch_at: the
    server's refiner runs the last steps, its parameters say so, the image differs from the model's
    alone; another refiner is refused naming the server's."""
    http = Http(app_server)
    body = {"prompt": PROMPT, "seed": SEED, "steps": 4, "width": 64, "height": 64, "cfg_scale": 5.0,
            "sampler_name": "Euler", "scheduler": "Checkpoint"}
    made = {}
    for name, more in (("refined", {"refiner_checkpoint": "sdxl-tiny-refiner [0123abcd]", "refiner_switch_at": 0.5}),
                       ("default", {"refiner_checkpoint": "sdxl-tiny-refiner.safetensors"}), ("plain", {})):
        status, data = http.request("POST", "/sdapi/v1/txt2img", json.dumps({**body, **more}).encode(), AUTH)
        assert status == 200, data[:300]
        answer = json.loads(data)
        made[name] = (json.loads(answer["info"])["infotexts"][0],
                      pixels(Image.open(io.BytesIO(base64.b64decode(answer["images"][0])))))
    assert "Refiner: sdxl-tiny-refiner, Refiner switch at: 0.5," in made["refined"][0]
    assert "Refiner switch at: 0.8," in made["default"][0] and "Refiner" not in made["plain"][0]
    assert not np.array_equal(made["refined"][1], made["plain"][1])
    status, data = http.request("POST", "/sdapi/v1/txt2img", json.dumps(
        {**body, "refiner_checkpoint": "sd_xl_refiner_1.0 [7440042bbd]"}).encode(), AUTH)
    assert status == 422 and "its refiner is sdxl-tiny-refiner" in said(data), data
    # At a size outside --network-sizes (the app's: 64x64) the refiner's programs compile when first
    # asked for, once; the call waits for them and answers.
    programs_made = lambda: sum(read_metrics(app_server["url"] + "/metrics")[name]  # (compiled, or read from the store)
                       for name in ("sdxl_compiles_total", "sdxl_programs_loaded_total"))
    counts = [programs_made()]
    for _ in range(2):
        status, data = http.request("POST", "/sdapi/v1/txt2img", json.dumps(
            {**body, "width": 96, "refiner_checkpoint": "sdxl-tiny-refiner", "refiner_switch_at": 0.5}).encode(), AUTH)
        assert status == 200, data[:300]
        assert "Size: 96x64, Model: tiny, " in json.loads(json.loads(data)["info"])["infotexts"][0]
        counts.append(programs_made())
    assert counts[0] < counts[1] == counts[2], counts


def test_xyz_plot_through_a1111s_script_args(app_server, tiny_pipeline):
    """A1111's X/Y/Z plot through webuiapi (script_name "x/y/z plot", script_args in A1111's order):
    steps 1 and 2 across, CFG 3 and 7 down, the cells made in calls that share what they can; the
    answer the grid (A1111's order: x fastest), each cell's pixels those of the same image made on
    its own, the grid's parameters naming the axes as A1111 writes them; then the cells themselves
    with include_lone_images. A script that is not offered, or args it cannot read, are refused."""
    import webuiapi

    api = webuiapi.WebUIApi(host="127.0.0.1", port=app_server["port"], sampler="Euler", steps=STEPS)
    api.set_auth("me", API_KEY)
    assert api.get_scripts() == {"txt2img": ["x/y/z plot"], "img2img": ["x/y/z plot"]}
    args = [4, "1,2", None, 6, "3, 7", None, 0, "", None, True, True, False, False, False, False, False, 0, False]
    made = api.txt2img(prompt=PROMPT, seed=SEED, width=64, height=64, scheduler="Checkpoint",
                       script_name="x/y/z plot", script_args=args)
    assert len(made.images) == 5  # the grid, then the four cells (include_lone_images)
    grid, cells = made.images[0], made.images[1:]
    assert grid.width > 2 * 64 and grid.height > 2 * 64  # (the labels' margins)
    text = read_parameters(grid)
    assert "Script: X/Y/Z plot, X Type: Steps, X Values: \"1,2\", Y Type: CFG Scale, Y Values: \"3, 7\"" in text, text
    for cell, (steps, cfg) in zip(cells, [(1, 3.0), (2, 3.0), (1, 7.0), (2, 7.0)], strict=True):
        alone = tiny_pipeline.generate(PROMPT, "", seed=SEED, guidance_scale=cfg, steps=steps, size=(64, 64),
                                       sampler="Euler").images[0]
        np.testing.assert_array_equal(pixels(cell), np.asarray(alone))
        assert f"Steps: {steps}," in read_parameters(cell) and f"CFG scale: {cfg:g}," in read_parameters(cell)
        # The grid holds each cell's image, in A1111's order (x fastest), below the column labels.
    np.testing.assert_array_equal(pixels(grid)[-64:, -64:], pixels(cells[3]))
    for script, script_args, said_text in (("prompt matrix", [], "not offered"),
                                           ("x/y/z plot", [4, "1-"], "script_args"),
                                           ("x/y/z plot", [99, "1", None] + [0, "", None] * 2, "X")):
        with pytest.raises(RuntimeError) as refused:
            api.txt2img(prompt=PROMPT, width=64, height=64, script_name=script, script_args=script_args)
        assert refused.value.args[0] == 422 and said_text in refused.value.args[1], refused.value.args


def test_openai_api_on_the_app_behind_its_key(app_server, from_generate):
    """The official openai client against the app: a wrong key is its AuthenticationError; with the
    key (Bearer) four images as base64 whose parameters are /generate's."""
    import openai

    url = app_server["url"] + "/v1"
    with pytest.raises(openai.AuthenticationError) as refused:
        openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).images.generate(prompt=PROMPT, size="64x64")
    assert refused.value.body["code"] == "invalid_api_key"
    client = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0)
    made = client.images.generate(prompt=PROMPT, n=4, size="64x64", response_format="b64_json",
                                  extra_body={"negative_prompt": NEGATIVE, "seed": SEED, "steps": STEPS,
                                              "sampler": "Euler", "guidance_scale": 5.0})
    images = [Image.open(io.BytesIO(base64.b64decode(d.b64_json))) for d in made.data]
    assert [read_parameters(image) for image in images] == from_generate


def test_mcp_tool_on_the_app(app_server, from_generate):
    """The official mcp client over streamable HTTP: the server lists /generate as a tool an agent
    can read (what it does, each argument); a call gives the four images, as the files /generate
    writes (their parameters inside), with their captions and progress notifications on the way.
    Without the key the server refuses the client."""
    import httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    url = app_server["url"] + "/gradio_api/mcp/"

    async def session_run(headers: dict, work):
        async with (httpx.AsyncClient(headers=headers, timeout=120) as http,
                    streamable_http_client(url, http_client=http) as (read, write, _),
                    ClientSession(read, write) as session):
            await session.initialize()
            return await work(session)

    async def call(session):
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        progress: list[str] = []

        async def on_progress(done, total, message):
            progress.append(message or "")

        result = await session.call_tool("generate", {"prompt": PROMPT, "negative": NEGATIVE, "seed": SEED,
                                                      "steps": STEPS, "sampler": "Euler"},
                                         progress_callback=on_progress)
        return tools, result, progress

    tools, result, progress = asyncio.run(session_run({"Authorization": f"Bearer {API_KEY}"}, call))
    assert list(tools) == ["generate"], list(tools)
    tool = tools["generate"]
    assert "Four images from one prompt" in tool.description
    schema = tool.inputSchema
    assert schema["required"] == ["prompt"] and "seed" in schema["properties"]["seed"]["description"], schema
    assert not result.isError, result.content
    images = [c for c in result.content if c.type == "image"]
    texts = [c.text for c in result.content if c.type == "text"]
    assert len(images) == 4 and all(c.mimeType == "image/jpeg" for c in images)
    decoded = [Image.open(io.BytesIO(base64.b64decode(c.data))) for c in images]
    assert [read_parameters(image) for image in decoded] == from_generate
    assert texts[:4] == [f"seed {SEED + i}" for i in range(4)] and any("Generated 4 images" in t for t in texts)
    assert any("Step" in message for message in progress), progress
    with pytest.raises(Exception) as refused:
        asyncio.run(session_run({}, lambda session: session.list_tools()))
    assert "401" in repr(refused.value) or "Unauthorized" in repr(refused.value), repr(refused.value)


# --- the fuzz: every new route, at least 300 malformed or hostile bodies each ---

@functools.cache
def hostile_images() -> list:
    """The image corpus as base64 (what the decoder refuses), and its values that are no bytes."""
    others = [data for _, data in hostile_files() if data is not None and not isinstance(data, bytes)]
    return others + [base64.b64encode(data).decode() for data in hostile_bytes()]


def a1111_bodies(img2img: bool) -> list[bytes]:
    from sdxl_tpu.a1111.a1111_api import ONLY_DEFAULT

    base = {"prompt": "a cat", "steps": 1, "width": 64, "height": 64}
    fields = {"prompt": NOT_TEXT, "negative_prompt": NOT_TEXT, "sampler_name": NOT_CHOICE, "scheduler": NOT_CHOICE,
              "seed": NOT_NUMBER + [-2, 2**40], "steps": NOT_NUMBER + [0, -1, 10**6],
              "width": NOT_NUMBER + [0, 7, 65, 10**6], "height": NOT_NUMBER + [0, 7, 65], "cfg_scale": NOT_NUMBER,
              "batch_size": NOT_NUMBER + [0, 65], "n_iter": NOT_NUMBER + [0, 1000],
              "send_images": ["yes", 2, {"a": 1}], "styles": ["x", [5], [{"a": 1}], ["no such style"], [["x"]]],
              "override_settings": ["x", 5, [1], {"sd_model_checkpoint": "other"}, {"randn_source": "NV"},
                                    {"sd_model_checkpoint": {"a": 1}}, {"samples_format": 5}],
              # (units: test_backend fuzzes them further)
              "alwayson_scripts": ["x", 12345, [1], {"a": [1]}, {"controlnet": "x"}, {"controlnet": {"args": 5}},
                                   {"ControlNet": {"args": [5]}}, {"controlnet": {"args": [{"model": "x"}]}},
                                   {"ADetailer": {"args": [True]}, "controlnet": {"args": []}}]}
    bodies = [{**base, name: value} for name, values in fields.items() for value in values]
    bodies += [{**base, name: value} for name in ONLY_DEFAULT for value in ("x", 12345, {"a": [1]})]
    # A refiner this server does not have, and the one it has with a switch that is not a fraction.
    bodies += [{**base, "refiner_checkpoint": name} for name in ("other", "other [0123456789]", 5, [1], {"a": 1})]
    bodies += [{**base, "refiner_checkpoint": "sdxl-tiny-refiner", "refiner_switch_at": value}
               for value in ("x", True, [0.5], {"a": 1}, -0.5, 2)]
    # The X/Y/Z plot: another script, args without one, and script_args whose every place is wrong.
    plot = {**base, "script_name": "x/y/z plot"}
    good = [4, "1,2", None, 0, "", None, 0, "", None]
    bodies += [{**base, "script_name": value} for value in NOT_CHOICE + ["prompt matrix"]]
    bodies += [{**base, "script_args": [4, "1"]}, {**plot, "batch_size": 2, "script_args": good}]
    bodies += [{**plot, "script_args": value} for value in NOT_ANY + [None, [], good[:8], good + [0] * 10]]
    bodies += [{**plot, "script_args": [*good[:i], value, *good[i + 1:]]}
               for i, values in ((0, [v for v in NOT_CHOICE if type(v) is not int] + [-1, 999]),  # (5: a type)
                                 (1, NOT_TEXT + ["0-", "1-5 (+0)", "x", "1-100000"]), (9, NOT_BOOL))
               for value in values]
    bodies += [{**plot, "script_args": [7, "dog,cat", None] + good[3:]},  # (S/R: "dog" is not in "a cat")
               {**plot, "script_args": [4, "1-64", None, 6, "1-64", None] + good[6:]},  # (4096 cells)
               {**plot, "script_args": [9, "Euler,Nope", None] + good[3:]}]
    if not img2img:  # (A1111's img2img has no hires fix: it ignores these)
        hires = {"hr_upscaler": NOT_CHOICE, "hr_scale": NOT_NUMBER + [1.1, 3, 0.5], "enable_hr": NOT_BOOL,
                 "hr_second_pass_steps": NOT_NUMBER + [-1, 10**6], "denoising_strength": NOT_NUMBER + [-1, 2]}
        bodies += [{**base, "enable_hr": True, name: value} for name, values in hires.items() for value in values]
    if img2img:
        image = base64.b64encode(_png()).decode()
        start = {**base, "init_images": [image]}
        bodies = [{**body, "init_images": [image]} for body in bodies]
        bodies += [{**base, "init_images": value} for value in ([], "x", [5], [image, image], {"a": 1})]
        bodies += [{**base, "init_images": [value]} for value in hostile_images()]
        bodies += [{**start, "mask": value} for value in hostile_images()[::3] if value != ""]  # ("": no mask)
        bodies += [{**start, "resize_mode": value} for value in NOT_NUMBER + [3, 4, -1]]
        masked = {**start, "mask": base64.b64encode(_png(mask=True)).decode()}  # (the inpainting settings need one)
        bodies += [{**masked, name: value} for name, values in (
            ("mask_blur", NOT_NUMBER + [-1, 10**6]), ("inpainting_fill", NOT_NUMBER + [4, -1]),
            ("inpaint_full_res", NOT_BOOL), ("inpaint_full_res_padding", NOT_NUMBER + [-1, 10**6]))
                   for value in values]
    return NOT_JSON + [json.dumps(body).encode() for body in bodies]


def _png(mask: bool = False) -> bytes:
    return encoded(block_mask() if mask else picture(), "PNG")


def openai_bodies() -> list[bytes]:
    base = {"prompt": "a cat", "size": "64x64", "steps": 1}
    from sdxl_tpu.request.fields import BY_API
    from sdxl_tpu.routes.openai_api import OWN_FIELDS

    fields = {"prompt": NOT_TEXT + ["", "   "], "model": NOT_CHOICE + ["sd3-medium", "DALL-E-3", "dall-e-3 "],
              "n": NOT_NUMBER + [0, 11, -1],
              "size": NOT_CHOICE + ["1x1", "64x64x64", "0x0", "-64x64", "1024x1024"],
              "response_format": NOT_CHOICE, "output_format": NOT_CHOICE, "quality": NOT_CHOICE + ["hd", "high"],
              "background": NOT_CHOICE + ["transparent"], "style": NOT_CHOICE + ["vivid"]}
    for name in OWN_FIELDS:  # (every field this server adds, by its kind and limits: a new one joins)
        field = BY_API[name]
        beyond = [field.limits[0] - 1, field.limits[1] + 10**6] if field.limits else []
        fields[name] = {"text": NOT_TEXT, "choice": NOT_CHOICE, "number": NOT_NUMBER, "whole": NOT_NUMBER + [1.5],
                        "switch": NOT_BOOL}[field.kind] + beyond
    bodies = [{**base, name: value} for name, values in fields.items() for value in values]
    unknown = ("image", "mask", "prompt2", "__proto__", "../x", "\x00", "", "A" * 300, "cfg_scale", "sampler_name",
               "width", "height", "batch_size", "n_iter", "negative", "guidance", "scheduler", "init_images")
    bodies += [{**base, name: 1} for name in unknown]
    return NOT_JSON + [json.dumps(body).encode() for body in bodies]


def edit_bodies() -> list[tuple[bytes, str]]:
    """Multipart bodies (body, content type): hostile images and masks, hostile fields, broken multipart."""
    boundary = "fuzzboundary"

    def multipart(parts: list[tuple[str, bytes | str]]) -> bytes:
        out = b""
        for name, value in parts:
            file = isinstance(value, bytes)
            out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\""
                    + ('; filename="x.png"\r\nContent-Type: image/png' if file else "") + "\r\n\r\n").encode()
            out += (value if file else value.encode()) + b"\r\n"
        return out + f"--{boundary}--\r\n".encode()

    kind = f"multipart/form-data; boundary={boundary}"
    image = _png()
    cases = [(multipart([("prompt", "a cat"), ("image", data)]), kind) for data in hostile_bytes()]
    cases += [(multipart([("prompt", "a cat"), ("image", image), ("mask", data)]), kind)
              for data in hostile_bytes()[::2]]
    for name, values in (("n", ["x", "0", "11", "1.5"]), ("size", ["x", "1x1", "64x64x1"]), ("steps", ["x", "0"]),
                         ("strength", ["x", "2", "nan"]), ("response_format", ["x"]), ("model", ["sd3-medium"]),
                         ("seed", ["x", "-2"]), ("image", ["not a file"]), ("unknown", ["1"])):
        cases += [(multipart([("prompt", "a cat"), ("image", image), (name, v)]), kind) for v in values]
    cases += [(multipart([("prompt", "a cat")]), kind), (multipart([("image", image)]), kind),
              (multipart([("prompt", "a cat"), ("image", image), ("image", image)]), kind),
              (b"--fuzzboundary\r\ngarbage", kind), (b"", kind), (b'{"prompt": "a cat"}', "application/json"),
              (multipart([("prompt", "a cat"), ("image", image)]), "multipart/form-data"),
              (multipart([("prompt", "a cat"), ("image", image)]), "multipart/form-data; boundary=other")]
    return cases


@functools.cache
def hostile_bytes() -> list[bytes]:
    """The image corpus's files (hostile_files) that the decoder refuses."""
    from sdxl_tpu.request.errors import RequestError
    from sdxl_tpu.imaging.image_input import decode_image

    refused = []
    for _, data in hostile_files():
        if isinstance(data, bytes):
            try:
                decode_image(data)
            except RequestError:
                refused.append(data)
    return refused


def mcp_messages() -> list[dict | bytes]:
    """JSON-RPC messages to an MCP session: broken envelopes, unknown methods, hostile tool calls."""
    call = lambda arguments, name="generate": {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                               "params": {"name": name, "arguments": arguments}}
    messages: list[dict | bytes] = list(NOT_JSON)
    messages += [{"jsonrpc": v, "id": 1, "method": "tools/list"} for v in ("1.0", 2, None)]
    messages += [{"jsonrpc": "2.0", "id": i, "method": m} for i, m in ((1, "nope"), ([1], "tools/list"),
                                                                       ({"a": 1}, "tools/list"), (1, 5))]
    messages += [{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": p}
                 for p in (None, 5, "x", [], {"name": 5}, {"name": "generate", "arguments": 5})]
    messages += [call({}, name) for name in ("nope", "../generate", "generate_in_page", "reuse_seed", "", "\x00")]
    for value in NOT_ANY + NOT_TEXT:  # (as the message's id, a tool's name, the arguments)
        messages += [call({}, value), {**call({}), "params": {"name": "generate", "arguments": value}}]
        if isinstance(value, (bool, float, list, dict)):  # (an id is text or a whole number)
            messages.append({"jsonrpc": "2.0", "id": value, "method": "tools/list"})
    messages += [{"jsonrpc": "2.0", "id": 3, "method": "resources/read", "params": {"uri": uri}}
                 for uri in ("file:///etc/passwd", "../../etc/passwd", "/proc/self/environ", "http://127.0.0.1:1/",
                             "gradio://x", "", "x" * 5000, 5, None, {"a": 1})]
    messages += [{"jsonrpc": "2.0", "id": 4, "method": "prompts/get", "params": {"name": name}}
                 for name in ("nope", "../x", "", 5, None, {"a": 1})]
    messages += [{"jsonrpc": "2.0", "id": 5, "method": "logging/setLevel", "params": {"level": level}}
                 for level in ("nope", 5, None)]
    messages += [{"jsonrpc": "2.0", "id": 6, "method": method, "params": 5}
                 for method in ("initialize", "ping", "tools/list", "resources/list", "prompts/list",
                                "completion/complete")]
    from sdxl_tpu.request.fields import FIELDS

    fields = {"steps": [0, 10**6, "x"], "size": ["512x512", "x"], "sampler": ["nope"], "schedule": ["nope"],
              "rng": ["nope"], "style": ["nope"], "image": ["/etc/passwd", "http://127.0.0.1:1/x.png"],
              **{f.name: NOT_ANY for f in FIELDS}}
    messages += [call({"prompt": "a cat", "steps": 1, name: value}) for name, values in fields.items()
                 for value in values]
    return messages


AUTH = {"Authorization": f"Bearer {API_KEY}"}


def said(data: bytes) -> str:
    """The message of a refusal in either shape ({"error": message} or OpenAI's error object)."""
    error = json.loads(data)["error"]
    return error["message"] if isinstance(error, dict) else error


def extras_bodies() -> list[bytes]:
    """Bodies for /sdapi/v1/extra-single-image that must be refused: broken JSON, hostile images, and
    a good image with each field it reads wrong (what A1111 would take but this server does not offer
    included: face restoration, a second upscaler, an upscale past its most pixels)."""
    as_text = lambda image: base64.b64encode(encoded(image, "PNG")).decode("ascii")
    good = as_text(picture(64, 48))
    bodies = NOT_JSON + [json.dumps({"image": value}).encode() for value in hostile_images() + NOT_TEXT]
    fields = {"upscaler_1": NOT_CHOICE, "resize_mode": NOT_NUMBER + [2, -1, 0.5],
              "upscaling_resize": NOT_NUMBER + [0.5, 4.5, 100], "gfpgan_visibility": [1, 0.5, "x", [0]],
              "codeformer_visibility": [1, 0.2, "1"], "upscaler_2": ["Lanczos", "nope", 5],
              "extras_upscaler_2_visibility": [0.3, 1, "x"]}
    bodies += [json.dumps({"image": good, "upscaler_1": "Lanczos", name: value}).encode()
               for name, values in fields.items() for value in values]
    to_size = {"upscaling_resize_w": NOT_NUMBER + [0, 63, 10**6], "upscaling_resize_h": NOT_NUMBER + [0, 8193],
               "upscaling_crop": NOT_BOOL}
    bodies += [json.dumps({"image": good, "upscaler_1": "Lanczos", "resize_mode": 1, name: value}).encode()
               for name, values in to_size.items() for value in values]
    big = as_text(Image.new("RGB", (2048, 2048), (9, 9, 9)))
    bodies += [json.dumps({"image": big, "upscaler_1": "Lanczos", "upscaling_resize": 2.5}).encode()]
    return bodies


@pytest.mark.parametrize("route", ["/sdapi/v1/txt2img", "/sdapi/v1/img2img", "/sdapi/v1/options",
                                   "/sdapi/v1/png-info", "/sdapi/v1/extra-single-image", "/v1/images/generations",
                                   "/v1/images/edits"])
def test_fuzz_the_tool_apis(app_server, route):
    """At least 300 malformed or hostile bodies on each route of the other tools' APIs (a few
    without the key): each a 4xx whose message says what is wrong, never a 5xx, no file of the
    server's served, at most two log lines each, the server up."""
    if route.startswith("/sdapi/v1/txt2img"):
        bodies = a1111_bodies(img2img=False)
    elif route == "/sdapi/v1/img2img":
        bodies = a1111_bodies(img2img=True)
    elif route == "/sdapi/v1/options":
        bodies = NOT_JSON + [json.dumps({key: 1}).encode() for key in ("sd_model_checkpoint", "randn_source")]
        bodies += [json.dumps({f"option_{i}" if i % 3 else "../" * i: "x", "sd_vae": "Automatic"}).encode()
                   for i in range(300)]
    elif route == "/sdapi/v1/png-info":
        images = hostile_images()
        bodies = NOT_JSON + [json.dumps({"image": value}).encode() for value in images + NOT_TEXT]
        bodies += [json.dumps({"image": "data:image/png;base64," + value}).encode()  # (as A1111's clients send them)
                   for value in images if isinstance(value, str)]
    elif route == "/sdapi/v1/extra-single-image":
        bodies = extras_bodies()
    elif route == "/v1/images/generations":
        bodies = openai_bodies()
    else:
        bodies = edit_bodies()
    http, log = Http(app_server), AppLog(app_server)
    assert len(bodies) >= 300, len(bodies)
    cases = [(body, {**AUTH}) for body in bodies] + [(bodies[-1], {}), (bodies[-1], {"Authorization": "Basic !!"}),
                                                     (bodies[-1], {"Authorization": "Bearer " + "k" * 5000})]
    for body, headers in cases:
        if isinstance(body, tuple):
            body, headers = body[0], {**headers, "Content-Type": body[1]}
        log.inputs += 1
        status, data = http.request("POST", route, body, headers)
        assert 400 <= status < 500 and said(data), (route, re.sub(rb'"init_images": \["[^"]*"', b"...", body)[:300],
                                                     status, data[:300])
    log.assert_quiet()
    assert http.statuses.keys() <= {400, 401, 404, 413, 415, 422}, http.statuses


def test_fuzz_the_mcp_server(app_server):
    """At least 300 malformed or hostile JSON-RPC messages to an MCP session on the app (broken
    envelopes, unknown methods and tools, tool calls whose every argument is wrong): each answered
    with an error that names the problem (a JSON-RPC error, or a tool result marked as an error),
    never a 5xx, no file read for an image argument, at most two log lines each."""
    http, log = Http(app_server), AppLog(app_server)
    headers = {**AUTH, "Accept": "application/json, text/event-stream"}
    hello = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "fuzz", "version": "1"}}}
    session = mcp_session(app_server, headers, hello)
    headers = {**headers, "mcp-protocol-version": "2025-06-18", **({"mcp-session-id": session} if session else {})}
    messages = mcp_messages()
    assert len(messages) >= 300, len(messages)
    for message in messages:
        body = message if isinstance(message, bytes) else json.dumps(message).encode()
        log.inputs += 1
        status, data = http.request("POST", "/gradio_api/mcp/", body, headers)
        assert status < 500, (body[:200], status, data[:300])
        answer = rpc_answer(data)
        if 200 <= status < 300 and isinstance(message, dict) and "id" in message:
            problem = (answer.get("error") or {}).get("message") or (
                answer.get("result", {}).get("isError") and answer["result"]["content"][0]["text"])
            assert problem, (body[:200], answer)
    for path in ("/gradio_api/mcp/", "/gradio_api/mcp/sse"):  # (and without the key: refused)
        log.inputs += 1
        status, data = http.request("POST" if path.endswith("/") else "GET", path, json.dumps(hello).encode())
        assert status == 401, (path, status, data[:200])
    log.assert_quiet()


def mcp_session(app_server, headers: dict, hello: dict) -> str:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", app_server["port"], timeout=30)
    try:
        connection.request("POST", "/gradio_api/mcp/", json.dumps(hello).encode(),
                           {**headers, "Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        assert response.status == 200, response.status
        return response.getheader("mcp-session-id")
    finally:
        connection.close()


def rpc_answer(data: bytes) -> dict:
    """A JSON-RPC answer, sent as JSON or as a server-sent event ({} if none)."""
    text = data.decode("utf-8", "replace")
    for line in text.splitlines():
        if line.startswith("data:"):
            return json.loads(line[5:])
    try:
        answer = json.loads(text)
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}
