#!/usr/bin/env bash
# The prepared run for one TPU v5e chip with JAX preinstalled and no network: installs what the
# project needs from the machine's own package index, prints the environment, then runs one mode.
# Nothing is downloaded: SDXL base 1.0's architecture runs with random weights (timing does not
# depend on the weights). Each mode fits one 10-minute call on a machine that starts cold.
#
#   bash benchmarks/tpu.sh quick    # one UNet evaluation profiled by op kind, attention variants, one block
#                                   # of each level (SPLASH_BLOCKS=q,kv: the transformers again with those) (~6 min)
#   bash benchmarks/tpu.sh flags    # the UNet evaluation with Google's v5e SDXL libtpu flags (FLAGS=...) (~2 min)
#   bash benchmarks/tpu.sh xla      # the UNet evaluation with XLA's attention everywhere (~2 min)
#   bash benchmarks/tpu.sh kernels  # the attention kernels under trial (attention_kernels.py: one pass, pallas
#                                   # flash) beside splash at each self-attention shape (KERNELS=variant names) (~5 min)
#   bash benchmarks/tpu.sh ab       # one UNet evaluation before and after a change, one call (BEFORE=, AFTER=:
#                                   # tpu_quick.py unet options), the after profiled, its output in dB against before (~6 min)
#   bash benchmarks/tpu.sh launch   # what a program's start costs the chip: 10 UNet evaluations chained one program
#                                   # each, against one program, and with the weights packed in one buffer (~7 min)
#   bash benchmarks/tpu.sh bench    # the pipeline: 1 image and 4 images a call, 1024x1024, 20 steps (~9 min;
#                                   # CONTROLNETS=1: each call with that many random ControlNets; FEATURES=
#                                   # controlnet,ip-adapter,refiner: each timed beside plain calls, all loaded; BENCH_ARGS=
#                                   # "--compare-progress --compare-previews": the stepwise loop's costs too)
#   bash benchmarks/tpu.sh first-image  # a new server's time to its first image, cold and restarted from the
#                                   # programs it stored (SIZES=1024x1024; in-process: no TCP sockets) (~7 min)
#   bash benchmarks/tpu.sh compile  # one program's cold compile per attention setting (PROGRAMS=decode
#                                   # ATTENTION=xla,auto IMAGES=1; program_compile.py) (~2-4 min)
#   bash benchmarks/tpu.sh sizes    # every SDXL size's programs (PROGRAMS=denoise), WORKERS=3 at once, cold, stored,
#                                   # then read back by a new process (LOAD_ONLY=1: only that, after a sizes run) (~8 min)
#   bash benchmarks/tpu.sh start    # a new process's start under three host buffer sizes: the runtime, 5 GB of
#                                   # weights' transfer, the first stored UNet program's read (runtime_start.py) (~5 min)
#   bash benchmarks/tpu.sh reference  # side by side with diffusers' Flax SDXL pipeline: SIDE=ours, then
#                                   # SIDE=reference in a second call (IMAGES="1 4"; ~5 and ~8 min an image count)
#   bash benchmarks/tpu.sh upscale  # the upscaler models (R-ESRGAN 4x+, General 4xV3), 1024x1024 -> 4096x4096 in tiles,
#                                   # BATCHES="4,8" tiles a batch (benchmarks/upscaler.py) (~4 min)
#   bash benchmarks/tpu.sh xyz      # an X/Y/Z plot of 16 cells through `generate`: its 4 calls' seconds (~7 min)
#   bash benchmarks/tpu.sh test     # the tests marked tpu (pytest -m tpu), on the chip
#
# Results: JSON files, log.txt (environment and logs) and summary.txt under $OUT (default benchmarks/out);
# quick mode writes 8 files, the most a device call brings back.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
MODE="${1:-quick}"
export PYTHONUNBUFFERED=1

# The machine's index holds flax, transformers, safetensors and pillow; a --target folder at the end
# of PYTHONPATH keeps the machine's own JAX first.
SITE="${SITE:-/tmp/sdxl-tpu-site}"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SITE"
if ! "$PY" -c "import flax, transformers, safetensors, PIL" 2>/dev/null; then
  if [ -d /opt/pypi/simple ]; then
    PIP_CONFIG_FILE=/dev/null "$PY" -m pip install --isolated -q --only-binary=:all: \
        --index-url file:///opt/pypi/simple --target "$SITE" flax transformers safetensors pillow \
        2>&1 | grep -v "^WARNING" || true
  fi
fi

"$PY" - <<'PY' | tee -a "$OUT/log.txt"
import importlib, os, jax
for name in ("jax", "jaxlib", "flax", "transformers", "safetensors", "PIL", "numpy"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '?')}")
    except ImportError as e:
        print(f"{name} missing: {e}")
print("devices:", jax.devices())
print("LIBTPU_INIT_ARGS:", os.environ.get("LIBTPU_INIT_ARGS", ""))
PY

quick() {  # $1: name, rest: the command; its JSON (last line) to $OUT/$1.json, its log to $OUT/log.txt
  local name=$1; shift
  echo "== $name: $*" >> "$OUT/log.txt"
  "$@" 2>> "$OUT/log.txt" | tail -n 1 > "$OUT/$name.json" || echo "$name failed (see log.txt)"
}

