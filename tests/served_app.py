"""The playground as people launch it (`python app.py --model tiny`), on 127.0.0.1, for the tests
that drive it over HTTP (test_app.py, test_security.py share one server: it takes a minute)."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUEUE_SIZE = 2
SIZES = "64x64,96x64"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def read_metrics(url: str) -> dict[str, float]:
    """GET a /metrics URL, parsed: 'name{label="value"}' (or 'name') -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    status, text = get(url)
    assert status == 200, text
    return {sample.name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items())) + "}"
                           if sample.labels else ""): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def requests_total(values: dict[str, float], outcome: str) -> float:
    return values[f'sdxl_requests_total{{outcome="{outcome}"}}']


CHROMIUM = "/usr/bin/chromium"


def launch_chromium(playwright):
    """Debian's Chromium, headless, quiet (no network of its own), as the browser tests use it."""
    import shutil

    assert shutil.which(CHROMIUM) or os.path.exists(CHROMIUM), "Debian's chromium is not installed (see .ci/run)"
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync", "--disable-quic"])


@contextlib.contextmanager
def playground_page(url: str, ready_text: str):
    """The playground at `url` in headless Chromium, once it shows `ready_text` (bounded: 1 minute)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1400})
            page.goto(url + "/", timeout=60_000)
            page.get_by_text(ready_text).wait_for(timeout=60_000)
            yield page
        finally:
            browser.close()


def artifact(tmp_path: Path, name: str) -> Path:
    """Where a test leaves a file for people to look at ($SDXL_TPU_ARTIFACTS, else `tmp_path`)."""
    path = Path(os.environ.get("SDXL_TPU_ARTIFACTS", tmp_path)) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def generate_in_page(page, prompt: str, negative: str):
    """Types a prompt and a negative prompt in the playground page, clicks Generate and waits
    (bounded: 2 minutes) for the four images and the line that reports them; returns the images."""
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#negative textarea").fill(negative)
    page.locator("#generate").click()
    images = page.locator("#gallery img")
    deadline = time.monotonic() + 120
    while images.count() < 4 and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    assert images.count() == 4
    page.get_by_text("Generated 4 images").wait_for(timeout=30_000)
    return images


def wait_for(condition, seconds: float, what: str) -> None:
    """Polls `condition()` until it holds; fails with `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():  # bounded
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def start_server(argv: list[str], env: dict[str, str], log: Path, port: int, wait: float = 600.0):
    """Starts `argv` (a server listening on 127.0.0.1:`port`) in ROOT and waits (bounded, `wait`
    seconds) until /readyz answers 200. Yields (proc, base URL, the /readyz codes seen); stops
    the process (SIGTERM, then SIGKILL) afterwards if it still runs."""
    import pytest

    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    readiness = []
    try:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:  # bounded
            assert proc.poll() is None, log.read_text()[-3000:]
            if get(base + "/healthz")[0] == 200:
                code = get(base + "/readyz")[0]
                readiness.append(code)
                if code == 200:
                    break
            time.sleep(0.5)
        else:
            pytest.fail(f"{argv[1:3]} did not become ready in {wait:.0f} s:\n" + log.read_text()[-3000:])
        yield proc, base, readiness
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def start_backend(workdir: Path, compile_cache: Path, extra_args: tuple[str, ...] = (), port: int | None = None):
    """`python -m sdxl_tpu serve --model tiny` (64x64, float32) on 127.0.0.1; yields a dict: url,
    port, readiness, log, proc. The tiny checkpoint is written once per `workdir`'s parent."""
    port = port or free_port()
    log = workdir / "backend.log"
    env = dict(os.environ, JAX_PLATFORMS="cpu", SDXL_TPU_TINY_DIR=str(workdir.parent / "tiny"))
    argv = [sys.executable, "-m", "sdxl_tpu", "serve", "--model", "tiny", "--sizes", "64x64", "--dtype", "float32",
            "--host", "127.0.0.1", "--port", str(port), "--compile-cache", str(compile_cache), *extra_args]
    for proc, url, readiness in start_server(argv, env, log, port):
        yield {"url": url, "port": port, "readiness": readiness, "log": log, "proc": proc}


def start_app(workdir: Path, compile_cache: Path, extra_args: tuple[str, ...] = (),
              env_extra: dict[str, str] | None = None):
    """Starts app.py and waits (bounded, 10 minutes) until /readyz answers 200. Yields a dict:
    url, readiness (the /readyz codes seen), log, proc, cache_dir (Gradio's), secret (a marker
    that is in the process environment and in a file outside the cache, `secret_file`)."""
    port = free_port()
    log = workdir / "app.log"
    secret = "sdxl-secret-" + secrets.token_hex(8)
    secret_file = workdir / "outside-the-cache" / "secret.txt"
    secret_file.parent.mkdir(parents=True)
    secret_file.write_text(secret)
    cache_dir = workdir / "gradio"
    env = dict(os.environ, JAX_PLATFORMS="cpu", SDXL_TPU_TINY_DIR=str(workdir / "tiny"), SDXL_TPU_TEST_SECRET=secret,
               SDXL_QUEUE_SIZE=str(QUEUE_SIZE), GRADIO_TEMP_DIR=str(cache_dir), **(env_extra or {}))
    argv = [sys.executable, "app.py", "--model", "tiny", "--sizes", SIZES, "--dtype", "float32", "--host", "127.0.0.1",
            "--port", str(port), "--compile-cache", str(compile_cache), *extra_args]
    for proc, base, readiness in start_server(argv, env, log, port):
        yield {"url": base, "port": port, "readiness": readiness, "log": log, "proc": proc, "cache_dir": cache_dir,
               "secret": secret, "secret_file": secret_file}
