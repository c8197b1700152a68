"""The whole chain on one machine, as deployed across hosts: back ends (`python -m sdxl_tpu serve
--model tiny`) behind nginx (deploy/nginx.conf, started here as a plain process), and the
playground as a front end (`python app.py --backend http://nginx`). Back ends die and are replaced
during a run of requests; no request may be lost."""

from __future__ import annotations

import base64
import json
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from images import picture
from served_app import (ROOT, artifact, assert_progress_and_previews, free_port, generate_in_page, get,
                        playground_page, read_metrics, requests_total, start_app, start_backend, stop, wait_for)

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
STEPS = 12  # long enough that back ends have requests in flight when they are stopped
REQUESTS, CLIENTS = 40, 4


class Nginx:
    """deploy/nginx.conf under its own prefix folder, listening on 127.0.0.1:`port`."""

    def __init__(self, prefix: Path, backends: list[int]):
        self.prefix, self.port = prefix, free_port()
        prefix.mkdir(parents=True)
        shutil.copy(ROOT / "deploy" / "nginx.conf", prefix / "nginx.conf")
        (prefix / "listen.conf").write_text(f"listen 127.0.0.1:{self.port};\n")
        self.write_backends(backends)
        self.log = prefix / "nginx.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(self.command("-g", "daemon off;"), stdout=out, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while get(self.url + "/healthz")[0] != 200:  # bounded: 30 s
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.1)

    def command(self, *args: str) -> list[str]:
        return [NGINX, "-p", str(self.prefix), "-c", str(self.prefix / "nginx.conf"), "-e", "stderr", *args]

    def write_backends(self, ports: list[int]) -> None:
        (self.prefix / "backends.conf").write_text(
            "".join(f"server 127.0.0.1:{p} max_fails=2 fail_timeout=5s;\n" for p in ports))

    def reload(self, ports: list[int]) -> None:
        """New upstream list, then `nginx -s reload`; returns once new workers run it."""
        old = self.workers()
        self.write_backends(ports)
        subprocess.run(self.command("-s", "reload"), check=True, timeout=30, capture_output=True)
        deadline = time.monotonic() + 30
        while not self.workers() - old:  # bounded: 30 s
            assert time.monotonic() < deadline, "nginx did not start new workers after the reload"
            time.sleep(0.05)

    def workers(self) -> set[int]:
        children = set()
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if entry.name.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                children.add(int(entry.name))
        return children

    def close(self) -> None:
        stop(self.proc)


@pytest.fixture(scope="module")
def chain(tmp_path_factory, compile_cache):
    """Back ends A and B (C is started by the test that needs it), nginx over A and B, and the
    front end over nginx."""
    root = tmp_path_factory.mktemp("chain")
    starters = {name: start_backend(root / name, compile_cache,
                                    extra_args=("--queue-size", "4", "--drain-seconds", "60"))
                for name in ("A", "B", "C")}
    for name in ("A", "B", "C"):
        (root / name).mkdir()
    backends = {name: next(starters[name]) for name in ("A", "B")}
    nginx = Nginx(root / "nginx", [backends["A"]["port"], backends["B"]["port"]])
    front = start_app(root / "front", compile_cache, extra_args=("--backend", nginx.url, "--queue-size", "8"))
    try:
        yield {"backends": backends, "starters": starters, "nginx": nginx, "front": next(front), "root": root}
    finally:
        front.close()
        nginx.close()
        for starter in starters.values():
            starter.close()


def _generate(client, seed: int, steps: int = STEPS):
    return client.predict("a lighthouse in a storm", "blurry", "(No style)", seed, False, 5.0, steps, "64x64", "Euler",
                          api_name="/generate")


