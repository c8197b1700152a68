"""`python -m sdxl_tpu generate`: PNGs with A1111 parameters, timings, one-line errors."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from reference import read_with_third_parties
from sdxl_tpu.version import VERSION


def _run(args, env_extra, timeout=600):
    env = dict(os.environ, JAX_PLATFORMS="cpu", **env_extra)
    return subprocess.run([sys.executable, "-m", "sdxl_tpu", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture(scope="module")
def env(tmp_path_factory, compile_cache):
    return {"SDXL_TPU_TINY_DIR": str(tmp_path_factory.mktemp("tiny-cache") / "tiny"),
            "SDXL_TPU_COMPILE_CACHE": str(compile_cache)}


@pytest.fixture
def main(env, monkeypatch):
    """The CLI's entry point in this process, under `env`: what a process of its own adds (exit
    codes, stderr) is checked once, by the tests that run one; this saves the JAX import and
    start-up, some 4 s a run."""
    from sdxl_tpu.__main__ import main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return main


def test_generate_writes_pngs_with_parameters(env, tmp_path):
    result = _run(["generate", "a photo of a cat", "--negative", "blurry", "--seed", "7", "--steps", "2",
                   "--guidance", "5", "--sampler", "DPM++ 2M Karras", "--schedule", "Checkpoint", "--rng", "JAX",
                   "--size", "64x64", "--model", "tiny",
                   "--dtype", "float32", "--out", str(tmp_path)], env)
    assert result.returncode == 0, result.stderr[-3000:]
    files = sorted(tmp_path.glob("*.png"))
    assert [f.name for f in files] == ["10.png", "7.png", "8.png", "9.png"]
    image = Image.open(tmp_path / "8.png")
    assert image.size == (64, 64)
    assert image.info["parameters"] == ("a photo of a cat\nNegative prompt: blurry\nSteps: 2, "
                                        "Sampler: DPM++ 2M Karras, Schedule type: Checkpoint, CFG scale: 5, Seed: 8, "
                                        f"Size: 64x64, Model: tiny, RNG: JAX, Version: sdxl-tpu {VERSION}")
    assert "denoising" in result.stdout and "total" in result.stdout


def test_seed_minus_one_draws_a_random_seed_each_run(main, tmp_path):
    """--seed -1, as A1111's: each run a random base seed; the files and their parameters name the seeds used."""
    common = ["generate", "a cat", "--seed", "-1", "--steps", "1", "--size", "64x64", "--model", "tiny",
              "--dtype", "float32"]
    runs = []
    for run in ("first", "second"):
        assert main([*common, "--out", str(tmp_path / run)]) == 0
        files = sorted((tmp_path / run).glob("*.png"))
        assert len(files) == 4 and all(f"Seed: {f.stem}," in Image.open(f).info["parameters"] for f in files)
        runs.append({int(f.stem) for f in files})
    assert runs[0] != runs[1] and all(0 <= seed < 2**32 for seed in runs[0] | runs[1])