case "$MODE" in
  quick)
    quick unet "$PY" benchmarks/tpu_quick.py unet --profile /tmp/sdxl-tpu-trace --save "$OUT/unet-before.npy" \
        --hlo "$OUT/unet-hlo.txt.gz" --json
    quick attention timeout "${ATTENTION_TIMEOUT:-240}" "$PY" benchmarks/tpu_quick.py attention --json
    quick block "$PY" benchmarks/tpu_quick.py block --json
    [ -z "${SPLASH_BLOCKS:-}" ] || quick block-tuned "$PY" benchmarks/tpu_quick.py block --only transformer \
        --splash-blocks "$SPLASH_BLOCKS" --json
    ;;
  ab)  # e.g. BEFORE="--splash-min-length 1024": each program compiles anew (~2 min), so this is two
    quick unet-before "$PY" benchmarks/tpu_quick.py unet ${BEFORE:-} --save "$OUT/unet-before.npy" --json
    quick unet-after "$PY" benchmarks/tpu_quick.py unet ${AFTER:-} --against "$OUT/unet-before.npy" \
        --profile /tmp/sdxl-tpu-trace --json
    [ -z "${ATTENTION_ONLY:-}" ] || quick attention timeout "${ATTENTION_TIMEOUT:-240}" "$PY" benchmarks/tpu_quick.py \
        attention --only "$ATTENTION_ONLY" --variants "${ATTENTION_VARIANTS:-auto,einsum,splash}" --json
    ;;
  launch)  # why one program a step (the server's loop) costs 5 % more than the fused loop on the chip
    quick launch timeout "${LAUNCH_TIMEOUT:-540}" "$PY" benchmarks/tpu_quick.py unet --runs 3 --launch "${CALLS:-10}" \
        --launch-parts "${PARTS:-chained,looped,packed,callback}" --json
    ;;
  kernels)  # the attention kernels under trial (attention_kernels.py) beside splash, the UNet's self-attention shapes
    quick kernels timeout "${KERNELS_TIMEOUT:-540}" "$PY" benchmarks/tpu_quick.py attention --only self \
        --variants "${KERNELS:-auto,splash q1024 kv2048,one pass,pallas flash}" --json
    ;;
  xla)  # the same UNet evaluation with XLA's attention everywhere (after quick: against its output)
    quick unet-xla "$PY" benchmarks/tpu_quick.py unet --attention xla --against "$OUT/unet-before.npy" --json
    ;;
  flags)  # after quick (same machine), its evaluation is the "before"
    [ -f "$OUT/unet-before.npy" ] || quick unet "$PY" benchmarks/tpu_quick.py unet --save "$OUT/unet-before.npy" --json
    LIBTPU_INIT_ARGS="${FLAGS:---xla_tpu_rwb_fusion=false --xla_tpu_dot_dot_fusion_duplicated=true --xla_tpu_scoped_vmem_limit_kib=65536}" \
      quick unet-flags "$PY" benchmarks/tpu_quick.py unet --against "$OUT/unet-before.npy" --json
    ;;
  bench)
    # ARCH=tiny SIZE=64x64 runs the same in a minute on a CPU, to check it before spending device time.
    common=(--architecture "${ARCH:-sdxl}" --random-weights --size "${SIZE:-1024x1024}" --steps 20 --no-warm-compile
            --controlnets "${CONTROLNETS:-0}" ${FEATURES:+--features "$FEATURES"} ${BENCH_ARGS:-} --json)
    # IMAGES="1": one of the two; IMAGES="8 16" RUNS=1: how many a call the chip holds (issue 50's item 5).
    # The host's peak memory (compiles side by side) goes to log.txt.
    for n in ${IMAGES:-1 4}; do
      quick "bench-$n" "$PY" benchmarks/peak_memory.py "$PY" -m sdxl_tpu bench "${common[@]}" --images "$n" --runs "${RUNS:-3}"
    done
    ;;
  first-image)
    # (ARCH=tiny SIZES=64x64 on a CPU first.) The app's engine with random weights: ready, first image,
    # everything, each program's compile; then a new process from the stored programs.
    quick first-image "$PY" benchmarks/peak_memory.py "$PY" benchmarks/first_image.py --architecture "${ARCH:-sdxl}" \
        --sizes "${SIZES:-1024x1024}" --restart --json
    ;;
  compile)
    quick compile "$PY" benchmarks/program_compile.py --architecture "${ARCH:-sdxl}" --size "${SIZE:-1024x1024}" \
        --images "${IMAGES:-1}" --programs "${PROGRAMS:-decode}" --attention "${ATTENTION:-xla,auto}" --json
    ;;
  sizes)
    store=/tmp/sdxl-tpu-sizes
    each=(benchmarks/program_compile.py --architecture "${ARCH:-sdxl}" --sizes "${SIZES:-sdxl}"
          --programs "${PROGRAMS:-denoise}" --workers "${WORKERS:-3}" --json)
    if [ -z "${LOAD_ONLY:-}" ]; then
      rm -rf "$store"
      quick sizes-compile "$PY" benchmarks/peak_memory.py "$PY" "${each[@]}" --store "$store"
    fi
    quick sizes-load "$PY" "${each[@]}" --load "$store"
    ;;
  start)  # each setting in a new process (the runtime starts once a process); one program stored first
    store=/tmp/sdxl-tpu-start
    program="$store/denoise-${SIZE:-1024x1024}-auto.pickle"
    [ -f "$program" ] || quick start-store "$PY" benchmarks/program_compile.py --architecture "${ARCH:-sdxl}" \
        --sizes "${SIZE:-1024x1024}" --programs denoise --store "$store" --json
    for bytes in ${BUFFERS:-4294967296 1073741824 268435456}; do
      TPU_PREMAPPED_BUFFER_SIZE=$bytes quick "start-$bytes" "$PY" benchmarks/runtime_start.py --transfer \
          --program "$program" --json
    done
    ;;
  reference)
    # Issue 50's side by side: this project, then diffusers 0.39's Flax SDXL pipeline, on one random fp16
    # checkpoint (written once to $work), IMAGES="1 4" a call. One side a call (SIDE=ours, then
    # SIDE=reference on the same warm machine: the two pass 10 minutes together); the reference's run
    # completes the report from the ours-N.json kept in $work. The reference's diffusers, transformers
    # 4.57, huggingface_hub 0.x and tokenizers travel as wheels in .whl-tpu (docs/benchmark.md); torch,
    # which only reads the checkpoint for it, comes from the machine's own wheels.
    work=/tmp/sdxl-tpu-compare
    side="${SIDE:-ours}"
    args=(--architecture "${ARCH:-sdxl}" --devices 0 --steps 20 --runs 3 --work "$work" --checkpoint-dtype float16
          --only "$side" --json)
    if [ "$side" = reference ]; then
      ref_site=/tmp/sdxl-tpu-reference torch_site=/tmp/sdxl-tpu-torch
      [ -d "$ref_site" ] || PIP_CONFIG_FILE=/dev/null "$PY" -m pip install --isolated -q --no-index --no-deps \
          --no-compile --no-cache-dir --target "$ref_site" .whl-tpu/*.whl 2>&1 | grep -v "^WARNING"
      [ -d "$torch_site" ] || PIP_CONFIG_FILE=/dev/null "$PY" -m pip install --isolated -q --only-binary=:all: \
          --index-url file:///opt/pypi/simple --find-links /opt/wheels --target "$torch_site" torch \
          2>&1 | grep -v "^WARNING"
      args+=(--reference-python "$PY" --reference-path "$ref_site:$torch_site")
    fi
    for n in ${IMAGES:-1}; do
      other=()
      [ "$side" = reference ] && [ -f "$work/ours-$n.json" ] && other=(--other "$work/ours-$n.json")
      quick "$side-$n" "$PY" benchmarks/peak_memory.py "$PY" benchmarks/compare_reference.py "${args[@]}" \
          --images "$n" "${other[@]}"
      [ "$side" = ours ] && cp "$OUT/ours-$n.json" "$work/"
      grep -v "are deprecated" "$work/$side.log" 2>/dev/null | tail -n 5 >> "$OUT/log.txt"
    done
    ;;
  upscale)
    quick upscale "$PY" benchmarks/upscaler.py --size "${SIZE:-1024}" --batches "${BATCHES:-4,8}" --json
    ;;
  xyz)
    # Issue 54: an X/Y/Z plot through `generate` (4 seeds x 4 CFG scales at 4 images a call: 4 calls), on a random
    # checkpoint of ARCH written first (make-tiny; sdxl's is 14 GB); each call's seconds, its PNGs' writing included.
    model=/tmp/sdxl-tpu-xyz-model
    [ -d "$model" ] || "$PY" -m sdxl_tpu make-tiny "$model" --architecture "${ARCH:-sdxl}" >> "$OUT/log.txt" 2>&1
    "$PY" -m sdxl_tpu generate "a photo of a cat" --model "$model" --size "${SIZE:-1024x1024}" --steps "${STEPS:-20}" \
        --x-type Seed --x-values 1-4 --y-type "CFG Scale" --y-values 3-6 --out /tmp/sdxl-tpu-xyz 2>> "$OUT/log.txt" \
        | grep "^call" | tee "$OUT/xyz-calls.log"
    ;;
  test)
    # One process (one program holds the chip at a time), no xdist; torch and diffusers are not there.
    JAX_PLATFORMS=tpu,cpu "$PY" -m pytest -m tpu -o addopts="" -p no:cacheprovider -q -rA -s tests/generate/test_tpu.py \
        2>&1 | tee "$OUT/tests.log"
    ;;
  *)
    echo "unknown mode $MODE: quick, launch, ab, flags, xla, bench, first-image, compile, sizes, start, reference," \
         "upscale, xyz or test"
    exit 2 ;;
esac

"$PY" benchmarks/tpu_summary.py "$OUT" | tee "$OUT/summary.txt"
