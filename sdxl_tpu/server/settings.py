"""The server's settings: the command line, with environment variables as defaults (for Spaces
and containers), shared by the playground (app.py) and the back end (`python -m sdxl_tpu serve`)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..images import FORMATS
from ..names import DEFAULT_RNG, DEFAULT_SCHEDULE, RNGS, SCHEDULES
from ..prompts import DEFAULT_MAX_CHUNKS, MAX_CHUNKS
from ..recipes import BASE, RECIPES, Recipe, recipe_named, settle
from ..request import RequestError, parse_size, schedule_input
from .remote import check_backend_url

# JAX's persistent compilation cache (a restart reuses compiled programs); named here, where no JAX is.
DEFAULT_COMPILE_CACHE = Path(os.environ.get("SDXL_TPU_COMPILE_CACHE", Path.home() / ".cache" / "sdxl_tpu" / "jax"))


DEFAULT_MODEL = BASE


QUEUE_SIZE = 16


DRAIN_SECONDS = 60.0


TINY_DEFAULT_SIZE = "256x256"


@dataclass
class Settings:
    model: str = DEFAULT_MODEL
    sizes: list[tuple[int, int]] = field(default_factory=lambda: [(1024, 1024)])
    dtype: str = "bfloat16"
    host: str = "127.0.0.1"
    port: int = 7860
    compile_cache: str | None = str(DEFAULT_COMPILE_CACHE)
    attention: str = "auto"
    images_per_call: int = 4
    queue_size: int = QUEUE_SIZE
    image_format: str = "jpeg"
    keep_images_seconds: float = 3600.0
    max_image_bytes: int = 1 << 30
    drain_seconds: float = DRAIN_SECONDS
    metrics: str = "public"
    unet: str | None = None
    config: str | None = None  # where a single-file model's configs and tokenizers come from
    loras: list[str] = field(default_factory=list)  # "file[:scale]", fused at load
    timestep_spacing: str | None = None
    prediction_type: str | None = None
    recipe: Recipe | None = None  # the launch preset: the page's defaults for steps, guidance, sampler
    preview_every: int | None = None  # steps between live previews (None: about four a run; 0: none)
    preview: str = "approx"  # how previews are decoded: approx, taesd, or a TAESD checkpoint
    backend: str | None = None  # a front end's back-end URL: generations are sent there, no model is loaded
    max_prompt_chunks: int = DEFAULT_MAX_CHUNKS  # the longest prompt, in chunks of 75 tokens
    schedule: str = DEFAULT_SCHEDULE  # the Schedule type of a request that names none (the page's default)
    rng: str = DEFAULT_RNG  # the noise source of a request that names none (the page's default)


# SDXL's trained sizes (about a megapixel each): the first is compiled before the app is ready, the
# others in the background.
SDXL_SIZES = ("1024x1024", "1152x896", "896x1152", "1216x832", "832x1216", "1344x768", "768x1344", "1536x640",
              "640x1536")


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """--sizes: comma-separated WIDTHxHEIGHT, or "sdxl" for SDXL_SIZES."""
    if text.strip().lower() == "sdxl":
        text = ",".join(SDXL_SIZES)
    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise ValueError("--sizes needs at least one WIDTHxHEIGHT")
    return list(dict.fromkeys(sizes))


def add_settings_arguments(parser: argparse.ArgumentParser, env: dict[str, str]) -> None:
    """The model and serving options the playground (app.py) and the back end (`python -m sdxl_tpu
    serve`) share, each with its environment variable as default (for Spaces and containers)."""
    parser.add_argument("--preset", default=env.get("SDXL_PRESET") or None, choices=list(RECIPES),
                        help="settings that go together (weights, sampler, spacing, steps, guidance, size), e.g. "
                             "'Lightning 4-step' or 'Turbo'; options given explicitly win (env SDXL_PRESET)")
    parser.add_argument("--model", default=env.get("SDXL_MODEL") or None,
                        help="Hub repo id, local diffusers directory, single-file .safetensors (A1111/ComfyUI layout, "
                             "local or owner/repo/file.safetensors), or 'tiny' (env SDXL_MODEL; default SDXL base 1.0, "
                             "or the preset's)")
    parser.add_argument("--config", default=env.get("SDXL_CONFIG") or None,
                        help="for a single-file --model: the diffusers checkpoint whose configs and tokenizers it uses "
                             "(env SDXL_CONFIG; default SDXL base 1.0's)")
    parser.add_argument("--lora", action="append", default=None, metavar="FILE[:SCALE]",
                        help="LoRA fused into the weights at load, kohya or diffusers format, scale default 1; "
                             "repeatable (env SDXL_LORA, comma-separated)")
    parser.set_defaults(lora_env=env.get("SDXL_LORA", ""))  # used when no --lora is given
    parser.add_argument("--sizes", default=env.get("SDXL_SIZES"),
                        help="comma-separated WIDTHxHEIGHT sizes to compile, or 'sdxl' for SDXL's nine trained sizes; "
                             "ready once the first is compiled, the others follow in the background (env SDXL_SIZES; "
                             "default 1024x1024, 256x256 for the tiny model)")
    parser.add_argument("--preview-every", default=env.get("SDXL_PREVIEW_EVERY", "auto"), type=preview_every_argument,
                        metavar="N", help="live previews every N denoising steps; 'auto' (default): about four a run; "
                                          "0: none (env SDXL_PREVIEW_EVERY)")
    parser.add_argument("--preview", default=env.get("SDXL_PREVIEW", "approx"),
                        help="how live previews are decoded: 'approx' (a linear latent-to-RGB map, no weights), "
                             "'taesd' (the tiny autoencoder madebyollin/taesdxl, downloaded once) or a local TAESD "
                             "directory in diffusers format (env SDXL_PREVIEW)")
    parser.add_argument("--max-prompt-chunks", type=int,
                        default=int(env.get("SDXL_MAX_PROMPT_CHUNKS", DEFAULT_MAX_CHUNKS)), metavar="N",
                        help=f"the longest prompt, in chunks of 75 tokens as A1111 splits them (default "
                             f"{DEFAULT_MAX_CHUNKS}: 225 tokens); every program has room for N, so no "
                             f"prompt recompiles (env SDXL_MAX_PROMPT_CHUNKS)")
    parser.add_argument("--schedule", default=env.get("SDXL_SCHEDULE") or DEFAULT_SCHEDULE, choices=list(SCHEDULES),
                        help=f"the Schedule type of requests that name none, and the page's default (env "
                             f"SDXL_SCHEDULE; default {DEFAULT_SCHEDULE}: the checkpoint's scheduler config as "
                             f"diffusers runs it; the others are AUTOMATIC1111's)")
    parser.add_argument("--rng", default=env.get("SDXL_RNG") or DEFAULT_RNG, choices=list(RNGS),
                        help=f"where the noise of requests that name none comes from, and the page's default (env "
                             f"SDXL_RNG; default {DEFAULT_RNG}; CPU: PyTorch's CPU generator, as A1111's CPU source "
                             f"and ComfyUI draw it)")
    parser.add_argument("--unet", default=env.get("SDXL_UNET") or None,
                        help="UNet weights file instead of the model's (diffusers names, one .safetensors; local or "
                             "owner/repo/file.safetensors, e.g. SDXL-Lightning's) (env SDXL_UNET)")
    parser.add_argument("--spacing", default=env.get("SDXL_SPACING") or None,
                        choices=["leading", "trailing", "linspace"],
                        help="timestep spacing instead of the scheduler config's (few-step models: trailing) "
                             "(env SDXL_SPACING)")
    parser.add_argument("--prediction-type", default=env.get("SDXL_PREDICTION_TYPE") or None,
                        choices=["epsilon", "sample"],
                        help="what the UNet predicts, instead of the scheduler config's (SDXL-Lightning's 1-step "
                             "UNet: sample) (env SDXL_PREDICTION_TYPE)")
    parser.add_argument("--dtype", default=env.get("SDXL_DTYPE", "bfloat16"), choices=["bfloat16", "float32"],
                        help="parameter and activation dtype (env SDXL_DTYPE)")
    parser.add_argument("--compile-cache", default=env.get("SDXL_TPU_COMPILE_CACHE", str(DEFAULT_COMPILE_CACHE)),
                        help="JAX persistent compilation cache directory (env SDXL_TPU_COMPILE_CACHE)")
    parser.add_argument("--attention", default=env.get("SDXL_TPU_ATTENTION", "auto"), choices=["auto", "xla"],
                        help="attention kernel: auto (best per platform) or xla (env SDXL_TPU_ATTENTION)")
    parser.add_argument("--queue-size", type=int, default=int(env.get("SDXL_QUEUE_SIZE", QUEUE_SIZE)),
                        help="requests that may wait; more are told the server is busy (env SDXL_QUEUE_SIZE)")
    parser.add_argument("--image-format", default=env.get("SDXL_IMAGE_FORMAT", "jpeg"), choices=list(FORMATS),
                        help="format of served images, parameters embedded (env SDXL_IMAGE_FORMAT; jpeg: quality 95, "
                             "fastest; png: lossless)")
    parser.add_argument("--drain-seconds", type=float, default=float(env.get("SDXL_DRAIN_SECONDS", DRAIN_SECONDS)),
                        help="on SIGTERM, how long requests already accepted may take to finish before the "
                             "process exits (env SDXL_DRAIN_SECONDS)")
    parser.add_argument("--metrics", default=env.get("SDXL_METRICS", "public"),
                        help="where GET /metrics (Prometheus) is served: 'public' (on --port), 'off', or "
                             "HOST:PORT for a listener of its own, e.g. 127.0.0.1:9100 (env SDXL_METRICS)")


def preview_every_argument(text: str) -> int | None:
    """--preview-every: 'auto' (None) or a whole number of steps, 0 for none."""
    if text.strip().lower() == "auto":
        return None
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"must be 'auto' or a whole number of steps (0: no previews), got {text!r}")
    return int(text)


def settings_from_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Settings:
    """Settings from what `add_settings_arguments` (plus --host and --port, and the playground's
    own options where given) parsed; a bad value ends the program through `parser.error`."""
    if args.metrics not in ("public", "off"):
        try:
            metrics_address(args.metrics)
        except ValueError as e:
            parser.error(str(e))
    if args.drain_seconds < 0:
        parser.error("--drain-seconds must not be negative")
    if args.queue_size < 1:
        parser.error("--queue-size must be at least 1")
    if not 1 <= args.max_prompt_chunks <= MAX_CHUNKS:
        parser.error(f"--max-prompt-chunks must be from 1 to {MAX_CHUNKS}")
    for option, value, choices in (("--schedule", args.schedule, SCHEDULES), ("--rng", args.rng, RNGS)):
        if value not in choices:  # (from the environment: argparse checks only what is given on the line)
            parser.error(f"{option} must be one of {', '.join(choices)}, got {value!r}")
    recipe = recipe_named(args.preset) if args.preset else None
    if recipe is not None:
        try:
            schedule_input(recipe.sampler, args.schedule)
        except RequestError as e:
            parser.error(f"--schedule {args.schedule} with --preset {recipe.name}: {e}")
    chosen = settle(recipe, model=args.model, unet=args.unet, spacing=args.spacing,
                    prediction_type=args.prediction_type)
    loras = (args.lora or [spec.strip() for spec in args.lora_env.split(",") if spec.strip()]
             or ([chosen["lora"]] if chosen["lora"] else []))  # a preset's LoRA (LCM-LoRA) unless one is given
    if args.sizes is None:  # the tiny model is for trying things out: keep it quick on a CPU
        args.sizes = TINY_DEFAULT_SIZE if chosen["model"] == "tiny" else (recipe and recipe.size) or "1024x1024"
    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as e:
        parser.error(str(e))
    return Settings(model=chosen["model"], sizes=sizes, dtype=args.dtype, host=args.host, port=args.port,
                    compile_cache=args.compile_cache or None, attention=args.attention, queue_size=args.queue_size,
                    image_format=args.image_format, drain_seconds=args.drain_seconds, metrics=args.metrics,
                    unet=chosen["unet"], timestep_spacing=chosen["spacing"], prediction_type=chosen["prediction_type"],
                    config=args.config, loras=loras, recipe=recipe, preview_every=args.preview_every,
                    preview=args.preview, max_prompt_chunks=args.max_prompt_chunks, schedule=args.schedule,
                    rng=args.rng)


def parse_settings(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> Settings:
    """The playground's settings (app.py): the shared ones, where to listen, how long served
    images are kept, and `--backend` (a front end that sends generations to back ends)."""
    env = dict(os.environ if env is None else env)
    parser = argparse.ArgumentParser(description="SDXL playground (Gradio), served from JAX.")
    add_settings_arguments(parser, env)
    parser.add_argument("--host", default=env.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="address to listen on (env GRADIO_SERVER_NAME; 0.0.0.0 on Spaces)")
    parser.add_argument("--port", type=int, default=int(env.get("GRADIO_SERVER_PORT", "7860")),
                        help="port (env GRADIO_SERVER_PORT)")
    parser.add_argument("--keep-images", type=float, default=float(env.get("SDXL_KEEP_IMAGES", 3600)),
                        help="seconds a served image stays downloadable (env SDXL_KEEP_IMAGES)")
    parser.add_argument("--image-cache-mb", type=int, default=int(env.get("SDXL_IMAGE_CACHE_MB", 1024)),
                        help="most disk the served images may take; the oldest go first (env SDXL_IMAGE_CACHE_MB)")
    parser.add_argument("--backend", default=env.get("SDXL_BACKEND") or None,
                        help="URL of back ends (`python -m sdxl_tpu serve`, usually behind a load balancer): the page "
                             "sends each generation there and loads no model; the model options are then the back "
                             "end's and unused here (env SDXL_BACKEND)")
    args = parser.parse_args(argv)
    if args.keep_images <= 0 or args.image_cache_mb < 1:
        parser.error("--keep-images and --image-cache-mb must be positive")
    if args.backend is not None:
        try:
            check_backend_url(args.backend)
        except ValueError as e:
            parser.error(str(e))
    return dataclasses.replace(settings_from_arguments(parser, args), keep_images_seconds=args.keep_images,
                               max_image_bytes=args.image_cache_mb << 20, backend=args.backend)


def metrics_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port) for --metrics."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--metrics must be 'public', 'off' or HOST:PORT (e.g. 127.0.0.1:9100), got {text!r}")
    return host.strip("[]"), int(port)


def model_not_found_message(model: str, reason: str) -> str:
    return (f"Could not load the model {model!r}: {reason}. Check the Hub repo id and your network (or "
            "HF_HUB_OFFLINE and the HF cache), pass a local diffusers-format directory with --model PATH, or run "
            "offline with the built-in tiny checkpoint: python app.py --model tiny")