def test_generate_from_an_image(main, tmp_path, capsys):
    """--image/--strength/--resize-mode: img2img from a file, decoded by its content (a PNG named
    .jpg is a PNG), fitted to the size; its parameters say the strength; bad files and values are
    one line each, before anything loads."""
    y, x = np.mgrid[0:48, 0:96]
    start = tmp_path / "start.jpg"  # (a PNG under another name)
    Image.fromarray(np.stack([x * 2, y * 5, x + y], -1).astype(np.uint8)).save(start, "PNG")
    common = ["generate", "a cat", "--seed", "3", "--steps", "4", "--size", "64x64", "--model", "tiny",
              "--dtype", "float32"]  # (the programs test_seed_minus_one compiles: the session's cache has them)
    assert main([*common, "--image", str(start), "--strength", "0.5", "--resize-mode", "Crop and resize",
                 "--out", str(tmp_path / "out")]) == 0
    image = Image.open(tmp_path / "out" / "3.png")
    assert image.size == (64, 64) and ", Denoising strength: 0.5, RNG: JAX" in image.info["parameters"]
    # --mask (inpainting): outside the blurred mask, the fitted image's pixels.
    mask = np.zeros((48, 96), np.uint8)
    mask[:, 48:] = 255
    Image.fromarray(mask).save(tmp_path / "mask.png")
    Image.fromarray(mask[:32, :32]).save(tmp_path / "small.png")
    assert main([*common, "--image", str(start), "--mask", str(tmp_path / "mask.png"), "--mask-blur", "2",
                 "--masked-content", "fill", "--out", str(tmp_path / "inpainted")]) == 0
    inpainted = Image.open(tmp_path / "inpainted" / "3.png")
    assert ", Denoising strength: 0.75, Mask blur: 2, Masked content: fill, RNG" in inpainted.info["parameters"]
    fitted = np.asarray(Image.open(start).convert("RGB").resize((64, 64), Image.Resampling.LANCZOS))
    np.testing.assert_array_equal(np.asarray(inpainted.convert("RGB"))[:, :24], fitted[:, :24])
    assert not np.array_equal(np.asarray(inpainted.convert("RGB"))[:, 40:], fitted[:, 40:])
    # --inpaint-area "Only masked": the mask's region redrawn, pasted back into the image at its own size.
    assert main([*common, "--image", str(start), "--mask", str(tmp_path / "mask.png"), "--inpaint-area", "Only masked",
                 "--mask-padding", "8", "--out", str(tmp_path / "only")]) == 0
    only = Image.open(tmp_path / "only" / "3.png")
    assert only.size == (96, 48) and "Inpaint area: Only masked, Masked area padding: 8," in only.info["parameters"]
    np.testing.assert_array_equal(np.asarray(only.convert("RGB"))[:, :36], np.asarray(Image.open(start))[:, :36])
    (tmp_path / "page.png").write_bytes(b"<html><script>alert(1)</script></html>")
    for args, message in [
        (["--image", str(tmp_path / "page.png")], "error: --image is not a PNG, JPEG or WebP image."),
        (["--image", str(tmp_path / "missing.png")], "error: --image " + str(tmp_path / "missing.png")
         + ": No such file or directory."),
        (["--image", str(start), "--strength", "2"], "error: Denoising strength must be a number between 0 and 1."),
        (["--strength", "0.5"], "error: --strength applies to a starting image: give --image too."),
        (["--mask", str(start)], "error: Mask applies to a starting image: give the image too."),
        (["--image", str(start), "--mask", str(tmp_path / "small.png")],
         "error: Mask is 32x32 pixels but the image is 96x48: they must be the same size (or the size to make, "
         "64x64: a mask of the image fitted to it, as for outpainting)."),
        (["--image", str(start), "--mask", str(start), "--inpaint-area", "Only masked", "--mask-padding", "300"],
         "error: Only masked padding, pixels must be a whole number between 0 and 256."),
        (["--image", str(start), "--mask-padding", "8"], "error: Only masked padding, pixels applies to a mask: give "
                                                         "the mask too."),
    ]:
        capsys.readouterr()
        assert main([*common, *args, "--out", str(tmp_path / "bad")]) == 2, args
        assert capsys.readouterr().err.strip() == message
    assert not (tmp_path / "bad").exists()


def test_hires_fix_compiles_both_sizes_and_says_so(main, tmp_path, capsys):
    """--hires: the images at --size, then upscaled and denoised again; both sizes compiled for the
    run, the parameters A1111's; a scale that does not land on whole latents is refused at once."""
    common = ["generate", "a cat", "--seed", "5", "--steps", "2", "--size", "64x64", "--model", "tiny",
              "--dtype", "float32", "--hires", "--hires-steps", "3"]
    assert main([*common, "--hires-scale", "1.5", "--out", str(tmp_path)]) == 0
    image = Image.open(tmp_path / "5.png")
    assert image.size == (96, 96) and "Size: 64x64," in image.info["parameters"]
    assert ("Denoising strength: 0.7, Hires upscale: 1.5, Hires steps: 3, Hires upscaler: Latent, RNG: JAX"
            in image.info["parameters"])
    capsys.readouterr()
    assert main([*common, "--hires-scale", "1.3", "--out", str(tmp_path / "bad")]) == 2
    assert "Hires upscale 1.3 makes 83x83" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_presets_fill_what_is_not_given(main, env, tmp_path):
    """--preset: a sampling preset on any model; a model preset's weights replaced by local ones
    (its UNet file from the Hub is not reachable here); options given explicitly win."""
    assert main(["generate", "a cat", "--preset", "Fast", "--seed", "1", "--size", "64x64", "--model", "tiny",
                 "--dtype", "float32", "--out", str(tmp_path / "fast")]) == 0
    assert ("Steps: 12, Sampler: DPM++ 2M Karras, Schedule type: Checkpoint, CFG scale: 5,"
            in Image.open(tmp_path / "fast" / "1.png").info["parameters"])
    unet = str(Path(env["SDXL_TPU_TINY_DIR"]) / "unet" / "diffusion_pytorch_model.safetensors")  # written above
    assert main(["generate", "a cat", "--preset", "Lightning 4-step", "--seed", "1", "--size", "64x64",
                 "--model", "tiny", "--unet", unet, "--dtype", "float32", "--out", str(tmp_path / "lightning")]) == 0
    parameters = Image.open(tmp_path / "lightning" / "1.png").info["parameters"]
    assert ("Steps: 4, Sampler: Euler, Schedule type: Checkpoint, CFG scale: 0, Seed: 1, Size: 64x64, "
            "Model: tiny + diffusion_pytorch_model, RNG: JAX,") in parameters


