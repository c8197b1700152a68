"""The playground, launched as people launch it (`python app.py --model tiny`) on 127.0.0.1,
driven through gradio_client, plain HTTP and a real headless Chromium."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from served_app import (ROOT, artifact, free_port, generate_in_page, get, playground_page,  # app_server: conftest
                        read_metrics, requests_total)


@pytest.fixture(scope="module")
def client(app_server):
    from gradio_client import Client

    return Client(app_server["url"] + "/", verbose=False)


def _generate(client, prompt="a photo of a cat", negative="blurry", style="(No style)", seed=5, randomize=False,
              guidance=5.0, steps=2, size="64x64", *sampler):
    return client.predict(prompt, negative, style, seed, randomize, guidance, steps, size, *sampler,
                          api_name="/generate")


def test_readyz_is_503_while_warming_up_then_200(app_server):
    assert app_server["readiness"][0] == 503 and app_server["readiness"][-1] == 200
    assert get(app_server["url"] + "/healthz") == (200, '{"status":"alive"}')


def test_client_gets_four_images_with_seeds(client):
    gallery, info = _generate(client, seed=41, steps=3)
    assert len(gallery) == 4
    assert [item["caption"] for item in gallery] == ["seed 41", "seed 42", "seed 43", "seed 44"]
    from PIL import Image

    assert all(Image.open(item["image"]).size == (64, 64) for item in gallery)
    assert "Generated 4 images of 64x64" in info and "Seeds: 41, 42, 43, 44" in info
    # Each image the API returns carries its A1111 parameters (JPEG: EXIF UserComment).
    from sdxl_tpu.images import read_parameters

    assert [read_parameters(Image.open(item["image"])) for item in gallery] == [
        f"a photo of a cat\nNegative prompt: blurry\nSteps: 3, Sampler: Euler, CFG scale: 5, Seed: {seed}, "
        "Size: 64x64, Model: tiny" for seed in (41, 42, 43, 44)]
    assert all(Image.open(item["image"]).format == "JPEG" for item in gallery)
    gallery, _ = _generate(client, size="96x64", style="Pixel art", randomize=True)
    assert Image.open(gallery[0]["image"]).size == (96, 64)
    # The sampler is the last input; left out, it is the model's own (Euler for the tiny model).
    for sampler in ("DPM++ 2M Karras", "Euler a"):
        gallery, info = _generate(client, "a cat", "", "(No style)", 1, False, 5.0, 3, "64x64", sampler)
        assert f"3 steps of {sampler}" in info
        assert f"Sampler: {sampler}," in read_parameters(Image.open(gallery[0]["image"]))
    assert all(0 <= int(item["caption"].split()[1]) < 2**32 for item in gallery)


# Every value reaches our checks as the client sent it (no Gradio preprocessing); the message
# names the field and the problem. The fuzz test in test_security.py sends many more.
@pytest.mark.parametrize("overrides, message", [
    (dict(prompt="   \t "), r"Please enter a prompt\."),
    (dict(prompt="\x00\x07\x1b"), r"Please enter a prompt\."),
    (dict(prompt=["a cat"]), r"Prompt must be text, got a list\."),
    (dict(seed=-1), r"Seed must be a whole number between 0 and 4294967295\."),
    (dict(seed=2**32), r"Seed must be a whole number between 0 and 4294967295\."),
    (dict(seed=1.5), r"Seed must be a whole number between 0 and 4294967295\."),
    (dict(guidance=25.0), r"Guidance scale must be a number between 0 and 20\."),
    (dict(steps=0), r"Steps must be a whole number between 1 and 50\."),
    (dict(steps=51), r"Steps must be a whole number between 1 and 50\."),
    (dict(steps=True), r"Steps must be a whole number between 1 and 50, got true/false\."),
    (dict(size="1024x1024"), r"Size '1024x1024' is not available; choose one of: 64x64, 96x64\."),
    (dict(style="Bogus"), r"Style 'Bogus' is not available"),
])
def test_bad_inputs_are_clear_errors_and_the_server_survives(client, overrides, message):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match=message) as info:
        _generate(client, **overrides)
    assert "Traceback" not in str(info.value)
    assert len(_generate(client, steps=1)[0]) == 4  # still serving


def test_control_characters_are_cleaned_and_long_prompts_refused_not_cut(client):
    from gradio_client.exceptions import AppError

    gallery, info = _generate(client, prompt="a\x00 cat\x1b[31m " + "very " * 100, negative="\x07blurry", steps=1)
    assert len(gallery) == 4 and "Generated" in info
    with pytest.raises(AppError, match=r"Prompt is 10,000 characters long; at most 1,000 are accepted\."):
        _generate(client, prompt="very " * 2000, steps=1)


def metrics(app_server) -> dict[str, float]:
    return read_metrics(app_server["url"] + "/metrics")


def test_metrics_count_outcomes_images_stages_and_no_compiles(app_server, client):
    from gradio_client.exceptions import AppError

    before = metrics(app_server)
    for steps in (1, 3):  # other step counts, prompts and seeds: no compile
        _generate(client, prompt=f"a cat, {steps} steps", seed=steps, steps=steps)
    with pytest.raises(AppError):
        _generate(client, steps=1.5)
    after = metrics(app_server)
    delta = lambda name: after[name] - before[name]
    assert requests_total(after, "ok") - requests_total(before, "ok") == 2
    assert requests_total(after, "user_error") - requests_total(before, "user_error") == 1
    assert delta("sdxl_images_total") == 8 and delta("sdxl_pipeline_calls_total") == 2
    assert delta("sdxl_request_seconds_count") == 2 and delta("sdxl_request_seconds_sum") > 0
    for stage in ("text_encoding", "denoising", "decoding", "saving"):
        assert delta(f'sdxl_stage_seconds_count{{stage="{stage}"}}') == 2
    assert after["sdxl_compiles_total"] == before["sdxl_compiles_total"] > 0  # warm-up compiled; requests did not
    assert after["sdxl_ready"] == 1 and after["sdxl_queue_depth"] == 0


def test_queue_is_bounded_and_busy_requests_are_told_so(app_server, client):
    from gradio_client.exceptions import AppError
    from gradio_client.utils import QueueError

    before = metrics(app_server)

    def call(i):
        try:
            _generate(client, seed=i, steps=50, size="96x64")
            return "ok"
        except (QueueError, AppError) as e:
            return str(e)

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(call, range(8)))
    print(outcomes)
    assert "ok" in outcomes
    turned_away = sum("Queue is full" in o and "try again" in o for o in outcomes)
    assert turned_away >= 1
    assert len(_generate(client, steps=1)[0]) == 4
    after = metrics(app_server)
    assert requests_total(after, "queue_full") - requests_total(before, "queue_full") == turned_away
    assert requests_total(after, "ok") - requests_total(before, "ok") == outcomes.count("ok") + 1


def test_abandoned_requests_stop_and_free_the_worker(app_server):
    """A caller that cancels (gradio_client's job.cancel closes its stream, as a closing tab does)
    stops its request between steps; one still queued is dropped without running."""
    from gradio_client import Client

    def new_client():
        return Client(app_server["url"] + "/", verbose=False, download_files=False)

    args = lambda seed, steps: ("a cat", "", "(No style)", seed, False, 5.0, steps, "96x64")
    timer = lambda: time.perf_counter()
    c = new_client()
    start = timer()
    c.predict(*args(1, 50), api_name="/generate")
    full = timer() - start
    start = timer()
    c.predict(*args(2, 1), api_name="/generate")
    one_step = timer() - start
    before = metrics(app_server)
    running, queued = new_client().submit(*args(3, 50), api_name="/generate"), None
    cancel_at = min(1.0, full / 3)
    time.sleep(cancel_at / 2)
    queued_client = new_client()
    queued = queued_client.submit(*args(4, 50), api_name="/generate")
    time.sleep(cancel_at / 2)
    queued.cancel()
    running.cancel()
    start = timer()
    gallery, _ = new_client().predict(*args(5, 1), api_name="/generate")
    after_cancel = timer() - start
    print(f"50 steps {full:.2f} s, 1 step {one_step:.2f} s; 1 step after cancelling a 50-step call "
          f"{cancel_at:.2f} s in: {after_cancel:.2f} s (it would wait {full - cancel_at:.2f} s for the rest)")
    assert len(gallery) == 4
    assert after_cancel < one_step + (full - cancel_at) / 2
    # The running request counted as cancelled; the queued one never ran (one call: the 1-step one
    # and the cancelled one).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # bounded: the cancelled call reports when it stops
        after = metrics(app_server)
        if requests_total(after, "cancelled") > requests_total(before, "cancelled"):
            break
        time.sleep(0.1)
    assert requests_total(after, "cancelled") - requests_total(before, "cancelled") == 1
    assert after["sdxl_pipeline_calls_total"] - before["sdxl_pipeline_calls_total"] == 2
    assert requests_total(after, "ok") - requests_total(before, "ok") == 1


def test_secure_defaults(app_server):
    base = app_server["url"]
    # Closed, and the body says why (not merely any 4xx: a route that refused one payload would pass that).
    for route in ("/monitoring/summary", "/monitoring"):  # gradio serves these unless monitoring is off
        status, body = get(base + route)
        assert status == 404 and "Not found. This server answers the page" in body, (route, status, body)
    for path in ("/etc/passwd", ROOT / "app.py"):
        status, body = get(base + f"/gradio_api/file={path}")
        assert status == 404 and "only files this app wrote are served" in body and "root:" not in body, body
    # The direct, queue-bypassing REST route is closed.
    request = urllib.request.Request(base + "/gradio_api/run/generate", data=b'{"data": ["a cat"]}',
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        urllib.request.urlopen(request, timeout=10)
        pytest.fail("direct API call was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 404 and b"through Gradio's queue" in e.read()
    log = app_server["log"].read_text()
    assert "gradio.live" not in log  # no share link
    assert "Running on public URL" not in log


def test_app_without_model_exits_with_one_paragraph(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "empty-cache"))
    result = subprocess.run([sys.executable, "app.py", "--model", "nobody/no-such-model", "--port",
                             str(free_port())], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "nobody/no-such-model" in errors[0] and "--model tiny" in errors[0]


def test_browser_types_a_prompt_and_gets_four_images(app_server, tmp_path):
    screenshot = artifact(tmp_path, "playground.png")
    with playground_page(app_server["url"], "Ready (") as page:
        page.locator("#examples").get_by_text("An astronaut riding a green horse").click()  # filled in the page
        deadline = time.monotonic() + 10
        while page.locator("#prompt textarea").input_value() != "An astronaut riding a green horse":
            assert time.monotonic() < deadline, "clicking an example did not fill the prompt"
            page.wait_for_timeout(100)
        generate_in_page(page, "a lighthouse on a cliff during a storm", "blurry")
        assert "tokens" in page.locator("#token-count").inner_text()
        page.screenshot(path=str(screenshot), full_page=True)
        # Clicking an image puts its seed in the seed field and turns randomize off.
        caption = page.locator("#gallery").get_by_text("seed ").first.inner_text()
        page.locator("#gallery img").first.click()
        # The preview's download button gives the file with its parameters in it.
        with page.expect_download(timeout=30_000) as download:
            page.locator("#gallery").get_by_label("Download", exact=True).click()
        downloaded = Path(download.value.path())
        from PIL import Image

        from sdxl_tpu.images import read_parameters

        parameters = read_parameters(Image.open(downloaded))
        assert parameters.startswith("a lighthouse on a cliff during a storm\nNegative prompt: blurry\nSteps: 20,")
        assert f"Seed: {caption.split()[1]}," in parameters and download.value.suggested_filename.endswith(".jpg")
        page.get_by_text("Advanced").click()
        seed_box = page.get_by_label("Seed", exact=True)
        deadline = time.monotonic() + 30
        while seed_box.input_value() != caption.split()[1] and time.monotonic() < deadline:
            page.wait_for_timeout(250)
        assert seed_box.input_value() == caption.split()[1]
        assert not page.get_by_label("Randomize seed").is_checked()
        # A preset fills steps, sampler and guidance in the page.
        page.locator("#preset input").click()
        page.get_by_role("option", name="Quality").click()
        sampler_box = page.get_by_label("Sampler", exact=True)
        deadline = time.monotonic() + 10
        while sampler_box.input_value() != "DPM++ 2M Karras" and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        assert sampler_box.input_value() == "DPM++ 2M Karras"
        assert page.locator("input[type=number][aria-label='number input for Steps']").input_value() == "30"
    assert screenshot.stat().st_size > 10_000
