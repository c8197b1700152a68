"""`python -m sdxl_tpu bench` in its CI-sized form (the tiny preset).

The timings themselves depend on the machine; what is checked is how the reported figures
relate to each other, which holds on any machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from sdxl_tpu.bench.run import build_pipeline, format_report, settled, warm_compile_argv
from sdxl_tpu.sampler.from_config import SCHEDULER_CONFIG, sampler_named
from sdxl_tpu.cli.parsing import add_options, fill_defaults


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_options(parser, "bench")
    return fill_defaults(parser, parser.parse_args(argv), "bench")


def _flops_of_the_programs(checkpoint) -> dict[str, int]:
    """Matmul and convolution FLOPs of the programs a bench call runs, counted from their traces:
    the one-step denoising programs (guided, unguided) and the decode, four images of 64x64.
    Compiled with room for one prompt chunk: cross-attention runs over the chunks a prompt uses
    (a switch, whose costliest branch a trace counts) and the bench's prompts are one chunk."""
    from sdxl_tpu import load_pipeline
    from sdxl_tpu.bench.flops import jaxpr_flops
    from sdxl_tpu.generate import sampling

    pipe = load_pipeline(checkpoint, dtype="float32", sizes=[(64, 64)], max_prompt_chunks=1, warmup=False)
    assert pipe.images_per_call == 4 and pipe.stepwise
    counts = {}
    for name in ("denoise", "denoise_unguided", "decode"):
        counts[name] = jaxpr_flops(pipe.trace(name, (64, 64)).jaxpr)
    # The cross-attention's keys and values of the texts, which the text encoders' program projects
    # once a call for all its steps: four images' two texts.
    context = jax.ShapeDtypeStruct((4, 2, 77, pipe.layout.context_dim), jnp.float32)
    project = lambda p, c: sampling.cross_attention_kv(nnx.merge(pipe.graphs["unet"], p), c)
    counts["cross_kv"] = jaxpr_flops(jax.make_jaxpr(project)(pipe.params["unet"], context))
    return counts


def test_bench_tiny_reports_consistent_figures(tmp_path, tiny_checkpoint):
    env = dict(os.environ, JAX_PLATFORMS="cpu", SDXL_TPU_TINY_DIR=str(tmp_path / "tiny"))
    steps, runs = 3, 3
    began = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "sdxl_tpu", "bench", "--architecture", "tiny", "--steps", str(steps),
                             "--runs", str(runs), "--dtype", "float32", "--compare-progress", "--compare-previews",
                             "--json"],
                            capture_output=True, text=True, env=env, timeout=900)
    wall = time.perf_counter() - began
    assert result.returncode == 0, result.stderr[-3000:]
    r = json.loads(result.stdout.strip().splitlines()[-1])
    assert (r["images"], r["size"], r["steps"], r["dtype"], r["compute_dtype"]) == (4, "64x64", 3, "float32", "float32")
    assert r["attention"] == os.environ.get("SDXL_TPU_ATTENTION", "auto")

    # The second process compiles the same programs from the persistent cache the first one filled.
    assert "warm_compile_error" not in r
    assert 0 < r["warm_compile_s"] < r["cold_compile_s"]
    # Its text form (--compile-only without --json) names the compile time and each program's memory.
    text = format_report({"compile_s": r["warm_compile_s"], "memory_bytes": r["memory_bytes"]})
    assert text.splitlines()[0].startswith("compile ") and {"encode", "noise", "denoise", "decode"} <= {
        line.split()[1] for line in text.splitlines()[1:]}

    lat = r["latency_s"]
    assert lat["runs"] == runs and 0 < lat["min"] <= lat["median"] <= lat["max"]
    # Seconds of wall time: the timed calls (and the cold compile) fit in what this test measured
    # around the process; a timer read before the device finished would not be caught by this, but
    # the stages below would (they are timed inside one call, after each stage's result is ready).
    assert r["cold_compile_s"] + runs * lat["min"] < wall
    assert r["images"] * runs / r["images_per_s"] < wall
    # The stages are those of one of the timed calls, timed inside it.
    stages = r["stage_s"]
    parts = stages["text_encoding"] + stages["denoising"] + stages["decoding"]
    assert 0 < parts <= stages["total"] * (1 + 1e-9) and stages["total"] <= lat["max"]
    assert 0 < r["s_per_step"] * steps <= stages["total"]

    # FLOPs: what the programs that ran contain, counted from their traces (one UNet pass of four
    # images, guidance's two per step, the decode), against the bench's count from the models.
    f, programs = r["flops"], _flops_of_the_programs(tiny_checkpoint)
    once = f["unet_cross_kv_per_image_eval_tflop"] * 1e12  # (done once a call, for every step)
    assert once == pytest.approx(programs["cross_kv"] / 8, rel=1e-6)
    assert f["unet_per_image_eval_tflop"] * 1e12 - once == pytest.approx(programs["denoise_unguided"] / 4, rel=1e-6)
    assert f["vae_decode_per_image_tflop"] * 1e12 == pytest.approx(programs["decode"] / 4, rel=1e-6)
    assert f["per_call_tflop"] * 1e12 == pytest.approx(steps * programs["denoise"] + programs["decode"]
                                                       + programs["cross_kv"], rel=1e-6)
    assert 0 < f["achieved_tflops"] and f["peak_tflops_per_device"] is None and f["utilisation"] is None  # a CPU

    compiled = r["memory_bytes"]["compiled"]
    assert {"encode", "noise", "denoise", "decode"} <= set(compiled)
    for name, m in compiled.items():
        assert m["peak_estimate"] >= m["arguments"] > 0, (name, m)
    # The denoising program holds the UNet's float32 parameters as arguments.
    assert compiled["denoise"]["arguments"] > compiled["decode"]["arguments"]
    assert math.isfinite(r["progress_overhead"])
    # Live previews measured on the same stepwise loop: 3 steps, one every step, none after the last.
    p = r["previews"]
    assert (p["decoder"], p["every"], p["per_call"], p["size"]) == ("approx", 1, 2, [8, 8])
    assert p["latency_on_s"] > 0 and p["latency_off_s"] > 0 and math.isfinite(p["overhead"])


