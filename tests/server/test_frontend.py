"""A front end (`python app.py --backend URL`) as it runs on a Space while its back ends come and
go: it listens at once (the page, /healthz, /readyz 503 saying it waits for the back ends), runs
no model and maps no JAX, becomes ready when a back end describes itself (the open page's menus
and defaults become the back end's), is not ready while they are away, ready again when they
return, and never exits for them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from served_app import ROOT, artifact, free_port, get, playground_page, wait_for

from sdxl_tpu.request.names import DEFAULT_RNG, DEFAULT_SCHEDULE, RNGS, SCHEDULES

# A back end unlike the front end's own defaults (20 steps, guidance 5, every sampler, the sampling
# presets): SDXL-Lightning's 4-step preset, two samplers; it serves the built-in tiny model, whose
# tokenizer the front end makes itself (without JAX) to count tokens.
INFO = {"model": "tiny", "sizes": ["64x64"], "samplers": ["Euler", "Euler a"], "default_sampler": "Euler",
        "preset": "Lightning 4-step", "presets": ["Lightning 4-step"], "images_per_call": 4, "image_format": "jpeg",
        "max_prompt_chunks": 3, "schedules": list(SCHEDULES), "default_schedule": DEFAULT_SCHEDULE,
        "rngs": list(RNGS), "default_rng": DEFAULT_RNG}


class InfoOnlyBackend:
    """Answers GET /v1/info as a back end does once warm; nothing else is needed here."""

    def __init__(self, port: int):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                body = json.dumps(INFO).encode() if self.path == "/v1/info" else b"{}"
                self.send_response(200 if self.path == "/v1/info" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.http = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def readyz(base: str) -> tuple[int, dict]:
    status, text = get(base + "/readyz")
    return status, (json.loads(text) if text else {})


def mapped(pid: int, name: str) -> bool:
    with open(f"/proc/{pid}/maps") as maps:
        return name in maps.read()


def test_a_front_end_answers_at_once_and_follows_its_back_ends(tmp_path):
    port, backend_port = free_port(), free_port()
    tiny = tmp_path / "tiny"  # (where "tiny" is written: nothing there yet)
    env = dict(os.environ, JAX_PLATFORMS="cpu", SDXL_REMOTE_CHECK_SECONDS="0.5", SDXL_TPU_TINY_DIR=str(tiny))
    started = time.monotonic()
    with open(tmp_path / "frontend.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "app.py", "--backend", f"http://127.0.0.1:{backend_port}",
                                 "--port", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    backend = None
    try:
        # No back end yet: listening anyway, alive, not ready, and saying why.
        wait_for(lambda: get(base + "/healthz")[0] == 200, 120, "the front end never answered /healthz")
        print(f"front end: /healthz after {time.monotonic() - started:.1f} s, no back end")
        status, body = readyz(base)
        assert status == 503 and body["status"] == "loading", body
        assert f"back end at http://127.0.0.1:{backend_port}" in body["message"], body
        page_status, page = get(base + "/")  # the page, saying in its status line what it waits for
        assert page_status == 200 and "Connecting to the back end at" in page
        # It runs no model: JAX (jaxlib's extension) is not even mapped into the process.
        assert not mapped(proc.pid, "jaxlib") and not mapped(proc.pid, "flax"), "a front end loaded JAX"
        with open(f"/proc/{proc.pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        print(f"front end: RSS {rss / 1024:.0f} MB")
        with playground_page(base, "Connecting to the back end at") as page:
            # A person opening the page now sees why nothing can run yet.
            run = page.locator("#generate")
            assert run.inner_text() == "Warming up…" and run.is_disabled()
            page.screenshot(path=str(artifact(tmp_path, "front-end-waiting.png")))
            # A back end comes: ready, and the open page takes its offer without a reload.
            backend = InfoOnlyBackend(backend_port)
            wait_for(lambda: readyz(base)[0] == 200, 30, "the front end did not become ready when a back end answered")
            assert "images are made by tiny" in readyz(base)[1]["message"]
            page.get_by_text("images are made by tiny").first.wait_for(timeout=30_000)
            page.locator("#generate:not([disabled])").wait_for(timeout=10_000)
            assert run.inner_text() == "Generate"
            assert page.locator("#size input").input_value() == "1:1 square · 64 × 64"  # the back end's one size
            assert page.locator("#preset input").is_visible()  # (a main control: nothing to open)
            wait_for(lambda: page.locator("#preset input").input_value() == "Lightning 4-step", 10,
                     "the preset menu did not become the back end's")
            assert page.locator("#steps input[type=number]").input_value() == "4"
            assert float(page.locator("#guidance input[type=number]").input_value()) == 0
            assert page.locator("#sampler input").input_value() == "Euler"
            # Token counts with the back end's tokenizer (loaded in the background once it answered).
            counter = page.locator("#token-count [data-testid=markdown]")
            page.locator("#prompt textarea").fill("a cat sitting on a red chair")
            counted = lambda: re.fullmatch(r"[1-9]\d* / 225 tokens", counter.inner_text())
            wait_for(counted, 60, "the front end counted no tokens for the back end's model")
            page.locator("#sampler input").click()
            options = lambda menu: [text.split("\n")[-1]  # (a ✓ marks the chosen one)
                                    for text in page.locator(f"#{menu} [role=option]").all_inner_texts()]
            assert options("sampler") == ["Euler", "Euler a"]
            page.keyboard.press("Escape")
            page.locator("#preset input").click()
            assert options("preset") == ["Lightning 4-step", "Custom"]
            page.keyboard.press("Escape")
            # It goes: not ready (the load balancer stops sending users), but alive and listening, and
            # the page says so.
            backend.stop()
            backend = None
            wait_for(lambda: readyz(base)[0] == 503, 30, "the front end stayed ready with its back ends gone")
            status, body = readyz(base)
            assert body["status"] == "waiting" and "Waiting for the back ends" in body["message"], body
            assert get(base + "/healthz")[0] == 200 and proc.poll() is None
            page.get_by_text("Waiting for the back ends").first.wait_for(timeout=30_000)
        # It returns: ready again.
        backend = InfoOnlyBackend(backend_port)
        wait_for(lambda: readyz(base)[0] == 200, 30, "the front end did not become ready again")
        assert proc.poll() is None
        # Still no JAX after serving its back ends' description: the tiny model's tokenizer was
        # written alone, not the checkpoint (whose random weights need JAX).
        assert not mapped(proc.pid, "jaxlib") and not mapped(proc.pid, "flax"), "a front end loaded JAX once connected"
        assert (tmp_path / "tiny-tokenizers" / "tokenizer" / "vocab.json").is_file() and not tiny.exists()
    finally:
        if backend is not None:
            backend.stop()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
