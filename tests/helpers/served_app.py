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

ROOT = Path(__file__).resolve().parents[2]
QUEUE_SIZE = 2
SIZES = "64x64,96x64,96x96"  # square and wide, and 64x64's hires fix (1.5x)
API_KEY = "sdxl-test-key-7f3a9"  # the shared app's: the other tools' APIs and MCP need it


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


def requests_total(values: dict[str, float], outcome: str, route: str | None = None) -> float:
    """Requests of an outcome, on one route or (None) on all."""
    return sum(value for name, value in values.items() if name.startswith("sdxl_requests_total{")
               and f'outcome="{outcome}"' in name and (route is None or f'route="{route}"' in name))


CHROMIUM = "/usr/bin/chromium"


def launch_chromium(playwright):
    """Debian's Chromium, headless, quiet (no network of its own), as the browser tests use it."""
    import shutil

    assert shutil.which(CHROMIUM) or os.path.exists(CHROMIUM), "Debian's chromium is not installed (see .ci/run)"
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync", "--disable-quic"])


@contextlib.contextmanager
def chromium():
    """Headless Chromium (see launch_chromium), for several pages."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def playground_page(url: str, ready_text: str, viewport: tuple[int, int] = (1280, 800), browser=None):
    """The playground at `url` in headless Chromium (`browser`, else one of its own), in a fresh
    context (no storage of earlier pages), once it shows `ready_text` (bounded: 1 minute)."""
    with contextlib.ExitStack() as stack:
        browser = browser or stack.enter_context(chromium())
        context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
        stack.callback(context.close)
        page = context.new_page()
        page.goto(url + "/", timeout=60_000)
        page.get_by_text(ready_text).wait_for(timeout=60_000)
        yield page


def artifact(tmp_path: Path, name: str) -> Path:
    """Where a test leaves a file for people to look at ($SDXL_TPU_ARTIFACTS, else `tmp_path`)."""
    path = Path(os.environ.get("SDXL_TPU_ARTIFACTS", tmp_path)) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


# Records what a person would see change while a run goes: each change of the run panel (its line
# and bar), of the gallery's captions and of the Generate button, with its time.
WATCH_JS = """() => {
  window.__seen = [];
  const t0 = performance.now();
  const record = () => {
    const bar = document.querySelector('#progress progress');
    const status = (document.querySelector('#progress .run-panel')?.innerText || '') +
                   (bar ? ` [bar ${bar.value}/${bar.max} ${Math.round(bar.getBoundingClientRect().width)}px]` : '');
    const captions = [...document.querySelectorAll('#gallery .caption-label')].map(c => c.innerText);
    const images = document.querySelectorAll('#gallery .grid-container img').length;
    const last = window.__seen[window.__seen.length - 1];
    const button = document.querySelector('#generate');
    const now = {t: performance.now() - t0, status, captions: captions.join('|'), images,
                 button: button ? `${button.innerText}${button.disabled ? ' (disabled)' : ''}` : '',
                 info: document.querySelector('#summary')?.innerText || ''};
    if (!last || last.status !== now.status || last.captions !== now.captions || last.info !== now.info ||
        last.button !== now.button)
      window.__seen.push(now);
  };
  window.__watch = new MutationObserver(record);
  window.__watch.observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
  record();
}"""


def steps_seen(seen: list[dict]) -> list[int]:
    """The step counts the run panel showed ("step 7 of 20"), in order, each once."""
    import re

    steps = []
    for s in seen:
        m = re.search(r"step (\d+) of (\d+)", s["status"])
        if m and (not steps or steps[-1] != int(m.group(1))):
            steps.append(int(m.group(1)))
    return steps


MASK_SRC = "() => document.querySelector('#mask img')?.src || ''"


def paint_a_mask(page, at: tuple[float, float] = (0.5, 0.5)) -> str:
    """Paints a short stroke in the inpaint editor (its image already in), at `at` (fractions of
    the canvas), as a person drags the brush; waits (bounded) for the painting to become the mask
    and returns the mask's URL."""
    before = page.evaluate(MASK_SRC)
    painter = page.locator("#mask-painter")
    painter.scroll_into_view_if_needed()
    wait_for(lambda: painter.locator("canvas").count() > 0, 30, "the inpaint editor did not open the image")
    page.wait_for_timeout(500)  # (the background drawn)
    box = painter.locator("canvas").first.bounding_box()
    x, y = box["x"] + box["width"] * at[0], box["y"] + box["height"] * at[1]
    page.mouse.move(x, y)
    page.mouse.down()
    for i in range(8):
        page.mouse.move(x + 5 * i, y + 2 * (i % 2), steps=2)
    page.mouse.up()
    wait_for(lambda: "painted-" in page.evaluate(MASK_SRC) != before, 30, "the painting did not become the mask")
    return page.evaluate(MASK_SRC)


