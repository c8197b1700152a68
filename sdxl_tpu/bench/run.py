"""`python -m sdxl_tpu bench`: compile times, latency, throughput, memory and FLOP utilisation.

A checkpoint (`--model`, a preset's, the tiny architecture's, or without `--random-weights` SDXL
base 1.0) is loaded exactly as the app loads it; `--random-weights` builds the architecture
(weights/architectures.py) with random weights on the device and SDXL base 1.0's scheduler.
FLOPs are counted from the traced UNet and VAE (see flops.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from ..generate.compiling.compilation import enable_compile_cache
from ..generate.loading import compute_dtype_for, load
from ..generate.pipeline import Pipeline
from ..generate.compiling.stored_programs import ProgramStore
from ..models.layers import Precision
from ..models.taesd import AutoencoderTiny, TAESDConfig
from ..request.control import MAX_UNITS
from ..request.load import LoadOptions
from ..request.names import SDXL_BASE
from ..cli.options import load_values, options_for
from ..cli.parsing import older_architecture
from ..request.recipes import RECIPES, settle
from ..request.request import preview_cadence
from ..request.values import format_size, parse_size
from ..weights.architectures import architecture_configs
from ..weights.checkpoint import config_root
from ..weights.taesd import load_taesd
from ..weights.tensors import read_json
from .flops import controlnet_flops, model_flops, peak_tflops
from .report import format_report
from .random_weights import random_controlnets, random_fill, random_image_prompt, random_pipeline, random_refiner

PROMPT, NEGATIVE = "a photo of an astronaut riding a horse on the moon", "blurry"
# --features: what each adds to a call, timed beside plain text to image (all loaded at once).
FEATURES = ("controlnet", "ip-adapter", "ip-adapter-plus", "refiner")
REFINER_SWITCH_AT = 0.8  # (A1111's default: the last fifth of the steps on the refiner)


# --- what is measured -------------------------------------------------------------------------

def settled(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with what they stand for spelled out: `architecture`, `recipe` (the preset, or None),
    `load` (what to load, LoadOptions; None: random weights of the architecture), `size`, and the
    preset's sampler, steps and guidance where none is given (explicit options win)."""
    architecture = older_architecture(args) or args.architecture
    recipe = RECIPES.get(args.preset)
    if recipe is not None and recipe.brings_weights and args.random_weights:
        raise ValueError(f"--preset {recipe.name!r} brings its weights; --random-weights takes an architecture")
    s = settle(recipe, sampler=args.sampler, steps=args.steps, guidance=args.guidance, size=args.size)
    if recipe is not None:
        architecture = "sdxl"  # (every preset runs SDXL's)
    size = parse_size(s["size"] if recipe is not None or args.size else architecture_configs(architecture)["size"])
    load = None
    if not args.random_weights or args.model:
        model = args.model or (recipe.model if recipe else None) or ("tiny" if architecture == "tiny" else SDXL_BASE)
        load = LoadOptions.of({**load_values(args, "bench"), "model": model}, recipe).replace(
            sizes=[size], step_progress=False)
    elif args.unet or args.spacing or args.lora:
        raise ValueError("--unet, --lora and --spacing apply to a checkpoint (--model, or no --random-weights)")
    if load is not None and args.controlnets:
        raise ValueError("--controlnets adds random ControlNets to random weights: give --random-weights")
    if not 0 <= args.controlnets <= MAX_UNITS:
        raise ValueError(f"--controlnets {args.controlnets}: from 0 to {MAX_UNITS}, as a call takes")
    features = tuple(dict.fromkeys(f.strip() for f in (args.features or "").split(",") if f.strip()))
    if unknown := [f for f in features if f not in FEATURES]:
        raise ValueError(f"--features {', '.join(unknown)}: not one of {', '.join(FEATURES)}")
    if features and (load is not None or args.controlnets):
        raise ValueError("--features adds random networks to random weights (--random-weights), in calls of their "
                         "own: not with a checkpoint or --controlnets")
    if {"ip-adapter", "ip-adapter-plus"} <= set(features):
        raise ValueError("--features: one IP-Adapter at a time (ip-adapter or ip-adapter-plus)")
    return argparse.Namespace(**{**vars(args), "architecture": architecture, "recipe": recipe and recipe.name,
                                 "load": load, "size": size, "sampler": s["sampler"], "steps": s["steps"],
                                 "guidance": s["guidance"], "features": features})


