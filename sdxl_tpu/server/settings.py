"""The server's settings, shared by the playground (app.py) and the back end (`python -m sdxl_tpu
serve`): what options.py's table parsed (environment variables as defaults, for Spaces and
containers), checked and settled against the preset."""

from __future__ import annotations

import argparse
import dataclasses
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..request.errors import RequestError
from ..request.load import LoadOptions
from ..request.names import DEFAULT_RNG, DEFAULT_SCHEDULE
from ..cli.options import default_of, load_values
from ..cli.parsing import add_options, fill_defaults
from ..a1111.prompts import MAX_CHUNKS
from ..request.recipes import Recipe, recipe_named
from ..request.values import format_size, parse_size, schedule_input

TINY_DEFAULT_SIZE = "256x256"


@dataclass
class Settings:
    load: LoadOptions = field(default_factory=LoadOptions)  # what the model is and how it is compiled
    host: str = default_of("--host", "app")
    port: int = default_of("--port", "app")
    compile_cache: str | None = default_of("--compile-cache")
    queue_size: int = default_of("--queue-size")
    image_format: str = default_of("--image-format")
    keep_images_seconds: float = default_of("--keep-images", "app")
    max_image_bytes: int = default_of("--image-cache-mb", "app") << 20
    drain_seconds: float = default_of("--drain-seconds")
    metrics: str = default_of("--metrics")
    recipe: Recipe | None = None  # the launch preset: the page's defaults for steps, guidance, sampler
    preview_every: int | None = None  # steps between live previews (None: about four a run; 0: none)
    backend: str | None = None  # a front end's back-end URL: generations are sent there, no model is loaded
    schedule: str = DEFAULT_SCHEDULE  # the Schedule type of a request that names none (the page's default)
    rng: str = DEFAULT_RNG  # the noise source of a request that names none (the page's default)
    api_key: str | None = None  # required on the other tools' APIs when set (tool_apis.py)
    mcp: bool = False  # /generate also an MCP tool (the app)
    wildcards: str | None = None  # the folder of wildcard files (__name__ in a prompt)


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


def settings_from_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace,
                            command: str = "serve") -> Settings:
    """Settings from what `add_options(parser, command)` ("serve" or "app") parsed and `fill_defaults`
    completed; a bad value ends the program through `parser.error`."""
    if args.metrics not in ("public", "off"):
        try:
            metrics_address(args.metrics)
        except ValueError as e:
            parser.error(str(e))
    if args.drain_seconds < 0:
        parser.error("--drain-seconds must not be negative")
    if args.queue_size < 1:
        parser.error("--queue-size must be at least 1")
    if args.wildcards and not os.path.isdir(args.wildcards):
        parser.error(f"--wildcards must be a folder of wildcard files (text, an option a line), got {args.wildcards!r}")
    if args.embeddings and not os.path.isdir(args.embeddings):
        parser.error(f"--embeddings must be a folder of embedding files (.safetensors), got {args.embeddings!r}")
    if args.upscalers and not os.path.isdir(args.upscalers):
        parser.error(f"--upscalers must be a folder of upscaler models (.pth, .safetensors), got {args.upscalers!r}")
    if not 1 <= args.max_prompt_chunks <= MAX_CHUNKS:
        parser.error(f"--max-prompt-chunks must be from 1 to {MAX_CHUNKS}")
    recipe = recipe_named(args.preset) if args.preset else None
    if recipe is not None:
        try:
            schedule_input(recipe.sampler, args.schedule)
        except RequestError as e:
            parser.error(f"--schedule {args.schedule} with --preset {recipe.name}: {e}")
    load = LoadOptions.of(load_values(args, command), recipe)
    if args.sizes is None:  # the tiny model is for trying things out: keep it quick on a CPU
        args.sizes = TINY_DEFAULT_SIZE if load.model == "tiny" else (recipe and recipe.size) or "1024x1024"
    try:
        load = load.replace(sizes=parse_sizes(args.sizes))
        if args.network_sizes:
            load = load.replace(network_sizes=parse_sizes(args.network_sizes))
    except ValueError as e:
        parser.error(str(e))
    if missing := [size for size in load.network_sizes or () if size not in load.sizes]:
        parser.error(f"--network-sizes {format_size(missing[0])} is not one of --sizes "
                     f"({', '.join(map(format_size, load.sizes))})")
    return Settings(load=load, host=args.host, port=args.port, compile_cache=args.compile_cache or None,
                    queue_size=args.queue_size, image_format=args.image_format, drain_seconds=args.drain_seconds,
                    metrics=args.metrics, recipe=recipe, preview_every=args.preview_every, schedule=args.schedule,
                    rng=args.rng, api_key=args.api_key or None, wildcards=args.wildcards or None)


def parse_settings(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """The playground's settings (app.py): the shared ones, where to listen, how long served
    images are kept, and `--backend` (a front end that sends generations to back ends)."""
    parser = argparse.ArgumentParser(description="SDXL playground (Gradio), served from JAX.")
    add_options(parser, "app")
    environ: Mapping[str, str] = os.environ if env is None else env
    args = fill_defaults(parser, parser.parse_args(argv), "app", environ)
    if args.keep_images <= 0 or args.image_cache_mb < 1:
        parser.error("--keep-images and --image-cache-mb must be positive")
    if args.backend is not None:
        try:
            check_backend_url(args.backend)
        except ValueError as e:
            parser.error(str(e))
    return dataclasses.replace(settings_from_arguments(parser, args, "app"), keep_images_seconds=args.keep_images,
                               max_image_bytes=args.image_cache_mb << 20, backend=args.backend,
                               mcp=args.mcp == "on" or args.mcp == "auto" and bool(environ.get("SPACE_ID")))


def check_backend_url(url: str) -> str:
    """An http(s) URL with a host and nothing after the path, without a trailing slash."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"--backend must be an http:// or https:// URL of the back ends (e.g. http://127.0.0.1:8080), "
                         f"got {url!r}")
    return url.rstrip("/")


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