def generate_in_page(page, prompt: str | None, negative: str | None = None, seconds: float = 120,
                     keys: str | None = None, images: int = 4) -> list[dict]:
    """Types a prompt and a negative prompt (None: leaves the field as it is) in the playground page,
    clicks Generate (or presses `keys` in the prompt box, e.g. "Control+Enter") and waits (bounded)
    for the final images (four, or `images` with a Batch count) and the line that reports them.
    Returns what the page showed meanwhile (see WATCH_JS): dicts of t, status, captions, images, info."""
    if prompt is not None:
        page.locator("#prompt textarea").fill(prompt)
    if negative is not None:
        page.locator("#negative textarea").fill(negative)
    before = page.locator("#summary").inner_text()
    page.evaluate(WATCH_JS)
    if keys:
        page.locator("#prompt textarea").press(keys)
    else:
        page.locator("#generate").click()
    deadline = time.monotonic() + seconds
    while True:  # bounded: the final images replace the previews, and the timing line is new
        info = page.locator("#summary").inner_text()
        captions = page.locator("#gallery .grid-container .caption-label").all_inner_texts()
        if info != before and "Generated 4 images" in info and len(captions) == images and \
                all(c.startswith("seed ") for c in captions):
            break
        assert time.monotonic() < deadline, f"no images after {seconds:.0f} s: {info!r} {captions}"
        page.wait_for_timeout(50)
    page.wait_for_timeout(100)
    return page.evaluate("() => { window.__watch.disconnect(); return window.__seen; }")


def assert_progress_and_previews(seen: list[dict], steps: int) -> None:
    """What a person watching a run sees: the step count advancing to the last step, the four
    previews before the four final images."""
    shown = steps_seen(seen)
    assert len(shown) >= min(steps, 5) and shown == sorted(shown) and shown[-1] >= steps - 1, shown
    first_final = next(i for i, s in enumerate(seen) if s["captions"].startswith("seed "))
    previews = [s for s in seen[:first_final] if s["captions"].startswith("preview · step ")]
    assert previews and all(p["captions"].count("preview") == 4 and p["images"] == 4 for p in previews), seen
    assert seen[first_final]["images"] == 4


LAYOUT_JS = """() => {
  const gallery = document.querySelector('#gallery');
  const box = r => ({left: r.left, top: r.top, right: r.right, bottom: r.bottom, width: r.width, height: r.height});
  const wrap = gallery.querySelector('.grid-wrap');
  const images = [...gallery.querySelectorAll('.grid-container img')].map(img => {
    const r = img.getBoundingClientRect();
    const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    return {...box(r), hit: hit === img, natural: [img.naturalWidth, img.naturalHeight]};
  });
  const captions = [...gallery.querySelectorAll('.grid-container .caption-label')].map(c => {
    const r = c.getBoundingClientRect();
    const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    return {...box(r), text: c.innerText, hit: c.contains(hit)};
  });
  return {gallery: box(gallery.getBoundingClientRect()), viewport: {width: innerWidth, height: innerHeight},
          inner_scroll: wrap ? wrap.scrollHeight - wrap.clientHeight : 0, images, captions};
}"""


def assert_four_images_in_view(page, desktop: bool) -> dict:
    """All four images and their captions entirely visible, with nothing over them, once the page is
    scrolled to the gallery (no scrolling inside it); on a desktop the gallery fits the viewport."""
    page.locator("#gallery").scroll_into_view_if_needed()
    page.wait_for_timeout(100)
    layout = page.evaluate(LAYOUT_JS)
    viewport, gallery = layout["viewport"], layout["gallery"]
    inside = lambda r, outer, margin=0.5: (r["left"] >= outer.get("left", 0) - margin and
                                           r["top"] >= outer.get("top", 0) - margin and
                                           r["right"] <= outer.get("right", viewport["width"]) + margin and
                                           r["bottom"] <= outer.get("bottom", viewport["height"]) + margin)
    assert len(layout["images"]) == 4 and len(layout["captions"]) == 4, layout
    assert layout["inner_scroll"] <= 1, layout
    for image in layout["images"]:
        assert image["width"] > 40 and image["hit"] and inside(image, {}) and inside(image, gallery), (image, layout)
    for caption in layout["captions"]:
        assert caption["text"].startswith("seed ") and caption["hit"] and inside(caption, {}), (caption, layout)
    if desktop:
        assert gallery["height"] <= viewport["height"], layout
    return layout


def wait_for(condition, seconds: float, what) -> None:
    """Polls `condition()` until it holds; fails with `what` (text, or a function saying what is
    there instead) after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():  # bounded
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.02)


def start_server(argv: list[str], env: dict[str, str], log: Path, port: int, wait: float = 600.0):
    """Starts `argv` (a server listening on 127.0.0.1:`port`) in ROOT and waits (bounded, `wait`
    seconds) until /readyz answers 200 with every size compiled (it answers 200 once the first
    is). Yields (proc, base URL, the /readyz codes seen); stops the process (SIGTERM, then
    SIGKILL) afterwards if it still runs."""
    import json

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
                code, body = get(base + "/readyz")
                readiness.append(code)
                # (nothing compiling in the background either: a test's calls run on a quiet server)
                if code == 200 and not json.loads(body).get("compiling") and not json.loads(body).get("unfinished"):
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
    # No JAX_PLATFORMS: the app starts as on a machine without an accelerator (see quiet_platforms).
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env.update(SDXL_TPU_TINY_DIR=str(workdir / "tiny"), SDXL_TPU_TEST_SECRET=secret, SDXL_QUEUE_SIZE=str(QUEUE_SIZE),
               GRADIO_TEMP_DIR=str(cache_dir), **(env_extra or {}))
    argv = [sys.executable, "app.py", "--model", "tiny", "--sizes", SIZES, "--dtype", "float32", "--host", "127.0.0.1",
            "--port", str(port), "--compile-cache", str(compile_cache), *extra_args]
    for proc, base, readiness in start_server(argv, env, log, port):
        yield {"url": base, "port": port, "readiness": readiness, "log": log, "proc": proc, "cache_dir": cache_dir,
               "secret": secret, "secret_file": secret_file}
