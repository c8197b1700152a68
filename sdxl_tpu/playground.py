"""Everything the Gradio playground does besides drawing widgets: settings, styles, input
checks, the warm-up state and the request handler. app.py only builds the UI and wires it."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import queue
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .hub import CheckpointError
from .compilation import DEFAULT_COMPILE_CACHE
from .images import FORMATS, ImageStore, encode_all, encode_preview
from .metrics import Metrics
from .pipeline import Cancelled, GenerationError, Pipeline, call_batch, load_pipeline
from .recipes import BASE, RECIPES, SAMPLING, Recipe, recipe_named, settle
from .remote import Unavailable, check_backend_url
from .request import (MAX_PROMPT_CHARS, MAX_SEED, Request, RequestError, choice_input, format_size, json_type,
                      number_input, parse_size, schedule_input, text_input)
from .prompts import CHUNK_TOKENS, DEFAULT_MAX_CHUNKS, MAX_CHUNKS, chunk_prompt
from .names import DEFAULT_RNG, DEFAULT_SCHEDULE, RNGS, SAMPLERS, SCHEDULES, schedule_used
from .serving import SHUTTING_DOWN, Batcher, Generated, Job, QueueFull, ShuttingDown, StillCompiling, never
from .taesd import PreviewDecoderError

DEFAULT_MODEL = BASE
QUEUE_SIZE = 16
DRAIN_SECONDS = 60.0
TINY_DEFAULT_SIZE = "256x256"

# name -> (prompt template, negative prompt), as the original SDXL playground offered them.
STYLES: dict[str, tuple[str, str]] = {
    "(No style)": ("{prompt}", ""),
    "Cinematic": ("cinematic still {prompt} . emotional, harmonious, vignette, highly detailed, high budget, bokeh, "
                  "cinemascope, moody, epic, gorgeous, film grain, grainy",
                  "anime, cartoon, graphic, text, painting, crayon, graphite, abstract, glitch, deformed, mutated, ugly, "
                  "disfigured"),
    "Photographic": ("cinematic photo {prompt} . 35mm photograph, film, bokeh, professional, 4k, highly detailed",
                     "drawing, painting, crayon, sketch, graphite, impressionist, noisy, blurry, soft, deformed, ugly"),
    "Anime": ("anime artwork {prompt} . anime style, key visual, vibrant, studio anime, highly detailed",
              "photo, deformed, black and white, realism, disfigured, low contrast"),
    "Manga": ("manga style {prompt} . vibrant, high-energy, detailed, iconic, Japanese comic style",
              "ugly, deformed, noisy, blurry, low contrast, realism, photorealistic, Western comic style"),
    "Digital Art": ("concept art {prompt} . digital artwork, illustrative, painterly, matte painting, highly detailed",
                    "photo, photorealistic, realism, ugly"),
    "Pixel art": ("pixel-art {prompt} . low-res, blocky, pixel art style, 8-bit graphics",
                  "sloppy, messy, blurry, noisy, highly detailed, ultra textured, photo, realistic"),
    "Fantasy art": ("ethereal fantasy concept art of {prompt} . magnificent, celestial, ethereal, painterly, epic, "
                    "majestic, magical, fantasy art, cover art, dreamy",
                    "photographic, realistic, realism, 35mm film, dslr, cropped, frame, text, deformed, glitch, noise, "
                    "noisy, off-center, cross-eyed, closed eyes, bad anatomy, ugly, disfigured, sloppy, duplicate, "
                    "mutated, black and white"),
    "Neonpunk": ("neonpunk style {prompt} . cyberpunk, vaporwave, neon, vibes, vibrant, stunningly beautiful, crisp, "
                 "detailed, sleek, ultramodern, magenta highlights, dark purple shadows, high contrast, cinematic, "
                 "ultra detailed, intricate, professional",
                 "painting, drawing, illustration, glitch, deformed, mutated, cross-eyed, ugly, disfigured"),
    "3D Model": ("professional 3d model {prompt} . octane render, highly detailed, volumetric, dramatic lighting",
                 "ugly, deformed, noisy, low poly, blurry, painting"),
}
DEFAULT_STYLE = "(No style)"

EXAMPLES = [
    "A majestic lion jumping from a big stone at night",
    "An astronaut riding a green horse",
    "A red panda reading a book in a cozy library, warm light",
    "A lighthouse on a cliff during a storm, dramatic waves",
]


log = logging.getLogger("sdxl_tpu.playground")


def log_refusal(where: str, error: Exception) -> None:
    """One log line per refused input (never a traceback: a bad client must not flood the log)."""
    log.info("refused input to %s: %s", where, error)


def user_message(error: Exception, where: str) -> str:
    """What the user is told of an error raised by a handler (logged here, once): a RequestError
    is their message; anything else is a bug, logged with its traceback, told without internals."""
    if isinstance(error, RequestError):
        log_refusal(where, error)
        return str(error)
    if isinstance(error, Cancelled):  # the caller has gone (or the server is stopping): nobody to tell
        log.info("%s cancelled: %s", where, error)
        return "The request was cancelled."
    log.error("%s failed", where, exc_info=error)
    return "Something went wrong on the server; it has been logged. Please try again."


def gradio_handler(fn: Callable, where: str, refused: Callable[[str], Any] | None = None) -> Callable:
    """An event handler as Gradio calls it (a function, or a generator that streams updates):
    errors reach the user as `user_message` says, as a gr.Error (an error event for API clients, a
    notice in the page). A generator given `refused` instead ends with `refused(message)` (what
    the page shows of it, e.g. the message in a status line, the other outputs kept) and a notice:
    the page's event does not fail, so a failed one means the server did not take it at all."""
    import gradio as gr

    def error(e: Exception) -> gr.Error:
        return e if isinstance(e, gr.Error) else gr.Error(user_message(e, where), print_exception=False)

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def streaming(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as e:
                failure = error(e)
                if refused is None:
                    raise failure from None
                gr.Warning(failure.message)
                yield refused(failure.message)

        return streaming

    @functools.wraps(fn)
    def handler(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise error(e) from None

    return handler


def style_description(style: Any) -> str:
    """Markdown shown under the style menu: the template and what it adds to the negative prompt."""
    try:
        template, negative = style_entry(style)
    except RequestError as e:
        log_refusal("style description", e)
        return str(e)
    return f"**Prompt template:** `{template}`" + (f"  \n**Adds to the negative prompt:** `{negative}`" if negative else "")


def seed_at(seeds: Any, index: Any) -> int | None:
    """The seed of the gallery image at `index` (from a select event), or None if there is none."""
    if isinstance(index, bool) or not isinstance(index, int) or not isinstance(seeds, list):
        return None
    return seeds[index] if 0 <= index < len(seeds) else None


# ---------------------------------------------------------------------------------------------
# Settings: command line, with environment variables as defaults (for Spaces)
# ---------------------------------------------------------------------------------------------

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
    parser.add_argument("--max-prompt-chunks", type=int, default=int(env.get("SDXL_MAX_PROMPT_CHUNKS", DEFAULT_MAX_CHUNKS)),
                        metavar="N", help=f"the longest prompt, in chunks of 75 tokens as A1111 splits them (default "
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
    parser.add_argument("--spacing", default=env.get("SDXL_SPACING") or None, choices=["leading", "trailing", "linspace"],
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


def serve_metrics_apart(server: Server) -> None:
    """--metrics HOST:PORT: /metrics on a listener of its own (e.g. reachable only in the cluster)."""
    if server.settings.metrics not in ("public", "off"):
        from prometheus_client import start_http_server

        host, port = metrics_address(server.settings.metrics)
        start_http_server(port, addr=host, registry=server.metrics.registry)


def model_not_found_message(model: str, reason: str) -> str:
    return (f"Could not load the model {model!r}: {reason}. Check the Hub repo id and your network (or "
            "HF_HUB_OFFLINE and the HF cache), pass a local diffusers-format directory with --model PATH, or run "
            "offline with the built-in tiny checkpoint: python app.py --model tiny")


# ---------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------

def style_entry(style: Any) -> tuple[str, str]:
    """(prompt template, negative prompt) of a style name as a client sent it."""
    return STYLES[choice_input(style, "Style", list(STYLES))]


def apply_style(style: Any, prompt: str, negative: str) -> tuple[str, str]:
    template, style_negative = style_entry(style)
    return template.replace("{prompt}", prompt), ", ".join(p for p in (style_negative, negative) if p)


# The form's fields, in the order the page and the API send them (the last two may be left out).
FORM_FIELDS = ("prompt", "negative", "style", "seed", "randomize", "guidance", "steps", "size", "sampler", "schedule",
               "rng")


def validate(prompt: Any, negative: Any, style: Any, seed: Any, randomize: Any, guidance: Any, steps: Any,
             size: Any, sampler: Any, sizes: Sequence[tuple[int, int]], samplers: Sequence[str] = SAMPLERS, *,
             schedule: Any = None, rng: Any = None) -> Request:
    """The playground's fields, as a client sent them (JSON values), as one checked Request with
    the style applied. A form has one value per field: lists are refused, not taken per image.
    A sampler of None (an API caller that leaves it out) is the model's default; a schedule or
    rng of None, DEFAULT_SCHEDULE and DEFAULT_RNG."""
    style_entry(style)  # an unknown style is refused before the rest is checked
    if not isinstance(randomize, bool):
        raise RequestError(f"Randomize seed must be true or false, got {json_type(randomize)}.")
    if not (randomize and seed is None):  # a cleared seed field does not matter when the seed is drawn
        number_input(seed, "Seed", 0, MAX_SEED, whole=True)
    request = Request.of(prompt, negative, seed=None if randomize else seed, guidance_scale=guidance, steps=steps,
                         size=size, sizes=sizes, sampler=sampler, samplers=samplers, schedule=schedule, rng=rng,
                         per_image=False)
    # The style wraps what the user typed (their text is what the length limit applies to).
    prompt, negative = apply_style(style, request.prompt, request.negative_prompt)
    return dataclasses.replace(request, prompt=prompt, negative_prompt=negative)


# The longest prompt a server takes from another program (a front end sends the text with its
# style applied): what a user may type plus the longest style's additions.
MAX_STYLED_PROMPT_CHARS = MAX_PROMPT_CHARS + max(max(len(t), len(n) + 2) for t, n in STYLES.values())


@dataclass(frozen=True)
class ModelInfo:
    """What a server offers (the back end's `GET /v1/info`): a front end builds its page from it."""
    model: str
    sizes: list[tuple[int, int]]
    samplers: list[str]
    default_sampler: str
    preset: str | None  # the launch preset (page defaults for steps, sampler, guidance)
    presets: list[str]  # the presets the page offers
    images_per_call: int
    image_format: str
    max_prompt_chunks: int
    schedules: list[str]
    default_schedule: str  # of a request that names none (the page's default)
    rngs: list[str]
    default_rng: str

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "sizes": [format_size(s) for s in self.sizes]}

    @staticmethod
    def from_json(data: Any) -> ModelInfo:
        """A server's description as it came over the network; ValueError names what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"the description must be a JSON object, got {json_type(data)}")
        names = [f.name for f in dataclasses.fields(ModelInfo)]
        missing = [n for n in names if n not in data]
        if missing:
            raise ValueError(f"the description lacks {', '.join(missing)}")

        def names_in(value: Any, known: Sequence[str], what: str) -> list[str]:
            if not isinstance(value, list) or not all(isinstance(v, str) and v in known for v in value):
                raise ValueError(f"{what} must be a list of: {', '.join(known)}")
            return list(value)

        try:
            sizes = [parse_size(v) for v in data["sizes"]] if isinstance(data["sizes"], list) else None
        except RequestError:
            sizes = None
        if not sizes:
            raise ValueError("sizes must be a non-empty list of WIDTHxHEIGHT")
        samplers = names_in(data["samplers"], list(SAMPLERS), "samplers")
        if data["default_sampler"] not in samplers or data["preset"] not in (None, *RECIPES):
            raise ValueError("default_sampler must be one of the samplers, preset null or a known preset")
        schedules = names_in(data["schedules"], list(SCHEDULES), "schedules")
        rngs = names_in(data["rngs"], list(RNGS), "rngs")
        if data["default_schedule"] not in schedules or data["default_rng"] not in rngs:
            raise ValueError("default_schedule must be one of the schedules and default_rng one of the rngs")
        count = data["images_per_call"]
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1024:
            raise ValueError("images_per_call must be a whole number from 1 to 1024")
        if data["image_format"] not in FORMATS or not isinstance(data["model"], str):
            raise ValueError(f"image_format must be one of {', '.join(FORMATS)} and model text")
        chunks = data["max_prompt_chunks"]
        if isinstance(chunks, bool) or not isinstance(chunks, int) or not 1 <= chunks <= MAX_CHUNKS:
            raise ValueError(f"max_prompt_chunks must be a whole number from 1 to {MAX_CHUNKS}")
        return ModelInfo(model=data["model"], sizes=sizes, samplers=samplers, default_sampler=data["default_sampler"],
                         preset=data["preset"], presets=names_in(data["presets"], list(RECIPES), "presets"),
                         images_per_call=count, image_format=data["image_format"], max_prompt_chunks=chunks,
                         schedules=schedules, default_schedule=data["default_schedule"], rngs=rngs,
                         default_rng=data["default_rng"])


def offered_presets(recipe: Recipe | None) -> list[str]:
    """The presets a page offers with launch preset `recipe`: that one when it brought its own
    weights (a distilled model has one way to run), else the sampling presets any SDXL model runs."""
    return [recipe.name] if recipe is not None and recipe.brings_weights else list(SAMPLING)


# ---------------------------------------------------------------------------------------------
# The served model: loaded and warmed up in the background while the page already answers,
# or, for a front end, a back end's
# ---------------------------------------------------------------------------------------------

class Server:
    """Holds the pipeline, its warm-up state ("loading" -> "ready", or "error"; "draining" once
    asked to stop), the batcher that feeds it, and what it counts (`metrics`). With
    `settings.backend` it holds no model: generations go to that back end (sdxl_tpu.remote), and
    everything else (checks, counting, saving, the page) is the same.

    `max_waiting` bounds the batcher's queue (the back end's; the playground's web server has a
    bounded queue of its own)."""

    def __init__(self, settings: Settings, loader: Callable[[Settings], Pipeline] | None = None,
                 images: ImageStore | None = None, max_waiting: int | None = None):
        self.settings = settings
        self.images = images  # where served images are written (app.py: in Gradio's cache folder)
        self.status = "loading"
        self.message = "Loading the model and compiling every size; this page will work once that is done."
        self.error: str | None = None
        self.pipeline: Pipeline | None = None
        self.batcher: Batcher | None = None
        self.remote = None  # sdxl_tpu.remote.Backend, for a front end
        self.info: ModelInfo | None = None  # once loaded (or connected)
        self.max_waiting = max_waiting
        self.tokenizer = None
        self.warmup_seconds: float | None = None
        self.queue_waiting: Callable[[], int] = lambda: 0  # requests waiting in the web server's queue
        self.metrics = Metrics()
        self.metrics.queue_depth.set_function(
            lambda: self.queue_waiting() + (self.batcher.waiting if self.batcher else 0))
        self._loader = loader or self._load
        self.ready_event = threading.Event()
        self.done_event = threading.Event()
        self.compiled_event = threading.Event()  # every size compiled (set at once when they all were at start)

    def image_store(self, folder: Path, on_delete: Callable[[list[str]], None] | None = None) -> ImageStore:
        """A store for this server's images in a folder of its own under `folder`."""
        s = self.settings
        return ImageStore(folder / f"sdxl-{uuid.uuid4().hex[:12]}", fmt=self.image_format,
                          keep_seconds=s.keep_images_seconds, max_bytes=s.max_image_bytes, on_delete=on_delete)

    def _load(self, s: Settings) -> Pipeline:
        """The pipeline, compiled for the first size (the others follow in the background)."""
        pipe = load_pipeline(s.model, dtype=s.dtype, sizes=s.sizes, images_per_call=s.images_per_call,
                             attention=s.attention, unet=s.unet, timestep_spacing=s.timestep_spacing,
                             prediction_type=s.prediction_type, config=s.config, loras=s.loras, preview=s.preview,
                             max_prompt_chunks=s.max_prompt_chunks, warmup=False)
        pipe.warmup(pipe.sizes[:1])
        return pipe

    def load(self) -> None:
        """Load and compile (blocking), or, for a front end, wait (bounded) until the back end
        describes itself. Sets status to "ready" or "error"."""
        start = time.perf_counter()
        try:
            if self.settings.backend is not None:
                self._connect()
            else:
                pipe = self._loader(self.settings)
                self.pipeline, self.tokenizer = pipe, pipe.tokenizers[0]
                self.batcher = Batcher(pipe, on_call=lambda images, result: self._count_call(
                    result.timings if result is not None else None), max_waiting=self.max_waiting,
                    preview_every=self.settings.preview_every)
                self.info = self._describe(pipe)
                if self.compiling:
                    threading.Thread(target=self._compile_the_rest, name="sdxl-compile", daemon=True).start()
        except PreviewDecoderError as e:  # its message says what to do (--preview approx, or a local copy)
            self._fail(str(e))
        except (CheckpointError, OSError, ValueError) as e:
            self._fail(model_not_found_message(self.settings.model, str(e).rstrip(".")) if self.settings.backend is None
                       else f"Could not reach the back end at {self.settings.backend}: {str(e).rstrip('.')}.")
        except Exception as e:  # anything else: still no traceback for the user, but keep it in the log
            traceback.print_exc()
            self._fail(model_not_found_message(self.settings.model, f"{type(e).__name__}: {e}"))
        else:
            self.warmup_seconds = time.perf_counter() - start
            if self.status == "loading":  # (a drain may have begun meanwhile)
                self.status = "ready"
                self.message = (f"Ready ({self.warmup_seconds:.0f} s to load and compile "
                                f"{format_size(self.sizes[0]) if self.compiling else 'every size'})."
                                if self.remote is None else f"Ready: images are made by {self.info.model} on the back ends.")
                self.metrics.ready.set(1)
            self.ready_event.set()
            if not self.compiling:
                self.compiled_event.set()
        finally:
            self.done_event.set()

    def _compile_the_rest(self) -> None:
        """Compile the sizes still missing, one by one (each is offered once compiled)."""
        for size in self.compiling:
            if self.draining:
                return
            start = time.perf_counter()
            try:
                self.pipeline.warmup([size])
            except Exception:  # the sizes compiled so far keep serving
                log.exception("compiling %s failed", format_size(size))
                return
            log.info("compiled %s in %.1f s", format_size(size), time.perf_counter() - start)
        self.compiled_event.set()

    @property
    def compiling(self) -> list[tuple[int, int]]:
        """Offered sizes not compiled yet (in the order they will be)."""
        if self.pipeline is None:
            return []
        return [size for size in self.sizes if not self.pipeline.is_compiled(size)]

    @property
    def ready_sizes(self) -> list[tuple[int, int]]:
        """The sizes a request may ask for now."""
        compiling = self.compiling
        return [size for size in self.sizes if size not in compiling]

    @property
    def status_line(self) -> str:
        """What the page says of the server: its message, and how many sizes are still compiling."""
        compiling = self.compiling if self.ready else []
        if not compiling:
            return self.message
        return (f"{self.message} {len(compiling)} more size{'s' if len(compiling) > 1 else ''} compiling "
                f"({', '.join(format_size(s) for s in compiling)}); they join the size menu when ready.")

    def check_size(self, size: Any) -> None:
        """Refuses a size that is offered but not compiled yet (StillCompiling), before anything else."""
        try:
            wanted = parse_size(size)
        except RequestError:
            return  # the field's own check names the problem
        if wanted in self.compiling:
            raise StillCompiling(f"Size {format_size(wanted)} is still being compiled; it will be available in a "
                                 "moment (the sizes ready now: " + ", ".join(map(format_size, self.ready_sizes)) + ").")

    def _describe(self, pipe: Pipeline) -> ModelInfo:
        recipe = self.settings.recipe
        return ModelInfo(model=pipe.model_name, sizes=list(pipe.sizes), samplers=list(pipe.samplers),
                         default_sampler=recipe.sampler if recipe is not None else pipe.default_sampler,
                         preset=recipe.name if recipe is not None else None, presets=offered_presets(recipe),
                         images_per_call=self.settings.images_per_call, image_format=self.settings.image_format,
                         max_prompt_chunks=pipe.max_prompt_chunks,
                         # (every Schedule type and noise source, unless the pipeline says otherwise)
                         schedules=list(getattr(pipe, "schedules", SCHEDULES)), default_schedule=self.settings.schedule,
                         rngs=list(getattr(pipe, "rngs", RNGS)), default_rng=self.settings.rng)

    def _connect(self) -> None:
        from .remote import Backend

        self.message = f"Connecting to the back end at {self.settings.backend}; this page will work once it answers."
        self.remote = Backend(self.settings.backend)
        self.info = ModelInfo.from_json(self.remote.describe())
        # Token counts need only the model's tokenizer files, which a front end may not reach
        # (a back end's local path, no network): then the page goes without them.
        threading.Thread(target=self._load_tokenizer, name="sdxl-tokenizer", daemon=True).start()

    def _load_tokenizer(self) -> None:
        from .checkpoint import load_tokenizer

        try:  # (a model with another UNet is named "BASE + UNET"; the tokenizer is the base's)
            self.tokenizer = load_tokenizer(self.info.model.split(" + ")[0])
        except Exception as e:  # best effort: the page works without token counts
            log.info("no tokenizer for %s (token counts are not shown): %s", self.info.model, e)

    def _fail(self, message: str) -> None:
        self.status, self.error, self.message = "error", message, message

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.load, name="sdxl-warmup", daemon=True)
        thread.start()
        return thread

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    def readiness(self) -> tuple[dict[str, Any], int]:
        """GET /readyz: the body and status code (200 once warm, 503 while loading or draining), with
        the sizes still compiling."""
        return ({"status": self.status, "message": self.status_line,
                 "compiling": [format_size(s) for s in self.compiling]}, 200 if self.ready else 503)

    @property
    def draining(self) -> bool:
        return self.status == "draining"

    @property
    def concurrency(self) -> int:
        """How many requests run at once: as many as one pipeline call can serve (more than one
        where the host has more chips than a request has images: images are split evenly over the
        chips); a front end, as many as its queue holds (the back ends queue and balance them)."""
        if self.settings.backend is not None:
            return self.settings.queue_size
        import jax

        return max(1, call_batch(self.settings.images_per_call, len(jax.devices())) // self.settings.images_per_call)

    @property
    def sizes(self) -> list[tuple[int, int]]:
        return list(self.info.sizes if self.info else self.settings.sizes)

    @property
    def samplers(self) -> list[str]:
        return list(self.info.samplers if self.info else SAMPLERS)

    @property
    def schedules(self) -> list[str]:
        return list(self.info.schedules if self.info else SCHEDULES)

    @property
    def rngs(self) -> list[str]:
        return list(self.info.rngs if self.info else RNGS)

    @property
    def default_schedule(self) -> str:
        """The Schedule type of a request that names none (the back end's, for a front end)."""
        return self.info.default_schedule if self.info is not None else self.settings.schedule

    @property
    def default_rng(self) -> str:
        """The noise source of a request that names none (the back end's, for a front end)."""
        return self.info.default_rng if self.info is not None else self.settings.rng

    @property
    def image_format(self) -> str:
        return self.info.image_format if self.info else self.settings.image_format

    @property
    def recipe(self) -> Recipe | None:
        """The launch preset (the back end's, for a front end)."""
        if self.info is not None:
            return RECIPES[self.info.preset] if self.info.preset else None
        return self.settings.recipe

    @property
    def default_sampler(self) -> str:
        """The launch preset's sampler, else the model's own (until it is loaded: SDXL base's, Euler)."""
        if self.info is not None:
            return self.info.default_sampler
        return self.settings.recipe.sampler if self.settings.recipe is not None else "Euler"

    @property
    def presets(self) -> list[Recipe]:
        """The presets the page offers (see `offered_presets`)."""
        return [RECIPES[name] for name in (self.info.presets if self.info else offered_presets(self.settings.recipe))]

    def token_count(self, prompt: Any, style: Any = DEFAULT_STYLE) -> str:
        """Markdown: how many of the encoder's tokens the prompt takes with the style's template
        applied (as it will be encoded; start and end tokens not counted, as A1111 counts), and a
        warning when it will be cut or is too long to be accepted."""
        try:
            text = text_input(prompt, "Prompt")
            template = style_entry(style)[0]
        except RequestError as e:
            log_refusal("token count", e)
            return f"⚠️ {e}"
        chunks = self.info.max_prompt_chunks if self.info is not None else self.settings.max_prompt_chunks
        limit = CHUNK_TOKENS * chunks
        if not text:
            return f"0 / {limit} tokens"
        if self.tokenizer is None:
            return ("No token count here (the front end has no tokenizer for this model)." if self.remote is not None
                    else "Token count available once the model is loaded.")
        try:
            encoded = chunk_prompt(self.tokenizer, template.replace("{prompt}", text), chunks)
        except Exception as e:  # (a tokenizer's surprise must not break typing)
            log_refusal("token count", e)
            return "No token count for this text."
        used = f"{encoded.count} chunk{'s' if encoded.count > 1 else ''}"
        if encoded.cut:
            return (f"⚠️ **{encoded.tokens + encoded.cut} / {limit} tokens**, {used}: the prompt will be cut after "
                    f"token {limit}; the last {encoded.cut} are ignored.")
        return f"{encoded.tokens} / {limit} tokens" + (f", {used}" if encoded.count > 1 else "")

    # -- requests -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def counted(self, queued_at: float) -> Iterator[None]:
        """Counts the request run inside in `metrics` by outcome (and, when it succeeds, the
        seconds since `queued_at`, time.monotonic() when it arrived)."""
        outcome = "failed"
        try:
            yield
            outcome = "ok"
            self.metrics.request_seconds.observe(time.monotonic() - queued_at)
        except QueueFull:
            outcome = "queue_full"
            raise
        except ShuttingDown:
            outcome = "draining"
            raise
        except Unavailable:  # no back end could serve it: the user is told, but it is no user error
            raise
        except RequestError:
            outcome = "user_error"
            raise
        except (Cancelled, GeneratorExit):  # (GeneratorExit: a page's stream closed by the web server)
            outcome = "cancelled"
            raise
        finally:
            self.metrics.count(outcome)

    def stream(self, fields: Sequence[Any], abandoned: Callable[[], bool] | None = None,
               queued_at: float | None = None, previews: bool = True) -> Iterator[tuple]:
        """One /generate call, from the form's fields as the client sent them (see `validate_form`),
        as what the page shows while it runs, in order:
            ("progress", step, steps)            after each denoising step
            ("preview", [(path, caption)])       live previews of the four images (if `previews`)
            ("done", [(path, caption)], seeds, info markdown, the sampler used)
        Counted in `metrics` by outcome. `queued_at` (time.monotonic()) is when the request joined
        the queue; `abandoned()` says whether its caller has gone (so does closing the stream)."""
        closed = threading.Event()
        gone = lambda: closed.is_set() or (abandoned is not None and bool(abandoned()))
        with self.counted(time.monotonic() if queued_at is None else queued_at):
            try:
                request = self.validate_form(fields)
                yield from self._updates(request, gone, previews)
            except GeneratorExit:
                closed.set()
                raise

    def validate_form(self, fields: Sequence[Any]) -> Request:
        """The form's fields as a client sent them (FORM_FIELDS' order; without a schedule or rng,
        or with null, this server's defaults) as a checked Request (see `validate`), its Schedule
        type checked with the sampler that will run it (the model's own where none is named)."""
        values = dict(zip(FORM_FIELDS, fields))
        self.check_size(values.get("size"))
        schedule, rng = values.pop("schedule", None), values.pop("rng", None)
        request = validate(**values, sizes=self.sizes, samplers=self.samplers,
                           schedule=self.default_schedule if schedule is None else schedule,
                           rng=self.default_rng if rng is None else rng)
        if request.sampler is None:
            schedule_input(self.pipeline.default_sampler if self.pipeline is not None else self.default_sampler,
                           request.schedule)
        return request

    def generate(self, request: Request, progress: Callable[[int, int], None] | None = None,
                 abandoned: Callable[[], bool] | None = None):
        """A checked request's images, without previews: ([(path, caption)], seeds, info markdown).
        Raises RequestError for the user, Cancelled when `abandoned()` turned true first."""
        for update in self._updates(request, abandoned or never, previews=False):
            if update[0] == "progress" and progress is not None:
                progress(*update[1:])
        return update[1:4]

    def _updates(self, request: Request, gone: Callable[[], bool], previews: bool) -> Iterator[tuple]:
        """`stream`'s updates for a checked request: the work runs on the batcher's thread (or a
        back end's), and what it reports is handed over in the caller's thread, where the web
        framework's progress display has its context."""
        events: queue.SimpleQueue = queue.SimpleQueue()
        put_progress = lambda step, steps: events.put(("progress", step, steps))
        put_preview = (lambda step, steps, images: events.put(("preview", step, steps, images))) if previews else None
        if self.remote is not None:
            def ask_the_back_end() -> None:
                try:
                    events.put(("made", self.remote.generate(request, progress=put_progress, abandoned=gone,
                                                             image_format=self.image_format, preview=put_preview)))
                except BaseException as e:  # handed to the caller, raised there
                    events.put(("error", e))

            threading.Thread(target=ask_the_back_end, name="sdxl-remote", daemon=True).start()
        else:
            job = self.enqueue(request, progress=put_progress, abandoned=gone, preview=put_preview,
                               on_done=lambda: events.put(("job",)))
        while True:  # every job ends (done, failed or cancelled), and says so
            kind, *args = events.get()
            if kind == "progress":
                yield ("progress", *args)
            elif kind == "preview":
                yield ("preview", self._preview_gallery(request, *args))
            elif kind == "error":
                raise args[0]
            else:
                made = self.finish(job) if kind == "job" else args[0]
                if kind == "made":
                    self._count_call(made.timings)
                break
        yield ("done", *self._gallery(request, made), made.sampler)

    def _store(self) -> ImageStore:
        if self.images is None:  # (app.py gives the store in Gradio's cache folder, where it serves from)
            self.images = self.image_store(Path(tempfile.gettempdir()))
        return self.images

    def _preview_gallery(self, request: Request, step: int, steps: int, images) -> list[tuple[str, str]]:
        """Previews (uint8 arrays, or JPEG files from a back end) as small files in the store."""
        files = [image if isinstance(image, bytes) else encode_preview(image) for image in images]
        paths = self._store().write(files, range(len(files)), name="preview", extension="jpg")
        return [(path, f"preview · step {step} / {steps}") for path in paths]

    def _gallery(self, request: Request, made: Generated) -> tuple[list[tuple[str, str]], list[int], str]:
        # Written once, as encoded with their parameters, where Gradio serves them from (no copy).
        start = time.perf_counter()
        paths = self._store().write(made.files, made.seeds)
        saving = made.timings.get("encoding", 0.0) + time.perf_counter() - start
        self.count_images(len(paths), saving)
        gallery = [(path, f"seed {seed}") for path, seed in zip(paths, made.seeds)]
        t = made.timings
        info = (f"Generated {len(paths)} images of {format_size(request.size)} in {t['total']:.2f} s "
                f"(text {t['text_encoding']:.2f} s, denoising {t['denoising']:.2f} s for {request.steps} steps of "
                f"{made.sampler} (Schedule type {made.schedule}, RNG {made.rng}), "
                f"decoding {t['decoding']:.2f} s; {saving:.2f} s to save). "
                f"Seeds: {', '.join(str(s) for s in made.seeds)}.")
        return gallery, made.seeds, info

    def enqueue(self, request: Request, progress: Callable[[int, int], None] | None = None,
                abandoned: Callable[[], bool] | None = None, on_done: Callable[[], None] | None = None,
                preview: Callable[[int, int, Any], None] | None = None) -> Job:
        """The request, accepted for the pipeline (see Batcher.enqueue); `finish` it once done."""
        if self.batcher is None:
            raise RequestError(self.error or "The model is still warming up; please try again in a moment.")
        return self.batcher.enqueue(request.images(self.settings.images_per_call), progress=progress,
                                    abandoned=abandoned or never, on_done=on_done, preview=preview)

    def finish(self, job: Job) -> Generated:
        """A finished job's images, encoded in the server's format with their parameters (or what
        stopped them, raised)."""
        try:
            result = job.outcome()
        except GenerationError as e:
            raise RequestError(str(e)) from None
        start = time.perf_counter()
        parameters = [info.parameters_text(self.pipeline.stamp) for info in result.infos]
        files = encode_all(result.images, parameters, self.settings.image_format)
        first = result.infos[0]  # (one request's images: one sampler, schedule and noise source)
        return Generated(files, parameters, result.seeds, first.sampler,
                         dict(result.timings, encoding=time.perf_counter() - start),
                         schedule=schedule_used(first.sampler, first.schedule), rng=first.rng)

    def count_images(self, images: int, saving_seconds: float) -> None:
        """Images handed to a caller, and the seconds it took to encode (and write) them."""
        self.metrics.stage_seconds.labels("saving").observe(saving_seconds)
        self.metrics.images.inc(images)

    def _count_call(self, timings: dict[str, float] | None) -> None:
        self.metrics.calls.inc()
        if timings is not None:
            for stage in ("text_encoding", "denoising", "decoding"):
                self.metrics.stage_seconds.labels(stage).observe(timings[stage])

    # -- stopping -------------------------------------------------------------------------------

    def drain(self, busy: Callable[[], bool] = lambda: False, seconds: float | None = None,
              poll: float = 0.05) -> bool:
        """Stop taking requests and let those accepted finish: not ready at once (status
        "draining"), then wait until neither `busy()` (the web server's queue) nor the batcher
        has work, for at most `seconds` (default: settings.drain_seconds). What is still running
        then is cancelled. Returns whether everything finished."""
        self.status, self.message = "draining", SHUTTING_DOWN
        self.metrics.ready.set(0)
        log.info("draining: finishing the requests already accepted (at most %.0f s)",
                 self.settings.drain_seconds if seconds is None else seconds)
        deadline = time.monotonic() + (self.settings.drain_seconds if seconds is None else seconds)
        working = lambda: busy() or (self.batcher is not None and self.batcher.busy)
        while working() and time.monotonic() < deadline:
            time.sleep(poll)
        finished = not working()
        if self.batcher is not None:
            self.batcher.close(stop_running=not finished)
            self.batcher.join(timeout=30)
        log.info("drained" if finished else "drain deadline passed: the requests still running were cancelled")
        return finished