def test_single_file_model_with_loras(main, tmp_path):
    """--model FILE.safetensors (configs and tokenizers from --config) and --lora FILE[:SCALE],
    repeatable: the LoRAs change the images and are named in their parameters."""
    import numpy as np
    from safetensors.numpy import save_file

    from sdxl_tpu.weights.single_file import write_single_file
    from sdxl_tpu.weights.tiny import write_tiny_checkpoint

    root = write_tiny_checkpoint(tmp_path / "tiny")
    model = write_single_file(root, tmp_path / "my-finetune.safetensors")
    rng = np.random.default_rng(0)
    module = "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q"
    save_file({f"{module}.lora_down.weight": rng.standard_normal((2, 64)).astype(np.float32),
               f"{module}.lora_up.weight": rng.standard_normal((64, 2)).astype(np.float32)},
              str(tmp_path / "style.safetensors"))
    common = ["generate", "a cat", "--seed", "3", "--steps", "2", "--size", "64x64", "--dtype", "float32",
              "--model", str(model), "--config", str(root)]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert main([*common, "--lora", f"{tmp_path / 'style.safetensors'}:0.7",
                 "--lora", str(tmp_path / "style.safetensors"), "--out", str(tmp_path / "styled")]) == 0
    plain_image, styled_image = Image.open(tmp_path / "plain" / "3.png"), Image.open(tmp_path / "styled" / "3.png")
    # A1111's names: the checkpoint's short hash (SHA-256, 10 digits), each LoRA as a tag with its scale
    # in the prompt and its hash (12 digits); as readers nobody here wrote see them.
    model_hash = hashlib.sha256(model.read_bytes()).hexdigest()[:10]
    lora_hash = hashlib.sha256((tmp_path / "style.safetensors").read_bytes()).hexdigest()[:12]
    assert plain_image.info["parameters"].endswith(f"Model hash: {model_hash}, Model: my-finetune, RNG: JAX, "
                                                   f"Version: sdxl-tpu {VERSION}")
    assert styled_image.info["parameters"].splitlines()[0] == "a cat <lora:style:0.7> <lora:style:1>"
    assert styled_image.info["parameters"].endswith(
        f'Model hash: {model_hash}, Model: my-finetune, RNG: JAX, '
        f'Lora hashes: "style: {lora_hash}, style: {lora_hash}", '
        f"Version: sdxl-tpu {VERSION}")
    seen = read_with_third_parties((tmp_path / "styled" / "3.png").read_bytes(), tmp_path)
    assert seen == {"prompt": "a cat <lora:style:0.7> <lora:style:1>", "negative": "", "sampler": "Euler",
                    "scheduler": "Checkpoint", "steps": "2", "cfg_scale": "5", "seed": "3", "size": "64x64",
                    "model": "my-finetune", "model_hash": model_hash}, seen
    assert np.asarray(plain_image).tolist() != np.asarray(styled_image).tolist()


