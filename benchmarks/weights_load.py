"""Weights at the disk's speed? Loading SDXL base 1.0's four networks (random weights in the real
diffusers file layout, float16 safetensors, as the published checkpoint's fp16 files) against
reading the same bytes (`cat > /dev/null`, and into a fresh process's memory), side by side: they
alternate, each load in a fresh process (it builds the networks and puts every parameter on the
device, bfloat16), with no compilation cache (a first start) and with JAX's persistent cache
holding the programs that lay the tensors out (a restart, or a replica given the cache's volume).
A load must put the bytes somewhere new: the read into memory is its floor, cat (which reuses one
buffer) a bound below that.

    python benchmarks/weights_load.py --dir /tmp/sdxl-fp16 --runs 3 --json

The checkpoint (about 7 GB) is written once to --dir and kept. Both sides read through the page
cache as it stands (the first read after writing is warm); the figure to compare is the ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

READ = "import sys; kept = [open(f, 'rb').read() for f in sys.argv[1:]]"
LOAD = """
import sys, time
began = time.perf_counter()
import jax
from sdxl_tpu import load_models
from sdxl_tpu.generate.compiling.compilation import enable_compile_cache
enable_compile_cache(sys.argv[2] if len(sys.argv) > 2 else None)
models = load_models(sys.argv[1], dtype="bfloat16")
jax.block_until_ready(jax.tree.leaves([models.text_encoder, models.text_encoder_2, models.unet, models.vae]))
print(time.perf_counter() - began)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/sdxl-fp16"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not (args.dir / "model_index.json").exists():
        began = time.perf_counter()
        import numpy as np

        from sdxl_tpu.weights.tiny import write_checkpoint

        write_checkpoint(args.dir, "sdxl", dtype=np.float16)
        print(f"wrote {args.dir} in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    files = sorted(str(p) for p in args.dir.rglob("*.safetensors"))
    size = sum(Path(f).stat().st_size for f in files)
    cache = tempfile.mkdtemp(prefix="weights-load-cache-")
    subprocess.run([sys.executable, "-c", LOAD, str(args.dir), cache], capture_output=True, check=True, cwd=ROOT)
    cat, read, load, cached = [], [], [], []
    for _ in range(args.runs):
        began = time.perf_counter()
        subprocess.run(f"cat {' '.join(files)} > /dev/null", shell=True, check=True)
        cat.append(time.perf_counter() - began)
        began = time.perf_counter()  # (the same bytes into memory the process has not touched before)
        subprocess.run([sys.executable, "-c", READ, *files], check=True)
        read.append(time.perf_counter() - began)
        done = subprocess.run([sys.executable, "-c", LOAD, str(args.dir)], capture_output=True, text=True, check=True,
                              cwd=ROOT)
        load.append(float(done.stdout.strip().splitlines()[-1]))
        done = subprocess.run([sys.executable, "-c", LOAD, str(args.dir), cache], capture_output=True, text=True,
                              check=True, cwd=ROOT)
        cached.append(float(done.stdout.strip().splitlines()[-1]))
    shutil.rmtree(cache)
    report = {"bytes": size, "cat_s": [round(t, 2) for t in cat], "read_s": [round(t, 2) for t in read],
              "load_s": [round(t, 2) for t in load], "load_cached_s": [round(t, 2) for t in cached],
              "cached_over_read": round(statistics.median(cached) / statistics.median(read), 2),
              "read_gb_s": round(size / statistics.median(read) / 1e9, 2),
              "load_over_read": round(statistics.median(load) / statistics.median(read), 2),
              "cat_gb_s": round(size / statistics.median(cat) / 1e9, 2),
              "load_gb_s": round(size / statistics.median(load) / 1e9, 2),
              "load_over_cat": round(statistics.median(load) / statistics.median(cat), 1)}
    print(json.dumps(report) if args.json else "\n".join(f"{k}: {v}" for k, v in report.items()))


if __name__ == "__main__":
    main()
