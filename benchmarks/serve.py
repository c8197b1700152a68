"""Serving overhead: what passes between the pipeline finishing and the client holding the images.

    python benchmarks/serve.py --size 1024x1024 --calls 5

Starts `python app.py --model tiny` once per configuration, then alternates calls between them
(gradio_client, files downloaded as a user's client does) and reports, per configuration, the
median of (client's time - the pipeline's own total, read from the reply). Configurations:
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

                        self.client = Client(self.url + "/", verbose=False,
                                             download_files=tempfile.mkdtemp(prefix=f"serve-{self.name}-"))
                        return
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n{self.log.read_text()[-2000:]}")

    def call(self, size: str, seed: int) -> float:
        """One call: the client's time minus the pipeline's own total."""
        start = time.perf_counter()
        gallery, info = self.client.predict("a photo of a cat", "blurry", "(No style)", seed, False, 5.0, 1, size,
                                            api_name="/generate")
        elapsed = time.perf_counter() - start
        assert len(gallery) == 4 and all(os.path.getsize(item["image"]) > 0 for item in gallery)
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
    from sdxl_tpu.images import encode

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
            list(pool.map(lambda im: encode(im, "parameters", fmt), images))
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
        overhead = {app.name: [] for app in apps}
        for i in range(args.calls):  # alternate, so drift on a noisy machine hits all alike
            for app in apps:
                overhead[app.name].append(app.call(args.size, i + 1))
                print(f"{app.name}: call {i + 1} overhead {overhead[app.name][-1]:.3f} s", file=sys.stderr, flush=True)
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
            print(f"{name:<12} overhead median {o['median']:.3f} s (min {o['min']:.3f}, max {o['max']:.3f})")
        for lever, seconds in report["encoding_s"].items():
            print(f"encode 4 x {args.size} {lever:<18} {seconds:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