def test_generate_with_a_controlnet(main, tiny_controlnet, tmp_path, capsys):
    """--controlnet and --control-image, with the page's unit options (--control-module, -weight,
    -start, -end, -low, -high): the images differ from the same call's without, their parameters
    carry sd-webui-controlnet's line; bad values are one line each, before anything loads."""
    checks = tmp_path / "checks.jpg"  # (a PNG under another name: decoded by its content)
    y, x = np.mgrid[0:48, 0:80]
    Image.fromarray(((x // 8 + y // 8) % 2 * 255).astype(np.uint8)).save(checks, "PNG")
    common = ["generate", "a cat", "--seed", "3", "--steps", "2", "--size", "64x64", "--model", "tiny",
              "--dtype", "float32"]
    unit = ["--controlnet", str(tiny_controlnet), "--control-image", str(checks)]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert main([*common, *unit, "--control-module", "canny", "--control-weight", "0.8", "--control-end", "0.5",
                 "--control-low", "50", "--out", str(tmp_path / "guided")]) == 0
    plain, guided = Image.open(tmp_path / "plain" / "3.png"), Image.open(tmp_path / "guided" / "3.png")
    assert (', ControlNet 0: "Module: canny, Model: edges, Weight: 0.8, Resize Mode: Crop and Resize, '
            'Threshold A: 50, Threshold B: 200, Guidance Start: 0, Guidance End: 0.5, Pixel Perfect: True, '
            'Control Mode: Balanced"' in guided.info["parameters"])
    assert "ControlNet" not in plain.info["parameters"]
    assert not np.array_equal(np.asarray(plain), np.asarray(guided))
    (tmp_path / "page.png").write_bytes(b"<svg onload=alert(1)>")
    for args, message in [
        (["--control-image", str(checks)],
         "--control-image guides through a ControlNet or an IP-Adapter: give --controlnet or --ip-adapter too."),
        ([*unit, "--control-weight", "3"], "Control weight must be a number between 0 and 2."),
        ([*unit, "--control-start", "0.6", "--control-end", "0.5"],
         "ControlNet unit 0: guidance_start (0.6) must be below guidance_end (0.5)."),
        ([*unit, "--control-model", "depth"], "ControlNet 'depth' is not available; choose one of: edges."),
        (["--controlnet", str(tiny_controlnet), "--control-image", str(tmp_path / "missing.png")],
         f"--control-image {tmp_path / 'missing.png'}: No such file or directory."),
        (["--controlnet", str(tiny_controlnet), "--control-image", str(tmp_path / "page.png")],
         "ControlNet image is not a PNG, JPEG or WebP image."),
    ]:
        capsys.readouterr()
        assert main([*common, *args, "--out", str(tmp_path / "bad")]) == 2, args
        assert capsys.readouterr().err.strip().startswith("error: " + message), args
    assert not (tmp_path / "bad").exists()


def test_generate_with_an_ip_adapter(main, tiny_ip_adapter, tmp_path, capsys):
    """--ip-adapter and --image-encoder, the image prompt given as the ControlNet unit's image with
    --control-model naming the adapter: the parameters name it, the image differs from the same call's
    without; an adapter without its encoder is one line, as is an encoder alone."""
    adapter, encoder = tiny_ip_adapter
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (120, 90, 3), np.uint8)).save(tmp_path / "prompt.png")
    common = ["generate", "a cat", "--seed", "3", "--steps", "2", "--size", "64x64", "--model", "tiny",
              "--dtype", "float32", "--ip-adapter", str(adapter)]
    assert main([*common, "--image-encoder", str(encoder), "--control-image", str(tmp_path / "prompt.png"),
                 "--control-model", "ip-adapter_sdxl", "--control-weight", "0.6", "--out", str(tmp_path / "ip")]) == 0
    assert main([*common, "--image-encoder", str(encoder), "--out", str(tmp_path / "plain")]) == 0
    guided, plain = Image.open(tmp_path / "ip" / "3.png"), Image.open(tmp_path / "plain" / "3.png")
    assert 'ControlNet 0: "Module: none, Model: ip-adapter_sdxl, Weight: 0.6,' in guided.info["parameters"]
    assert not np.array_equal(np.asarray(plain), np.asarray(guided))
    for args, message in (([], "IP-Adapter ip-adapter_sdxl.safetensors: give its image encoder too (--image-encoder"),
                          (["--control-image", str(tmp_path / "prompt.png"), "--control-module", "canny",
                            "--image-encoder", str(encoder)], "ControlNet unit 0: module canny is a ControlNet's")):
        capsys.readouterr()
        assert main([*common, *args, "--out", str(tmp_path / "bad")]) == 2, args
        assert capsys.readouterr().err.strip().startswith("error: " + message), args
    capsys.readouterr()
    assert main([*common[:-2], "--image-encoder", str(encoder), "--out", str(tmp_path / "bad")]) == 2
    assert "an image encoder serves an IP-Adapter: give the IP-Adapter too" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    # The same rules and messages as the API and the playground (sdxl_tpu.request), checked before loading.
    (["generate", "x", "--size", "64y64"], "Size must look like WIDTHxHEIGHT (e.g. 1024x1024), got '64y64'."),
    (["generate", "x", "--steps", "abc"], "argument --steps: invalid int value"),
    (["generate", "x", "--steps", "0"], "Steps must be a whole number between 1 and 50."),
    (["generate", "   "], "Prompt is empty: please enter a prompt."),
    (["generate", "x", "--guidance", "nan"], "Guidance scale must be a finite number between 0 and 20."),
    (["generate", "x", "--model", "/nonexistent/model"], "neither an existing directory nor a Hub repo id"),
    (["generate", "x", "--model", "tiny", "--size", "64x64", "--seed", "-3", "--steps", "1"],
     "Seed must be a whole number between -1 (random) and 4294967295."),
    (["generate", "x", "--sampler", "Heun"], "argument --sampler: invalid choice: 'Heun'"),
    (["generate", "x", "--sampler", "DDIM", "--schedule", "Karras"],
     "DDIM runs on its own timesteps: choose Schedule type Checkpoint or Automatic, not Karras."),
    (["generate", "x", "--sampler", "DPM++ 2M Karras", "--parameters", "x\nSteps: 2, Seed: 1, Schedule type: Uniform"],
     "DPM++ 2M Karras names its schedule (Karras): for Schedule type Uniform choose DPM++ 2M."),
    (["generate", "x", "--schedule", "karras"], "argument --schedule: invalid choice: 'karras'"),
    (["generate", "x", "--rng", "NV"], "argument --rng: invalid choice: 'NV'"),
    (["generate", "x", "--preset", "Ultra"], "argument --preset: invalid choice: 'Ultra'"),
    (["frobnicate"], "invalid choice"),
    (["generate", "x", "--model", "tiny", "--size", "64x64", "--lora", "/nonexistent/style.safetensors"],
     "weights file '/nonexistent/style.safetensors' is neither an existing file"),
])
def test_bad_arguments_are_one_line_errors(main, args, message, capsys):
    """In this process (what a subprocess adds is checked below, once)."""
    try:
        code = main(args)
    except SystemExit as e:
        code = e.code
    stderr = capsys.readouterr().err
    assert code != 0 and "Traceback" not in stderr
    lines = [line for line in stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], stderr[-2000:]