def test_requests_survive_a_killed_and_a_drained_back_end(chain):
    from gradio_client import Client

    a, b = chain["backends"]["A"], chain["backends"]["B"]
    front, nginx = chain["front"], chain["nginx"]
    before = read_metrics(front["url"] + "/metrics")
    lock, done, results, issued = threading.Lock(), [], {}, iter(range(REQUESTS))
    c_joined, served = threading.Event(), {}

    def client_loop() -> None:
        client = Client(front["url"] + "/", verbose=False, download_files=False)
        while True:
            with lock:
                i = next(issued, None)
            if i is None:
                return
            if i >= 24:  # the rest wait (bounded) until C has joined, so that B is stopped mid-run
                assert c_joined.wait(300), "C did not join"
            try:
                gallery, info = _generate(client, seed=1000 * i)
                results[i] = (len(gallery), info)
            except Exception as e:  # recorded, so the test says which request failed and why
                results[i] = (0, f"{type(e).__name__}: {e}")
            with lock:
                done.append(i)

    def count_done() -> int:
        with lock:
            return len(done)

    def busy(backend) -> bool:
        """A request is waiting on `backend` (so one is running there too)."""
        return read_metrics(backend["url"] + "/metrics")["sdxl_queue_depth"] >= 1

    timeline = []
    start = time.monotonic()
    clients = [threading.Thread(target=client_loop) for _ in range(CLIENTS)]
    for thread in clients:
        thread.start()
    try:
        wait_for(lambda: count_done() >= 6, 300, "the first requests did not finish")
        wait_for(lambda: busy(a), 60, "A never had a request waiting")
        served["A"] = requests_total(read_metrics(a["url"] + "/metrics"), "ok")
        a["proc"].send_signal(signal.SIGKILL)  # one request running on it, one waiting
        timeline.append(f"A killed at {time.monotonic() - start:.1f} s, {count_done()} done")
        chain["backends"]["C"] = c = next(chain["starters"]["C"])
        nginx.reload([b["port"], c["port"]])
        timeline.append(f"C joined at {time.monotonic() - start:.1f} s, {count_done()} done")
        c_joined.set()
        wait_for(lambda: count_done() >= 28, 300, "requests after C joined did not finish")
        wait_for(lambda: busy(b), 60, "B never had a request waiting")
        served["B"] = requests_total(read_metrics(b["url"] + "/metrics"), "ok")
        b["proc"].send_signal(signal.SIGTERM)
        terminated = time.monotonic()
        timeline.append(f"B terminated at {terminated - start:.1f} s, {count_done()} done")
    finally:
        c_joined.set()
        for thread in clients:
            thread.join(600)
    elapsed = time.monotonic() - start
    assert b["proc"].wait(timeout=120) == 0  # drained, then exited
    timeline.append(f"B exited {time.monotonic() - terminated:.1f} s after SIGTERM")
    served["C"] = requests_total(read_metrics(c["url"] + "/metrics"), "ok")
    after = read_metrics(front["url"] + "/metrics")
    retries = front["log"].read_text().count("did not get the images")
    print(f"{REQUESTS} requests from {CLIENTS} clients in {elapsed:.1f} s; " + "; ".join(timeline) +
          f"; served (ok) by A before its kill {served['A']:.0f}, by B before its SIGTERM {served['B']:.0f}, "
          f"by C {served['C']:.0f}; front end retries {retries}")

    lost = {i: r for i, r in results.items() if r[0] != 4}
    assert not lost and sorted(results) == list(range(REQUESTS)), lost
    assert all("Generated 4 images of 64x64" in info for _, info in results.values())
    assert requests_total(after, "ok") - requests_total(before, "ok") == REQUESTS
    assert requests_total(after, "failed") == requests_total(before, "failed")
    assert served["A"] > 0 and served["B"] > 0 and served["C"] > 0  # the load was spread over every back end
    assert retries >= 1  # A's requests broke off when it was killed and were sent again
    # C, the replacement, started from the programs the first back ends stored: nothing compiled.
    c_metrics = read_metrics(c["url"] + "/metrics")
    assert c_metrics["sdxl_compiles_total"] == 0 and c_metrics["sdxl_programs_loaded_total"] > 0
    for name in ("B", "C"):
        assert "Traceback" not in chain["backends"][name]["log"].read_text()
    assert "Traceback" not in front["log"].read_text()


def _live_backend(chain) -> dict:
    return next(b for b in chain["backends"].values() if b["proc"].poll() is None)


