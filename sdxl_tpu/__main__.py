"""Command line.

    python -m sdxl_tpu generate "a photo of a cat" --negative "blurry" --seed 7 --steps 20 \\
        --guidance 5 --sampler "DPM++ 2M" --schedule Karras --rng CPU --size 1024x1024 \\
        --model stabilityai/stable-diffusion-xl-base-1.0 --lora style.safetensors:0.8 --out DIR
    python -m sdxl_tpu make-tiny DIR
    python -m sdxl_tpu serve --model tiny --host 127.0.0.1 --port 8000   # the HTTP back end
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn
from pathlib import Path

from .request.fields import FIELDS, PASTED


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage block
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _build_parser() -> argparse.ArgumentParser:
    from .cli.parsing import add_options

    parser = _Parser(prog="python -m sdxl_tpu", description="Stable Diffusion XL in JAX.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command, help in (
            ("make-tiny", "write a tiny random SDXL checkpoint in diffusers format"),
            ("generate", "generate images and write them as PNGs"),
            ("serve", "serve the pipeline over plain HTTP: a back end for a load balancer (POST /v1/generate, "
                      "/healthz, /readyz, /metrics)"),
            ("bench", "benchmark compile time, latency, memory and FLOP utilisation")):
        add_options(commands.add_parser(command, help=help), command)
    return parser


def _generate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from .generate.compiling.compilation import enable_compile_cache
    from .generate.loading import load
    from .request.errors import CompileError, GenerationError, RequestError
    from .request.fields import DEFAULT_STRENGTH, DEFAULT_SWITCH_AT
    from .imaging.image_input import decode_image
    from .a1111.dynamic_prompts import Wildcards
    from .a1111.images import save_png
    from .a1111.infotext import usable
    from .request.control import FORM_FIELDS, form_unit
    from .request.load import LoadOptions, controlnet_name
    from .cli.options import load_values
    from .cli.parsing import fill_defaults
    from .cli.xyz import plan, plot_of, run as run_plot
    from .request.recipes import recipe_named, settle
    from .request.request import Request
    from .request.values import schedule_input
    from .weights.errors import CheckpointError
    from .weights.upscalers import find_upscalers

    try:  # the request is checked before anything is loaded
        upscalers = tuple(find_upscalers(args.upscalers).found) if args.upscalers else ()
        pasted = usable(_pasted(args.parameters, upscalers), {"image": args.image, "mask": args.mask})
        args.hires = args.hires or bool(pasted.get("hires"))  # (a switch: fill_defaults leaves it)
        given = {f.name: pasted.get(f.api) if f.api else None for f in _PASTED}
        args = fill_defaults(parser, args, "generate", given=given)
        recipe = recipe_named(args.preset) if args.preset else None
        s = settle(recipe, sampler=args.sampler, steps=args.steps, guidance=args.guidance, size=args.size)
        strength = args.strength if args.strength is not None or args.image is None else DEFAULT_STRENGTH
        if args.image is None and strength is not None:
            raise RequestError("--strength applies to a starting image: give --image too.")
        image = None if args.image is None else decode_image(_read(args.image, "--image"), "--image")
        if args.control_image is not None and not args.controlnet and not args.ip_adapter:
            raise RequestError("--control-image guides through a ControlNet or an IP-Adapter: give --controlnet "
                               "or --ip-adapter too.")
        ip_adapters = () if args.ip_adapter is None else (controlnet_name(args.ip_adapter),)
        controlnets = (*map(controlnet_name, args.controlnet), *ip_adapters)
        units = form_unit({name: getattr(args, name) for name in FORM_FIELDS}, controlnets,
                          lambda path, label: _read(path, "--control-image"))
        # Each field's option is named as the form names it (test_fields checks it); these few are
        # settled by the recipe, or are files to read.
        fields = {**{f.api: getattr(args, f.name) for f in FIELDS if f.api},
                  "guidance_scale": s["guidance"], "steps": s["steps"], "size": s["size"], "sampler": s["sampler"],
                  "strength": strength, "hires": args.hires or None, "image": image,
                  "mask": None if args.mask is None else _read(args.mask, "--mask")}
        if args.refiner_switch_at is not None and args.refiner is None:
            if pasted.get("refiner_switch_at") is None:  # (a pasted text's, without a refiner here: not used)
                raise RequestError("--refiner-switch-at says where the refiner takes over: give --refiner too.")
            fields["refiner_switch_at"] = None
        if args.refiner and args.refiner_switch_at is None:
            fields["refiner_switch_at"] = DEFAULT_SWITCH_AT
        more: dict[str, Any] = dict(controlnet=units, controlnets=controlnets, ip_adapters=ip_adapters,
                                    upscalers=upscalers, wildcards=Wildcards(args.wildcards))
        request = Request.of(**fields, **more)
        if args.images < 1:
            raise RequestError("--images must be at least 1")
        plot = plot_of(args, img2img=image is not None)  # an X/Y/Z plot: its calls' requests checked now too
        plotted = None if plot is None else plan(plot, fields, more, args.images)
        requests = [request] if plotted is None else [r for _, r in plotted.calls]
        sizes = plotted.sizes if plotted else [request.size] + ([request.hires.size] if request.hires else [])
        options = LoadOptions.of(load_values(args, "generate"), recipe).replace(sizes=sizes, step_progress=False)
    except ValueError as e:
        return _fail(str(e))
    try:
        if args.compile_cache:
            enable_compile_cache(args.compile_cache)
        pipe = load(options, warmup=False, compile_cache=args.compile_cache)  # (compiles what the run needs)
        for r in requests:  # the checkpoint's own sampler: its schedule is checked now it is known
            if r.sampler is None:
                schedule_input(pipe.default_sampler, r.schedule)
        if plotted is not None:
            run_plot(pipe, plotted, Path(args.out))
            return 0
        result = pipe.run(request, images=args.images)
    except (CheckpointError, ValueError, GenerationError, CompileError, OSError) as e:
        return _fail(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for image, info in zip(result.images, result.infos):
        path = out / f"{info.seed}.png"
        save_png(image, info, path, model=pipe.stamp_for(info))
        print(path)
    t = result.timings
    print(f"text encoding {t['text_encoding']:.3f} s, denoising {t['denoising']:.3f} s, "
          f"decoding {t['decoding']:.3f} s, total {t['total']:.3f} s")
    return 0


# The fields --parameters may fill: each is an option of generate, named as the form names it.
_PASTED = [f for f in FIELDS if PASTED in f.kept]


def _pasted(text: str | None, upscalers: tuple[str, ...]) -> dict:
    """The request fields of --parameters (any size: the CLI compiles the one asked for); what
    it says that is not used is noted on stderr."""
    if text is None:
        return {}
    from .a1111.infotext import parse, request_fields
    from .request.names import SAMPLERS

    parsed = parse(text)
    size = parsed.settings.get("Size", "")
    width, _, height = size.partition("x")
    sizes = [(int(width), int(height))] if width.isdigit() and height.isdigit() and len(size) <= 13 else []
    fields, notes = request_fields(parsed, sizes, list(SAMPLERS), upscalers)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return fields


def _read(path: str, flag: str) -> bytes:
    """A file the person named on the command line with `flag` (its content decides what it is)."""
    from .request.errors import RequestError
    from .imaging.image_input import MAX_BYTES

    try:
        with open(path, "rb") as f:
            return f.read(MAX_BYTES + 1)
    except OSError as e:
        raise RequestError(f"{flag} {path}: {e.strerror or e}.") from None


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    from .generate.compiling.compilation import before_jax_starts
    from .cli.parsing import fill_defaults

    before_jax_starts()  # no TPU error messages on a machine without TPU chips; the TPU runtime's host buffer
    if args.command != "generate":  # (generate fills them in after reading --parameters)
        args = fill_defaults(parser, args, args.command)
    if args.command == "make-tiny":
        from .weights.tiny import write_checkpoint

        from .cli.parsing import older_architecture

        architecture = older_architecture(args) or args.architecture
        try:
            path = write_checkpoint(args.directory, architecture, seed=args.seed)
        except OSError as e:
            return _fail(f"cannot write {args.directory}: {e.strerror or e}")
        print(f"wrote {architecture} SDXL checkpoint to {path}")
        return 0
    if args.command == "serve":
        from .routes.backend import main as serve_main
        from .server.settings import settings_from_arguments

        return serve_main(settings_from_arguments(parser, args))
    if args.command == "bench":
        from .bench.run import main as bench_main

        try:
            return bench_main(args)
        except (ValueError, OSError) as e:
            return _fail(str(e))
    return _generate(parser, args)


if __name__ == "__main__":
    sys.exit(main())
