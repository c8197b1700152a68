"""Serving overhead: what passes between the pipeline finishing and the client holding the images.

    python benchmarks/serve.py --size 1024x1024 --calls 5

Starts `python app.py --model tiny` once per configuration, then alternates calls between them
and reports, per configuration and client, the median of (client's time - the pipeline's own
total, read from the reply), the client holding every image's bytes. Two clients:
  - page: as the browser page gets them: the reply over Gradio's queue, then the gallery's files
    fetched together over keep-alive connections;
  - gradio_client: its `predict` with downloads, which fetches the files one after another, each
    through a new httpx client (about 40 ms each here, whatever the server does).
Configurations:
  - baseline: app.py of an earlier commit (`--baseline REV`, unpacked with `git archive`): the path
    before images were encoded by the app (Gradio encoded PNG itself, then the client fetched them);
  - jpeg / png / webp: today's app with `--image-format`;
  - jpeg+malloc: jpeg with glibc's malloc told to keep freed memory (MALLOC_MMAP_THRESHOLD_,
    MALLOC_TRIM_THRESHOLD_), see RESULTS.md.
Also reports each encoding lever alone (format, one image vs four in parallel) at the same size.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "65755319f51dcfbc9793c5ced6179aa0a03b8573"  # the last commit before the app encoded images itself
CLIENTS = ("page", "gradio_client")
MALLOC_KEEP = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def checkout(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


class App:
    def __init__(self, name: str, tree: Path, args: list[str], env: dict[str, str], workdir: Path):
        self.name, self.port = name, free_port()
        self.log = workdir / f"{name}.log"
        env = dict(os.environ, JAX_PLATFORMS="cpu", GRADIO_TEMP_DIR=str(workdir / f"{name}-gradio"), **env)
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "app.py", "--model", "tiny", "--port", str(self.port),
                                          "--host", "127.0.0.1", *args], cwd=tree, env=env, stdout=out,
                                         stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=5) as r:
                    if r.status == 200:
                        from gradio_client import Client

                        import httpx

                        self.client = Client(self.url + "/", verbose=False,
                                             download_files=tempfile.mkdtemp(prefix=f"serve-{self.name}-"))
                        self.page = Client(self.url + "/", verbose=False, download_files=False)
                        self.http = httpx.Client(limits=httpx.Limits(max_keepalive_connections=8))
                        return
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n{self.log.read_text()[-2000:]}")

    def call(self, size: str, seed: int, client: str = "gradio_client") -> float:
        """One call: the client's time minus the pipeline's own total."""
        fields = ("a photo of a cat", "blurry", "(No style)", seed, False, 5.0, 1, size)
        start = time.perf_counter()
        if client == "page":
            gallery, info = self.page.predict(*fields, api_name="/generate")
            with ThreadPoolExecutor(len(gallery)) as pool:
                sizes = list(pool.map(lambda item: len(self.http.get(item["image"]["url"]).content), gallery))
        else:
            gallery, info = self.client.predict(*fields, api_name="/generate")
            sizes = [os.path.getsize(item["image"]) for item in gallery]
        elapsed = time.perf_counter() - start
        assert len(sizes) == 4 and all(sizes)
        return elapsed - float(re.search(r" in ([0-9.]+) s", info).group(1))

    def stop(self) -> None:
        self.proc.terminate()
        try:  # an open client's heartbeat can keep Gradio from exiting (graceful drain: issue 11, part 4)
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def encoding_levers(size: tuple[int, int]) -> dict[str, float]:
    """Seconds to encode four images of `size` per format, one after another and in parallel."""
    import numpy as np
    from PIL import Image

    sys.path.insert(0, str(ROOT))
    from sdxl_tpu.a1111.images import encode

    w, h = size
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for _ in range(4)]
    out = {}
    for fmt in ("png", "jpeg", "webp"):
        start = time.perf_counter()
        for image in images:
            encode(image, "parameters", fmt)
        out[f"{fmt} one by one"] = time.perf_counter() - start
        start = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda im: encode(im, "parameters", fmt), images))  # noqa: B023 (called within the iteration)
        out[f"{fmt} in parallel"] = time.perf_counter() - start
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1024x1024")
    parser.add_argument("--calls", type=int, default=5, help="measured calls per configuration (after one warm-up)")
    parser.add_argument("--configs", default="baseline,jpeg,png,jpeg+malloc")
    parser.add_argument("--baseline", default=BASELINE, help="git revision of the baseline app")
    parser.add_argument("--compile-cache", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="sdxl-serve-bench-"))
    common = ["--sizes", args.size, "--dtype", "float32"]
    if args.compile_cache:
        common += ["--compile-cache", args.compile_cache]
    apps = []
    for name in args.configs.split(","):
        if name == "baseline":
            apps.append(App(name, checkout(args.baseline, workdir / "baseline-tree"), common, {}, workdir))
        else:
            fmt, _, extra = name.partition("+")
            apps.append(App(name, ROOT, [*common, "--image-format", fmt], MALLOC_KEEP if extra == "malloc" else {},
                            workdir))
    try:
        for app in apps:
            app.wait_ready(900)
            app.call(args.size, 0)  # warm-up
        overhead = {f"{app.name} ({client})": [] for app in apps for client in CLIENTS}
        for i in range(args.calls):  # alternate, so drift on a noisy machine hits all alike
            for app in apps:
                for client in CLIENTS:
                    name = f"{app.name} ({client})"
                    overhead[name].append(app.call(args.size, i + 1, client))
                    print(f"{name}: call {i + 1} overhead {overhead[name][-1]:.3f} s", file=sys.stderr, flush=True)
    finally:
        for app in apps:
            app.stop()
    w, h = (int(v) for v in args.size.split("x"))
    report = {"size": args.size, "calls": args.calls,
              "overhead_s": {name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                             for name, v in overhead.items()},
              "encoding_s": encoding_levers((w, h))}
    if args.json:
        print(json.dumps(report))
    else:
        for name, o in report["overhead_s"].items():
            print(f"{name:<28} overhead median {o['median']:.3f} s (min {o['min']:.3f}, max {o['max']:.3f})")
        for lever, seconds in report["encoding_s"].items():
            print(f"encode 4 x {args.size} {lever:<18} {seconds:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