def test_a_bad_argument_ends_the_process_with_one_line(env):
    result = _run(["generate", "x", "--steps", "0"], env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        "error: Steps must be a whole number between 1 and 50."], result.stderr[-2000:]


def test_parameters_text_fills_what_is_not_given(main, tmp_path, capsys):
    """--parameters: an A1111 text (here our own, from an image) gives prompt, negative prompt,
    steps, sampler, CFG scale, seed and size; options given win; the rest is noted."""
    text = ("a red fox\nNegative prompt: fog\nSteps: 2, Sampler: Euler a, Schedule type: Karras, CFG scale: 3, "
            "Seed: 40, Size: 64x64, Model: elsewhere, Clip skip: 2, Denoising strength: 0.5")
    assert main(["generate", "--parameters", text, "--seed", "41", "--schedule", "Checkpoint", "--model", "tiny",
                 "--dtype", "float32", "--out", str(tmp_path)]) == 0
    notes = capsys.readouterr().err
    assert "note: Not used here: Model, Clip skip." in notes  # (and img2img's strength, without --image: dropped)
    assert "note: Not reproducible here: A1111's default noise source (GPU), so RNG JAX is used" in notes
    assert Image.open(tmp_path / "42.png").info["parameters"] == (
        "a red fox\nNegative prompt: fog\nSteps: 2, Sampler: Euler a, Schedule type: Checkpoint, CFG scale: 3, "
        f"Seed: 42, Size: 64x64, Model: tiny, RNG: JAX, Version: sdxl-tpu {VERSION}")


def test_generate_with_a_refiner(main, tiny_refiner, tmp_path, capsys):
    """--refiner hands the last steps to it (at 0.8 unless --refiner-switch-at says): the parameters say
    so, as A1111's; a switch without a refiner is one line, before anything loads."""
    refiner = tiny_refiner
    common = ["generate", "a cat", "--seed", "3", "--steps", "3", "--size", "64x64", "--model", "tiny",
              "--dtype", "float32"]
    assert main([*common, "--refiner", str(refiner), "--out", str(tmp_path / "refined")]) == 0
    text = Image.open(tmp_path / "refined" / "3.png").info["parameters"]
    assert "Refiner: sdxl-tiny-refiner, Refiner switch at: 0.8," in text
    capsys.readouterr()
    assert main([*common, "--refiner-switch-at", "0.5", "--out", str(tmp_path / "bad")]) == 2
    assert capsys.readouterr().err.strip() == ("error: --refiner-switch-at says where the refiner takes over: give "
                                               "--refiner too.")