def measured_configs(args: argparse.Namespace) -> dict[str, Any]:
    """The UNet and VAE configs (config.json contents) of what is measured: the checkpoint's or the architecture's."""
    if args.load is None:
        return architecture_configs(args.architecture)
    root = config_root(args.load.model, args.load.config)
    return {name: dict(read_json(root / name / "config.json")) for name in ("unet", "vae")}


def build_pipeline(args: argparse.Namespace, *, step_progress: bool = False, compile_cache: str | None = None
                   ) -> Pipeline:
    """The pipeline measured (stepwise with previews when `step_progress`), compiled on first use,
    its programs kept in `compile_cache` when given (as a server keeps them)."""
    if args.load is not None:  # the app's own loader: the checkpoint's scheduler, tokenizers and settings
        return load(args.load.replace(step_progress=step_progress,
                                      preview=args.load.preview if step_progress else "approx"), warmup=False,
                    compile_cache=compile_cache)
    precision = Precision.of(compute_dtype_for(args.dtype, args.compute_dtype), args.dtype, attention=args.attention)
    taesd = None
    if step_progress and args.preview != "approx":  # taesdxl's architecture, random weights
        taesd = load_taesd(args.preview, precision) if os.path.isdir(args.preview) else random_fill(
            nnx.eval_shape(lambda: AutoencoderTiny(TAESDConfig(), precision)), seed=4)
    adapter = next((f for f in args.features if f.startswith("ip-adapter")), None)
    controlnets = args.controlnets + ("controlnet" in args.features)
    return random_pipeline(
        args.architecture, precision, sizes=[args.size], images_per_call=args.images, step_progress=step_progress,
        preview_decoder=taesd, program_store=ProgramStore.beside(compile_cache),
        controlnets=random_controlnets(args.architecture, precision, controlnets),
        image_prompt=adapter and random_image_prompt(args.architecture, precision, plus=adapter.endswith("plus")),
        refiner=random_refiner(args.architecture, precision) if "refiner" in args.features else None)