def test_bench_refuses_a_malformed_size_in_one_line():
    result = subprocess.run([sys.executable, "-m", "sdxl_tpu", "bench", "--architecture", "tiny", "--size", "64by64"],
                            capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "WIDTHxHEIGHT" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [
    ["--architecture", "tiny"],
    ["--architecture", "small", "--random-weights", "--images", "2", "--dtype", "float32", "--compute-dtype",
     "bfloat16", "--attention", "xla"],
    ["--architecture", "sdxl", "--model", "/some/checkpoint", "--size", "768x512", "--steps", "7", "--json"],
    ["--preset", "Lightning 1-step", "--lora", "a.safetensors", "--config", "cfg", "--size", "64x64"],
])
def test_warm_compile_child_compiles_the_same_workload(argv):
    args = settled(_parse(*argv))
    child_argv = warm_compile_argv(args, "/tmp/cache")
    assert child_argv[:4] == [sys.executable, "-m", "sdxl_tpu", "bench"]
    child = settled(_parse(*child_argv[4:]))
    for field in ("architecture", "load", "random_weights", "size", "images", "dtype", "compute_dtype", "attention"):
        assert getattr(child, field) == getattr(args, field), field
    assert child.compile_only and child.json and child.compile_cache == "/tmp/cache"


def test_bench_takes_the_apps_generation_presets_and_architectures(capsys):
    """--preset names one of the app's presets, spelled out as its options (what it loads, its
    sampler, steps, guidance and size); options given explicitly win. An architecture's name there
    (the older spelling) is read as --architecture, with a note."""
    args = settled(_parse("--preset", "Lightning 4-step", "--lora", "style.safetensors:0.5"))
    load = args.load
    assert (load.model, load.unet, load.timestep_spacing, args.sampler, args.steps, args.guidance, args.size) == (
        "stabilityai/stable-diffusion-xl-base-1.0", "ByteDance/SDXL-Lightning/sdxl_lightning_4step_unet.safetensors",
        "trailing", "Euler", 4, 0.0, (1024, 1024))
    assert load.loras == ("style.safetensors:0.5",) and args.architecture == "sdxl"
    args = settled(_parse("--preset", "Turbo", "--steps", "2", "--size", "256x256"))
    assert (args.load.model, args.sampler, args.steps, args.size) == ("stabilityai/sdxl-turbo", "Euler a", 2,
                                                                      (256, 256))
    args = settled(_parse("--architecture", "small", "--random-weights"))
    assert (args.architecture, args.steps, args.guidance, args.load, args.size) == ("small", 20, 5.0, None, (256, 256))
    assert settled(_parse("--architecture", "tiny")).load.model == "tiny"
    capsys.readouterr()
    older = settled(_parse("--preset", "small", "--random-weights"))
    assert (older.architecture, older.recipe, older.load) == ("small", None, None)
    assert "--preset small names an architecture; it is spelled --architecture small" in capsys.readouterr().err
    with pytest.raises(ValueError, match="brings its weights"):
        settled(_parse("--preset", "Turbo", "--random-weights"))
    with pytest.raises(ValueError, match="apply to a checkpoint"):
        settled(_parse("--architecture", "small", "--random-weights", "--spacing", "trailing"))


def test_attention_argument_defaults_to_the_environment(monkeypatch):
    monkeypatch.setenv("SDXL_TPU_ATTENTION", "xla")
    assert _parse().attention == "xla"
    assert _parse("--attention", "auto").attention == "auto"
    monkeypatch.delenv("SDXL_TPU_ATTENTION")
    assert _parse().attention == "auto"


