"""Command line.

    python -m sdxl_tpu generate "a photo of a cat" --negative "blurry" --seed 7 --steps 20 \\
        --guidance 5 --sampler "DPM++ 2M" --schedule Karras --rng CPU --size 1024x1024 \\
        --model stabilityai/stable-diffusion-xl-base-1.0 --lora style.safetensors:0.8 --out DIR
    python -m sdxl_tpu make-tiny DIR
    python -m sdxl_tpu serve --model tiny --host 127.0.0.1 --port 8000   # the HTTP back end
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _build_parser() -> argparse.ArgumentParser:
    from .names import DEFAULT_RNG, DEFAULT_SCHEDULE, RNGS, SAMPLERS, SCHEDULES

    parser = _Parser(prog="python -m sdxl_tpu", description="Stable Diffusion XL in JAX.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    tiny = commands.add_parser("make-tiny", help="write a tiny random SDXL checkpoint in diffusers format")
    tiny.add_argument("directory")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--preset", choices=["tiny", "small", "sdxl"], default="tiny",
                      help="architecture: tiny (default), small (benchmarks), sdxl (full size, about 14 GB)")

    gen = commands.add_parser("generate", help="generate images and write them as PNGs")
    gen.add_argument("prompt", nargs="?", default=None, help="the prompt (or from --parameters)")
    gen.add_argument("--parameters", default=None, metavar="TEXT",
                     help="an AUTOMATIC1111 parameters text (as its PNG Info shows it, or as our images carry it): "
                          "prompt, negative prompt, steps, sampler, Schedule type, CFG scale, seed, size and RNG; "
                          "options given explicitly win; what it says that is not used is listed")
    gen.add_argument("--negative", default="", help="negative prompt")
    gen.add_argument("--seed", type=int, default=None, help="base seed; image i gets seed + i (default: random)")
    gen.add_argument("--preset", default=None,
                     help="settings that go together, e.g. 'Lightning 4-step', 'Turbo', 'Quality' (see README); "
                          "options given explicitly win")
    gen.add_argument("--steps", type=int, default=None, help="default 20")
    gen.add_argument("--guidance", type=float, default=None, help="default 5")
    gen.add_argument("--sampler", default=None,
                     help=f"one of {', '.join(SAMPLERS)} (AUTOMATIC1111's names; default: the checkpoint's scheduler)")
    gen.add_argument("--schedule", default=None, choices=list(SCHEDULES), metavar="SCHEDULE",
                     help=f"Schedule type: {', '.join(SCHEDULES)} (default {DEFAULT_SCHEDULE}: the checkpoint's "
                          "scheduler config as diffusers runs it; Automatic: each sampler's AUTOMATIC1111 default; "
                          "the others are AUTOMATIC1111's)")
    gen.add_argument("--rng", default=None, choices=list(RNGS),
                     help=f"where the noise comes from: {DEFAULT_RNG} (default) or CPU (PyTorch's CPU generator per "
                          "image seed, as AUTOMATIC1111's RNG CPU and ComfyUI draw it)")
    gen.add_argument("--size", default=None, help="WIDTHxHEIGHT (default 1024x1024)")
    gen.add_argument("--images", type=int, default=4,
                     help="images to make in one call (the compiled batch is rounded up to the device count)")
    gen.add_argument("--model", default=None,
                     help="Hub repo id, local diffusers directory, single-file .safetensors (A1111/ComfyUI layout; "
                          "local or owner/repo/file.safetensors), or 'tiny' (default: SDXL base 1.0)")
    gen.add_argument("--config", default=None,
                     help="for a single-file --model: the diffusers checkpoint (Hub id or directory) whose configs "
                          "and tokenizers it uses (default: SDXL base 1.0's; only those small files are fetched)")
    gen.add_argument("--unet", default=None,
                     help="UNet weights file instead of the model's (diffusers or single-file layout; local or "
                          "owner/repo/file.safetensors)")
    gen.add_argument("--lora", action="append", default=None, metavar="FILE[:SCALE]",
                     help="LoRA fused into the weights at load, kohya or diffusers format, scale default 1 "
                          "(repeatable)")
    gen.add_argument("--spacing", default=None, choices=["leading", "trailing", "linspace"],
                     help="timestep spacing instead of the scheduler config's (few-step models: trailing)")
    gen.add_argument("--prediction-type", default=None, choices=["epsilon", "sample"],
                     help="what the UNet predicts, instead of the scheduler config's (SDXL-Lightning 1-step: sample)")
    gen.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    gen.add_argument("--compile-cache", default=None, help="JAX compilation cache directory")
    gen.add_argument("--attention", default=os.environ.get("SDXL_TPU_ATTENTION", "auto"), choices=["auto", "xla"],
                     help="attention kernel: auto (best per platform) or xla (env SDXL_TPU_ATTENTION)")
    gen.add_argument("--out", default="outputs", help="output directory")
    serve = commands.add_parser("serve", help="serve the pipeline over plain HTTP: a back end for a load balancer "
                                              "(POST /v1/generate, /healthz, /readyz, /metrics)")
    from .server.settings import add_settings_arguments

    add_settings_arguments(serve, dict(os.environ))
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    serve.add_argument("--port", type=int, default=8000, help="port")
    bench = commands.add_parser("bench", help="benchmark compile time, latency, memory and FLOP utilisation")
    from .bench.run import add_arguments

    add_arguments(bench)
    return parser


def _generate(args: argparse.Namespace) -> int:
    from .weights.errors import CheckpointError
    from .compilation import enable_compile_cache
    from .server.settings import DEFAULT_COMPILE_CACHE
    from .images import save_png
    from .request import GenerationError
    from .loading import load_pipeline
    from .recipes import recipe_named, settle
    from .request import Request, schedule_input

    try:  # the request is checked before anything is loaded
        pasted = _pasted(args.parameters)
        s = settle(recipe_named(args.preset) if args.preset else None, model=args.model, unet=args.unet,
                   spacing=args.spacing, prediction_type=args.prediction_type,
                   **{key: getattr(args, arg) if getattr(args, arg) is not None else pasted.get(field)
                      for key, arg, field in (("sampler", "sampler", "sampler"), ("steps", "steps", "steps"),
                                              ("guidance", "guidance", "guidance_scale"), ("size", "size", "size"))})
        prompt = args.prompt if args.prompt is not None else pasted.get("prompt", "")
        negative = args.negative if args.negative or args.parameters is None else pasted.get("negative_prompt", "")
        given = lambda arg, field: getattr(args, arg) if getattr(args, arg) is not None else pasted.get(field)
        request = Request.of(prompt, negative, seed=given("seed", "seed"), guidance_scale=s["guidance"],
                             steps=s["steps"], size=s["size"], sampler=s["sampler"],
                             schedule=given("schedule", "schedule"), rng=given("rng", "rng"))
    except ValueError as e:
        return _fail(str(e))
    if args.images < 1:
        return _fail("--images must be at least 1")
    try:
        enable_compile_cache(args.compile_cache or DEFAULT_COMPILE_CACHE)
        pipe = load_pipeline(s["model"], dtype=args.dtype, sizes=[request.size], images_per_call=args.images,
                             step_progress=False, attention=args.attention, unet=s["unet"],
                             timestep_spacing=s["spacing"], prediction_type=s["prediction_type"], config=args.config,
                             loras=args.lora or ([s["lora"]] if s["lora"] else None))
        if request.sampler is None:  # the checkpoint's own sampler: its schedule is checked now it is known
            schedule_input(pipe.default_sampler, request.schedule)
        result = pipe.run(request, images=args.images)
    except (CheckpointError, ValueError, GenerationError, OSError) as e:
        return _fail(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for image, info in zip(result.images, result.infos):
        path = out / f"{info.seed}.png"
        save_png(image, info, path, model=pipe.stamp)
        print(path)
    t = result.timings
    print(f"text encoding {t['text_encoding']:.3f} s, denoising {t['denoising']:.3f} s, "
          f"decoding {t['decoding']:.3f} s, total {t['total']:.3f} s")
    return 0


def _pasted(text: str | None) -> dict:
    """The request fields of --parameters (any size: the CLI compiles the one asked for); what
    it says that is not used is noted on stderr."""
    if text is None:
        return {}
    from .infotext import parse, request_fields
    from .names import SAMPLERS

    parsed = parse(text)
    size = parsed.settings.get("Size", "")
    width, _, height = size.partition("x")
    sizes = [(int(width), int(height))] if width.isdigit() and height.isdigit() and len(size) <= 13 else []
    fields, notes = request_fields(parsed, sizes, list(SAMPLERS))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return fields


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    from .compilation import quiet_platforms

    quiet_platforms()  # no TPU error messages on a machine without TPU chips
    if args.command == "make-tiny":
        from .weights.tiny import write_checkpoint

        try:
            path = write_checkpoint(args.directory, args.preset, seed=args.seed)
        except OSError as e:
            return _fail(f"cannot write {args.directory}: {e.strerror or e}")
        print(f"wrote {'tiny' if args.preset == 'tiny' else args.preset} SDXL checkpoint to {path}")
        return 0
    if args.command == "serve":
        from .server.backend import main as serve_main
        from .server.settings import settings_from_arguments

        return serve_main(settings_from_arguments(parser, args))
    if args.command == "bench":
        from .bench.run import main as bench_main

        try:
            return bench_main(args)
        except (ValueError, OSError) as e:
            return _fail(str(e))
    return _generate(args)


if __name__ == "__main__":
    sys.exit(main())