def _memory(programs: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, compiled in programs.items():
        try:
            m = compiled.memory_analysis()
        except Exception:  # some backends do not report it
            m = None
        if m is None:
            continue
        out[name] = {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
                     "temporaries": m.temp_size_in_bytes,
                     "peak_estimate": m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                     - getattr(m, "alias_size_in_bytes", 0)}
    return out


def call_options(pipe: Pipeline, args: argparse.Namespace, feature: str | None = None) -> dict[str, Any]:
    """What a timed call asks for besides the prompt: every ControlNet of --controlnets, or `feature`'s."""
    w, h = args.size
    image = np.zeros((h, w, 3), np.uint8)
    image[h // 4:3 * h // 4:8, :] = 255  # (a control image or image prompt: its content does not change the time)
    if feature == "refiner":
        return {"refiner_switch_at": REFINER_SWITCH_AT}
    if feature and feature.startswith("ip-adapter"):
        return {"controlnet": [{"model": pipe.ip_adapter, "image": image}]}
    named = list(pipe.controlnets) if feature == "controlnet" or args.controlnets else []
    return {"controlnet": [{"model": name, "image": image} for name in named] or None}


def _time_calls(pipe: Pipeline, args: argparse.Namespace, runs: int, *, feature: str | None = None,
                **previews) -> list[tuple[float, dict[str, float]]]:
    """(latency, the pipeline's own stage timings) of `runs` calls, with `feature` (see call_options)
    (`previews`: run_images' preview and preview_every)."""
    calls = []
    more = call_options(pipe, args, feature)
    for i in range(runs):
        request = pipe.request(PROMPT, NEGATIVE, seed=i, steps=args.steps, size=args.size, sampler=args.sampler,
                               guidance_scale=args.guidance, **more)
        start = time.perf_counter()
        result = pipe.run(request, **previews)
        calls.append((time.perf_counter() - start, result.timings))
    return calls


def timed_programs(pipe: Pipeline, args: argparse.Namespace) -> list[str]:
    """The programs of the calls --features times (not every program the networks loaded could run)."""
    runs = {None: {}, "controlnet": {"controlnets": list(pipe.controlnets)}, "ip-adapter": {"image_prompt": True},
            "ip-adapter-plus": {"image_prompt": True}, "refiner": {"refiner": True}}  # (call_programs' words)
    return list(dict.fromkeys(name for feature in (None, *args.features)
                              for name in pipe.call_programs(guided=args.guidance > 1, **runs[feature])))


def time_features(pipe: Pipeline, args: argparse.Namespace) -> dict[str, Any]:
    """Each of --features' calls against plain text to image, alternated call by call (drift on a noisy
    machine hits each alike): medians, ms a step, and what the feature adds."""
    variants = (None, *args.features)
    for feature in variants:
        _time_calls(pipe, args, 1, feature=feature)  # (its first call: allocations, caches)
    calls: dict[str | None, list[tuple[float, dict[str, float]]]] = {f: [] for f in variants}
    for _ in range(args.runs):
        for feature in variants:
            calls[feature] += _time_calls(pipe, args, 1, feature=feature)
    out = {}
    for feature, timed in calls.items():
        latency = statistics.median(c[0] for c in timed)
        denoising = statistics.median(c[1]["denoising"] for c in timed)
        out[feature or "plain"] = {"latency_s": latency, "denoising_s": denoising,
                                   "ms_per_step": 1000 * denoising / args.steps,
                                   "stage_s": sorted(timed, key=lambda c: c[0])[len(timed) // 2][1]}
    plain = out["plain"]
    for figures in out.values():
        figures["latency_over_plain"] = figures["latency_s"] / plain["latency_s"] - 1
        figures["step_over_plain"] = figures["denoising_s"] / plain["denoising_s"] - 1
    if "refiner" in out:  # (its steps past the switch run the refiner's UNet: their own ms a step)
        refined = args.steps - round(REFINER_SWITCH_AT * args.steps)
        out["refiner"]["refiner_ms_per_step"] = 1000 * (
            out["refiner"]["denoising_s"] - plain["denoising_s"] * (1 - refined / args.steps)) / max(refined, 1)
    return out


def warm_compile_argv(args: argparse.Namespace, cache: str) -> list[str]:
    """The command line of a second process that compiles the same programs from `cache`: the
    settled workload (see `settled`) as options, each option that loads something from `args.load`."""
    argv = [sys.executable, "-m", "sdxl_tpu", "bench", "--architecture", args.architecture,
            "--size", format_size(args.size), "--images", str(args.images), "--dtype", args.dtype,
            "--attention", args.attention]
    if args.random_weights:
        argv.append("--random-weights")
    if args.features:
        argv += ["--features", ",".join(args.features)]
    if args.compute_dtype:
        argv += ["--compute-dtype", args.compute_dtype]
    for o in options_for("bench"):
        if args.load is None or not o.loads or o.flag in argv:
            continue
        value = getattr(args.load, o.loads)
        values = value if o.action == "append" else [] if value is None else [value]
        for v in values:
            argv += [o.flag, str(v)]
    return argv + ["--compile-only", "--compile-cache", cache, "--json"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    cache = args.compile_cache or tempfile.mkdtemp(prefix="sdxl-bench-jax-cache-")
    enable_compile_cache(cache)
    pipe = build_pipeline(args, compile_cache=cache)
    start = time.perf_counter()
    timed = timed_programs(pipe, args) if args.features else None  # (else every program: a server's warm-up)
    pipe.warmup(names=timed)
    compile_s = time.perf_counter() - start
    if args.compile_only:
        return {"compile_s": compile_s, "memory_bytes": {"compiled": _memory(pipe.compiled(args.size, timed))}}

    report: dict[str, Any] = {
        "architecture": args.architecture, "preset": args.recipe, "model": args.load and args.load.model,
        "random_weights": args.random_weights, "dtype": args.dtype,
        "compute_dtype": compute_dtype_for(args.dtype, args.compute_dtype),
        "size": format_size(args.size), "steps": args.steps, "sampler": args.sampler or pipe.default_sampler,
        "guidance": args.guidance,
        "images": pipe.images_per_call,
        "devices": jax.device_count(), "device_kind": jax.devices()[0].device_kind, "platform": jax.default_backend(),
        "cold_compile_s": compile_s, "compile_cache": cache, "attention": args.attention,
    }
    if args.warm_compile:
        result = subprocess.run(warm_compile_argv(args, cache), capture_output=True, text=True)
        if result.returncode == 0:
            report["warm_compile_s"] = json.loads(result.stdout.strip().splitlines()[-1])["compile_s"]
        else:
            report["warm_compile_error"] = result.stderr.strip().splitlines()[-1:]

    _time_calls(pipe, args, 1)  # first call: allocations, caches
    calls = _time_calls(pipe, args, args.runs)
    latencies = [latency for latency, _ in calls]
    median = statistics.median(latencies)
    _, timings = sorted(calls, key=lambda c: c[0])[len(calls) // 2]  # the stages of the (upper) median call
    report.update(latency_s={"median": median, "min": min(latencies), "max": max(latencies), "runs": len(latencies)},
                  stage_s=timings, s_per_step=timings["denoising"] / args.steps,
                  images_per_s=pipe.images_per_call / median)

    if args.compare_progress or args.compare_previews:
        stepwise = build_pipeline(args, step_progress=True)
        stepwise.warmup()
        _time_calls(stepwise, args, 1)
        every_steps = preview_cadence(args.preview_every, args.steps)
        shown = []
        previews: dict[str, Any] = dict(preview=lambda step, steps, images: shown.append(images.shape),
                                        preview_every=every_steps)
        _time_calls(stepwise, args, 1, **previews)
        # Alternate them so drift on a noisy machine hits each alike.
        latencies = {"stepwise": [], "fused": [], "previews": []}
        for _ in range(args.runs):
            latencies["stepwise"] += [latency for latency, _ in _time_calls(stepwise, args, 1)]
            if args.compare_progress:
                latencies["fused"] += [latency for latency, _ in _time_calls(pipe, args, 1)]
            if args.compare_previews:
                shown.clear()
                latencies["previews"] += [latency for latency, _ in _time_calls(stepwise, args, 1, **previews)]
        medians = {name: statistics.median(values) for name, values in latencies.items() if values}
        if args.compare_progress:
            report["progress_overhead"] = medians["stepwise"] / medians["fused"] - 1
        if args.compare_previews:
            report["previews"] = {"decoder": stepwise.preview_decoder, "every": every_steps, "per_call": len(shown),
                                  "size": list(shown[0][1:3]) if shown else None,
                                  "latency_on_s": medians["previews"], "latency_off_s": medians["stepwise"],
                                  "overhead": medians["previews"] / medians["stepwise"] - 1}

    if args.features:
        report["features"] = time_features(pipe, args)
    configs = measured_configs(args)
    flops = model_flops(configs["unet"], configs["vae"], args.size)
    passes = 2 if args.guidance > 1 else 1  # guidance <= 1: the conditional pass alone
    evaluation = flops["unet"] + sum(controlnet_flops(c, args.size, pipe.vae_factor)  # (--controlnets': every call's)
                                     for c in pipe.controlnets.values() if args.controlnets)
    once = flops["unet_cross_kv"]  # (of each evaluation: done once a call, not at every step)
    per_call = pipe.images_per_call * (passes * (args.steps * (evaluation - once) + once) + flops["vae_decode"])
    achieved = per_call / median / 1e12
    peak = args.peak_tflops or peak_tflops(jax.devices()[0])
    report["controlnets"] = args.controlnets
    report["flops"] = {"unet_per_image_eval_tflop": flops["unet"] / 1e12,
                       "unet_cross_kv_per_image_eval_tflop": once / 1e12,
                       "controlnets_per_image_eval_tflop": (evaluation - flops["unet"]) / 1e12,
                       "vae_decode_per_image_tflop":
                       flops["vae_decode"] / 1e12, "per_call_tflop": per_call / 1e12, "achieved_tflops": achieved,
                       "peak_tflops_per_device": peak,
                       "utilisation": achieved / (peak * jax.device_count()) if peak else None}
    report["memory_bytes"] = {"compiled": _memory(pipe.compiled(args.size, timed))}
    stats = jax.devices()[0].memory_stats() if hasattr(jax.devices()[0], "memory_stats") else None
    if stats:
        report["memory_bytes"]["device_peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
    return report


def main(args: argparse.Namespace) -> int:
    """Run the benchmark `args` (as bench's options parse them) describe and print its report."""
    report = run(settled(args))
    print(json.dumps(report) if args.json else format_report(report))
    return 0