def test_the_chain_gives_what_the_back_end_makes(chain):
    """Front end -> nginx -> back end hands the client what the back end alone makes for the same
    request: the same four images, pixel for pixel, under the same parameters text. (What the
    two hops cost in time is a benchmark's figure, not a test's: benchmarks/serve.py.)"""
    from io import BytesIO

    import numpy as np
    from gradio_client import Client
    from PIL import Image

    from sdxl_tpu.a1111.images import read_parameters

    backend = _live_backend(chain)
    body = json.dumps({"prompt": "a lighthouse in a storm", "negative_prompt": "blurry", "seed": 7, "steps": 2,
                       "size": "64x64", "sampler": "Euler"}).encode()
    request = urllib.request.Request(backend["url"] + "/v1/generate", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        direct = json.loads(response.read())
    direct_images = [Image.open(BytesIO(base64.b64decode(b))) for b in direct["images"]]

    client = Client(chain["front"]["url"] + "/", verbose=False, download_files=False)
    gallery, _ = _generate(client, seed=7, steps=2)
    chained_images = []
    for item in gallery:
        with urllib.request.urlopen(item["image"]["url"], timeout=30) as r:
            chained_images.append(Image.open(BytesIO(r.read())))
    assert len(direct_images) == len(chained_images) == 4
    for ours, theirs in zip(chained_images, direct_images):
        assert np.array_equal(np.asarray(ours), np.asarray(theirs))
        assert read_parameters(ours) == read_parameters(theirs)
    assert read_parameters(chained_images[0]).startswith("a lighthouse in a storm\nNegative prompt: blurry\nSteps: 2,")
    # Four different images (seeds 7..10), so equal pixels above are not four copies of one.
    assert len({np.asarray(i).tobytes() for i in chained_images}) == 4
    # From an image, through the page's API on the front end (an upload, forwarded as the fitted
    # image): the back end's own answer for the same image, pixel for pixel.
    from gradio_client import handle_file

    start = BytesIO()
    picture(96, 72).save(start, "PNG")
    (chain["root"] / "start.png").write_bytes(start.getvalue())
    body = json.dumps({"prompt": "a lighthouse in a storm", "negative_prompt": "blurry", "seed": 7, "steps": 4,
                       "size": "64x64", "sampler": "Euler", "image": base64.b64encode(start.getvalue()).decode(),
                       "strength": 0.5, "resize_mode": "Crop and resize"}).encode()
    def same_from_both(fields: dict, *form) -> list:
        """The back end's images for `fields` and the front end's for the page's `form` values after
        the image's: equal pixel for pixel, under the same parameters text."""
        request = urllib.request.Request(backend["url"] + "/v1/generate", data=json.dumps(fields).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            direct = [Image.open(BytesIO(base64.b64decode(b))) for b in json.loads(response.read())["images"]]
        gallery, _ = client.predict("a lighthouse in a storm", "blurry", "(No style)", 7, False, 5.0, 4, "64x64",
                                    "Euler", "Checkpoint", "JAX", handle_file(str(chain["root"] / "start.png")), 0.5,
                                    "Crop and resize", *form, api_name="/generate")
        served = []
        for item, theirs in zip(gallery, direct, strict=True):
            with urllib.request.urlopen(item["image"]["url"], timeout=30) as r:
                ours = Image.open(BytesIO(r.read()))
            assert np.array_equal(np.asarray(ours), np.asarray(theirs))
            assert read_parameters(ours) == read_parameters(theirs)
            served.append(ours)
        return served

    assert all("Denoising strength: 0.5," in read_parameters(im) for im in same_from_both(json.loads(body)))
    # ... and with a mask (inpainting; forwarded blurred and fitted, its blur named): the same again.
    mask = BytesIO()
    Image.fromarray(np.kron(np.eye(3, 4, dtype=np.uint8) * 255, np.ones((24, 24), np.uint8))).save(mask, "PNG")
    (chain["root"] / "mask.png").write_bytes(mask.getvalue())
    inpaint = {**json.loads(body), "mask": base64.b64encode(mask.getvalue()).decode(), "mask_blur": 6,
               "masked_content": "latent noise"}
    masked = (handle_file(str(chain["root"] / "mask.png")), 6, "latent noise")
    assert all("Mask blur: 6, Masked content: latent noise," in read_parameters(im)
               for im in same_from_both(inpaint, *masked))
    # ... and Only masked (forwarded whole, with its blurred mask: the back end crops and pastes back).
    only = same_from_both({**inpaint, "inpaint_area": "Only masked", "mask_padding": 8}, *masked,
                          False, 2, "Latent", 0, 0.7, "Only masked", 8)
    assert all(im.size == (96, 72) for im in only)  # (the starting image's own size)
    assert all("Inpaint area: Only masked, Masked area padding: 8," in read_parameters(im) for im in only)
    # A starting image of a few MB (img2img) passes nginx to a back end, which runs it.
    noise = np.random.default_rng(0).integers(0, 256, (900, 1200, 3), np.uint8)
    png = BytesIO()
    Image.fromarray(noise).save(png, "PNG", compress_level=1)
    body = json.dumps({"prompt": "a cat", "steps": 2, "image": base64.b64encode(png.getvalue()).decode(),
                       "strength": 0.5}).encode()
    assert len(body) > 3 << 20
    request = urllib.request.Request(chain["nginx"].url + "/v1/generate", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.loads(response.read())
    assert len(answer["images"]) == 4 and "Denoising strength: 0.5" in answer["parameters"][0]
    # The other tools' APIs on the front end: A1111's client there gets what it gets from a back end
    # itself (batch_size x n_iter split into calls, each forwarded), OpenAI's the same images.
    import openai
    import webuiapi

    a1111 = dict(prompt="a lighthouse in a storm", negative_prompt="blurry", seed=7, steps=2, cfg_scale=5.0,
                 width=64, height=64, batch_size=2, n_iter=3, scheduler="Checkpoint")
    through = webuiapi.WebUIApi(host="127.0.0.1", port=chain["front"]["port"], sampler="Euler").txt2img(**a1111)
    direct = webuiapi.WebUIApi(host="127.0.0.1", port=backend["port"], sampler="Euler").txt2img(**a1111)
    assert len(through.images) == 6 and through.info["all_seeds"] == direct.info["all_seeds"] == list(range(7, 13))
    for ours, theirs in zip(through.images, direct.images, strict=True):
        assert np.array_equal(np.asarray(ours), np.asarray(theirs)) and read_parameters(ours) == read_parameters(theirs)
    made = openai.OpenAI(base_url=chain["front"]["url"] + "/v1", api_key="-", max_retries=0).images.generate(
        prompt="a lighthouse in a storm", n=4, size="64x64", extra_body={"negative_prompt": "blurry", "seed": 7,
                                                                         "steps": 2, "sampler": "Euler"})
    for item, theirs in zip(made.data, direct.images[:4], strict=True):
        assert np.array_equal(np.asarray(Image.open(BytesIO(base64.b64decode(item.b64_json)))), np.asarray(theirs))


def test_browser_against_the_chain(chain, tmp_path):
    screenshot = artifact(tmp_path, "front-end.png")
    with playground_page(chain["front"]["url"], "Ready: images are made by tiny on the back ends.") as page:
        seen = generate_in_page(page, "a lighthouse on a cliff during a storm", "blurry")
        # The back end's progress and previews, relayed: the step count advances, previews come first.
        assert_progress_and_previews(seen, 20)
        assert "Generated 4 images of 64x64" in page.locator("#summary").inner_text()
        # Token counts without a model: the front end loaded only the tokenizer.
        assert "/ 225 tokens" in page.locator("#token-count").inner_text()
        page.screenshot(path=str(screenshot), full_page=True)
        # The image the page shows is the back end's file, parameters embedded.
        source = page.locator("#gallery .grid-container img").first.get_attribute("src")
        with urllib.request.urlopen(urllib.parse.urljoin(chain["front"]["url"] + "/", source), timeout=30) as r:
            from io import BytesIO

            from PIL import Image

            from sdxl_tpu.a1111.images import read_parameters

            parameters = read_parameters(Image.open(BytesIO(r.read())))
        assert parameters.startswith("a lighthouse on a cliff during a storm\nNegative prompt: blurry\nSteps: 20,")
    assert screenshot.stat().st_size > 10_000
