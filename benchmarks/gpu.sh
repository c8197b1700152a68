#!/usr/bin/env bash
# One prepared benchmark run for an NVIDIA GPU machine with JAX (CUDA), flax, transformers,
# safetensors and pillow preinstalled and no network. Nothing is downloaded: SDXL base 1.0's
# architecture runs with random weights (timing does not depend on the weights).
#
#   bash benchmarks/gpu.sh            # results under $OUT (default benchmarks/out)
#
# Optional: the reference side by side, if wheels for diffusers==0.39.0 and transformers==4.57.6
# (and their pure-Python dependencies) were carried to benchmarks/wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
# `python3`: machines with an image of their own may have no plain `python`.
PY="${PYTHON:-python3}"

"$PY" - <<'PY' | tee "$OUT/environment.txt"
import importlib, jax
for name in ("jax", "flax", "transformers", "safetensors", "PIL", "numpy"):
    module = importlib.import_module(name)
    print(f"{name} {getattr(module, '__version__', '?')}")
print("devices:", jax.devices())
PY

# 0. Which attention kernel the compiler picked, and whether it merged the q/k/v projections (seconds).
"$PY" benchmarks/kernels_check.py | tee "$OUT/kernels.json" || echo "kernels check failed (see above)"

# PRESET=tiny SIZE=64x64 runs the same script in a minute on a CPU, to check it before spending device time.
common=(--architecture "${PRESET:-sdxl}" --random-weights --size "${SIZE:-1024x1024}" --steps 20 --json)
# Each run compiles cold in a fresh cache, so all three must fit one 10-minute call: on one H200
# (2026-12-04), with five timed calls and 45 s of drawing random weights in each process, the
# first two took 9 minutes and the third ran past the call's end.
# 1. The reference workload: 4 images, 20 steps, 1024x1024, with what per-step progress and live
#    previews cost; its second process measures the start from stored programs.
"$PY" -m sdxl_tpu bench "${common[@]}" --images 4 --runs 3 --compare-progress --compare-previews > "$OUT/sdxl-4.json" \
    || echo "4-image run failed (see above)"
# 2. The same workload with XLA's attention instead of cuDNN's flash attention: what the kernel buys.
SDXL_TPU_ATTENTION=xla "$PY" -m sdxl_tpu bench "${common[@]}" --images 4 --runs 3 --no-warm-compile \
    > "$OUT/sdxl-4-xla-attention.json" || echo "XLA-attention run failed (see above)"
# 3. Memory for one image with classifier-free guidance (target: <= 14 GiB, one v5e chip).
"$PY" -m sdxl_tpu bench "${common[@]}" --images 1 --runs 3 --no-warm-compile > "$OUT/sdxl-1.json" \
    || echo "1-image run failed (see above)"

if [ -d benchmarks/wheels ]; then
  "$PY" -m venv --system-site-packages benchmarks/.venv-reference
  benchmarks/.venv-reference/bin/pip install -q --no-index --find-links benchmarks/wheels \
      -r benchmarks/requirements-reference.txt
  cp benchmarks/requirements-reference.txt benchmarks/.venv-reference/installed.txt
  "$PY" benchmarks/compare_reference.py --architecture sdxl --steps 20 --runs 3 --devices 0 --json \
      > "$OUT/compare-sdxl.json" || echo "reference comparison failed (see above)"
fi

"$PY" - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("sdxl-4.json", "sdxl-1.json", "sdxl-4-xla-attention.json"):
    if not (out / name).exists() or not (out / name).read_text().strip():
        continue
    r = json.loads((out / name).read_text().strip().splitlines()[-1])
    lat, f = r["latency_s"], r["flops"]
    mem = r["memory_bytes"]
    peak = mem.get("device_peak_bytes_in_use") or max(m["peak_estimate"] for m in mem["compiled"].values())
    print(f"{r['images']} x {r['size']}, {r['steps']} steps, {r['devices']} x {r['device_kind']}, "
          f"{r.get('attention', 'auto')} attention: "
          f"latency {lat['median']:.3f} s (min {lat['min']:.3f}), {r['s_per_step'] * 1000:.1f} ms/step, "
          f"{r['images_per_s']:.2f} img/s, {f['achieved_tflops']:.0f} TFLOP/s"
          + (f" ({100 * f['utilisation']:.0f} %)" if f["utilisation"] else "")
          + f", peak memory {peak / 2**30:.1f} GiB, compile cold {r['cold_compile_s']:.0f} s"
          + (f" warm {r['warm_compile_s']:.0f} s" if "warm_compile_s" in r else "")
          + (f", per-step progress {100 * r['progress_overhead']:+.1f} %" if "progress_overhead" in r else "")
          + (f", live previews ({r['previews']['decoder']}, {r['previews']['per_call']} a call) "
             f"{100 * r['previews']['overhead']:+.1f} %" if "previews" in r else ""))
runs = {}
for name in ("sdxl-4.json", "sdxl-4-xla-attention.json"):
    text = (out / name).read_text().strip() if (out / name).exists() else ""
    if text:
        runs[name] = json.loads(text.splitlines()[-1])["latency_s"]["median"]
if len(runs) == 2:
    print(f"per-platform attention vs XLA attention: {runs['sdxl-4-xla-attention.json'] / runs['sdxl-4.json']:.2f}x "
          "the throughput (4 images)")
compare = out / "compare-sdxl.json"
if compare.exists() and compare.read_text().strip():
    c = json.loads(compare.read_text().strip().splitlines()[-1])
    m = c["median_latency_s"]
    print(f"reference side by side: ours {m['ours']:.3f} s, reference {m['reference']:.3f} s, "
          f"ratio {c['throughput_ratio']:.2f}x; compile ours {c['compile_s']['ours']:.0f} s, "
          f"reference {c['compile_s']['reference']:.0f} s")
PY