def test_checkpoint_pipelines_use_the_checkpoints_scheduler(tiny_checkpoint, tmp_path):
    # The app's loader reads scheduler/scheduler_config.json: change it and the benchmark follows.
    checkpoint = shutil.copytree(tiny_checkpoint, tmp_path / "trailing")
    config_file = checkpoint / "scheduler" / "scheduler_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "timestep_spacing": "trailing", "steps_offset": 0}))
    pipe = build_pipeline(settled(_parse("--model", str(checkpoint), "--dtype", "float32", "--size", "64x64")))
    assert pipe.sampler == sampler_named("Euler", {**config, "timestep_spacing": "trailing", "steps_offset": 0})
    assert pipe.model_name == str(checkpoint) and pipe.images_per_call == 4


def test_random_weight_pipelines_use_sdxl_base_scheduler():
    pipe = build_pipeline(settled(_parse("--architecture", "small", "--random-weights", "--images", "1")))
    # (nothing compiles before the first call)
    assert pipe.sampler == sampler_named("Euler", SCHEDULER_CONFIG)
    assert pipe.model_name == "small" and pipe.images_per_call == 1


def test_kernels_check_reads_the_compiled_attention_layer():
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels_check.py"
    result = subprocess.run([sys.executable, str(script), "--tokens", "256", "--channels", "128",
                             "--heads", "2"], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr[-3000:]
    r = json.loads(result.stdout)
    # XLA's CPU backend keeps the three projections apart and has no fused attention kernel.
    assert r["backend"] == "cpu" and r["projection_matmuls"] == 3 and r["attention_kernels"] == []


def test_bench_features_time_each_beside_plain_text_to_image():
    """--features loads random networks beside the model, compiles only the programs its calls run, and
    times each feature's calls alternated with plain ones: what each adds a call and a step. (The
    ControlNet's calls are --controlnets' own, tested with the pipeline's.)"""
    from sdxl_tpu.bench.run import run

    steps = 5
    args = settled(_parse("--architecture", "tiny", "--random-weights", "--size", "64x64", "--steps", str(steps),
                          "--images", "1", "--runs", "1", "--no-warm-compile", "--features",
                          " ip-adapter,refiner,ip-adapter", "--json"))
    assert args.features == ("ip-adapter", "refiner")
    r = run(args)
    features = r["features"]
    assert list(features) == ["plain", "ip-adapter", "refiner"]
    for name, f in features.items():
        assert 0 < f["denoising_s"] < f["latency_s"], name
        assert f["ms_per_step"] == pytest.approx(1000 * f["denoising_s"] / steps)
        assert f["latency_over_plain"] == pytest.approx(f["latency_s"] / features["plain"]["latency_s"] - 1)
    # The refiner's steps (the last of five: switch at 0.8) are not timed apart: what its call's denoising
    # took beyond four fifths of the plain one's. (A difference of two timings: on a busy CPU, one run
    # each, it may come out below zero; what holds on any machine is how it is made.)
    refiner, plain = features["refiner"], features["plain"]
    assert features["plain"]["latency_over_plain"] == 0 and refiner["refiner_ms_per_step"] == pytest.approx(
        1000 * (refiner["denoising_s"] - plain["denoising_s"] * 4 / 5))
    # The image prompt's call encodes the image besides the text: its text stage does more.
    assert features["ip-adapter"]["stage_s"]["text_encoding"] > 0
    # Only the timed calls' programs compiled (a server's warm-up would compile the unguided ones too).
    compiled = set(r["memory_bytes"]["compiled"])
    assert {"denoise", "denoise_ip", "image_prompt", "refiner_denoise", "refiner_encode"} <= compiled
    assert not any("unguided" in name for name in compiled)
    assert r["controlnets"] == 0 and r["flops"]["controlnets_per_image_eval_tflop"] == 0
    assert "ip-adapter        " in format_report(r) and "the refiner's steps" in format_report(r)

    # What each feature's call asks for (the ControlNet's: every loaded one, but only in its own calls).
    from types import SimpleNamespace

    from sdxl_tpu.bench.run import call_options

    pipe, plain = SimpleNamespace(controlnets={"random-0": None}, ip_adapter="ip-adapter_sdxl"), argparse.Namespace(
        size=(64, 48), controlnets=0)
    assert [u["model"] for u in call_options(pipe, plain, "controlnet")["controlnet"]] == ["random-0"]
    assert call_options(pipe, plain, "controlnet")["controlnet"][0]["image"].shape == (48, 64, 3)
    assert call_options(pipe, plain) == {"controlnet": None}
    assert call_options(pipe, plain, "ip-adapter-plus")["controlnet"][0]["model"] == "ip-adapter_sdxl"
    assert call_options(pipe, plain, "refiner") == {"refiner_switch_at": 0.8}
    assert len(call_options(pipe, argparse.Namespace(size=(64, 48), controlnets=1))["controlnet"]) == 1

    for argv, message in [(["--features", "lora"], "not one of"),
                          (["--features", "ip-adapter,ip-adapter-plus"], "one IP-Adapter at a time"),
                          (["--features", "refiner", "--controlnets", "1"], "not with a checkpoint or --controlnets")]:
        with pytest.raises(ValueError, match=message):
            settled(_parse("--architecture", "tiny", "--random-weights", *argv))
    with pytest.raises(ValueError, match="not with a checkpoint"):
        settled(_parse("--architecture", "tiny", "--features", "refiner"))
