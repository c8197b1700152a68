"""Time to ready: how long `python app.py` takes until it serves (the first size compiled) and until
every size is, cold (an empty compilation cache), from the programs the cold start stored (a
second start), and from JAX's persistent cache alone (a third, the stored programs removed).

    python benchmarks/ready.py --model tiny --sizes 1024x1024 --sizes sdxl
    python benchmarks/ready.py --architecture small --sizes 1024x1024 --sizes sdxl

Each configuration starts the app in a process of its own on 127.0.0.1 and polls /readyz (every
50 ms): "ready" is its first 200, "all sizes" the first 200 whose body lists nothing compiling.
"programs" is the part of the start spent compiling or loading the sizes' programs, the sum of
the seconds the app's log gives each size (tracing included). --architecture writes a random
checkpoint of that architecture (make-tiny's) and serves it instead of --model.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "helpers")]

from served_app import free_port, get  # noqa: E402

from sdxl_tpu.generate.compiling.stored_programs import SUBDIRECTORY  # noqa: E402


def readyz(url: str) -> tuple[int, dict]:
    status, body = get(url + "/readyz")
    try:
        return status, json.loads(body) if status == 200 else {}
    except ValueError:
        return status, {}


# The app's lines for the sizes' programs (compiled.py, stored_programs.py): "WxH[, WxH...]: N
# programs loaded from ... in 1.2 s".
PROGRAMS_LINE = re.compile(r"\d+x\d+(?:, \d+x\d+)*: \d+ programs loaded from .* in ([\d.]+) s$", re.M)


def start_once(model: str, sizes: str, cache: Path, workdir: Path, tiny: Path, timeout: float) -> dict[str, float]:
    """Seconds from the start of the process to ready, to all sizes compiled, and in programs."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, GRADIO_TEMP_DIR=str(workdir / "gradio"), SDXL_TPU_TINY_DIR=str(tiny))
    argv = [sys.executable, "app.py", "--model", model, "--sizes", sizes, "--port", str(port),
            "--compile-cache", str(cache)]
    start = time.monotonic()
    logged = (workdir / "app.log").stat().st_size if (workdir / "app.log").exists() else 0
    with open(workdir / "app.log", "a") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    times: dict[str, float] = {}
    try:
        while time.monotonic() - start < timeout:  # bounded
            if proc.poll() is not None:
                raise RuntimeError(f"the app exited ({proc.returncode}); see {workdir / 'app.log'}")
            status, body = readyz(url)
            if status == 200:
                times.setdefault("ready_s", time.monotonic() - start)
                if not body.get("compiling"):
                    times["all_sizes_s"] = time.monotonic() - start
                    with open(workdir / "app.log") as log:
                        log.seek(logged)
                        times["programs_s"] = round(sum(map(float, PROGRAMS_LINE.findall(log.read()))), 1)
                    return times
            time.sleep(0.05)
        raise TimeoutError(f"not ready with every size after {timeout:.0f} s")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--architecture", help="serve a random checkpoint of this architecture (e.g. small)")
    parser.add_argument("--sizes", action="append", default=None,
                        help="a --sizes value of the app (repeatable: one configuration each; "
                             "default 1024x1024 and sdxl)")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="sdxl-ready-") as tmp:
        tiny = Path(tmp) / "tiny"  # written once, before any start is timed
        subprocess.run([sys.executable, "-m", "sdxl_tpu", "make-tiny", str(tiny)], cwd=ROOT, check=True,
                       capture_output=True)
        model = args.model
        if args.architecture:
            model = str(Path(tmp) / args.architecture)
            subprocess.run([sys.executable, "-m", "sdxl_tpu", "make-tiny", model, "--architecture", args.architecture],
                           cwd=ROOT, check=True, capture_output=True)
        for sizes in args.sizes or ["1024x1024", "sdxl"]:
            cache = Path(tmp) / f"cache-{len(results)}"  # empty: the first start is cold
            workdir = Path(tmp) / f"run-{len(results)}"
            workdir.mkdir()
            for kind in ("cold", "stored", "jax-cache"):
                if kind == "jax-cache":  # JAX's persistent cache alone: every program traced again
                    shutil.rmtree(cache / SUBDIRECTORY)
                results.append({"sizes": sizes, "cache": kind,
                                **start_once(model, sizes, cache, workdir, tiny, args.timeout)})
    if args.json:
        print(json.dumps(results))
    else:
        print(f"{'sizes':<12} {'cache':<10} {'ready':>9} {'all sizes':>10} {'programs':>9}")
        for r in results:
            print(f"{r['sizes']:<12} {r['cache']:<10} {r['ready_s']:>8.1f}s {r['all_sizes_s']:>9.1f}s"
                  f" {r['programs_s']:>8.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
