"""Every command-line option of the app, `serve`, `generate`, `bench` and `make-tiny`, in one
table: flag, environment variable, default, choices, help. Parsers are built from it (parsing.py)
and docs/options.md's option table is written from it (`python -m sdxl_tpu.cli.options_table`), so
they cannot drift.

The command line wins; then another source where a command has one (`generate`'s --parameters); then
the environment variable (in every command that takes the option); then the default. JAX-free.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..imaging import hires
from ..a1111.images import FORMATS
from ..imaging.mask import (DEFAULT_MASK_BLUR, DEFAULT_MASK_PADDING, DEFAULT_MASKED_CONTENT, INPAINT_AREAS,
                            MASKED_CONTENT)
from ..request.names import (ARCHITECTURES, DEFAULT_RESIZE_MODE, DEFAULT_RNG, DEFAULT_SCHEDULE, RESIZE_MODES, RNGS,
                             SAMPLERS, SCHEDULES)
from ..a1111.prompts import DEFAULT_MAX_CHUNKS
from ..a1111.xyz_axes import AXIS_TYPES
from ..request.fields import FIELD
from ..request.recipes import RECIPES

COMMANDS = ("app", "serve", "generate", "bench", "make-tiny")
SERVERS = ("app", "serve")
MODEL = ("app", "serve", "generate", "bench")  # the commands that load a model
RUN = ("generate", "bench")  # the commands that make one call themselves

# JAX's persistent compilation cache (a restart reuses compiled programs).
DEFAULT_COMPILE_CACHE = str(Path.home() / ".cache" / "sdxl_tpu" / "jax")
DTYPES, SPACINGS = ("bfloat16", "float32"), ("leading", "trailing", "linspace")


def preview_every(text: str) -> int | None:  # (--preview-every: 'auto', None, or steps, 0 for none)
    if text.strip().lower() != "auto" and not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"must be 'auto' or a whole number of steps (0: no previews), got {text!r}")
    return None if text.strip().lower() == "auto" else int(text)


@dataclass(frozen=True)
class Option:
    flag: str  # "--model", or a positional argument's name
    commands: tuple[str, ...]
    help: str
    env: str | None = None
    default: Any = None  # when neither the command line nor the environment gives one
    shown_default: str | None = None  # how the default reads, where None stands for something (e.g. "the preset's")
    choices: Sequence[str] | None = None
    type: Callable[[str], Any] = str
    metavar: str | None = None
    action: str | None = None  # "append" (the environment variable: comma-separated), "store_true", "store_false"
    dest: str | None = None
    loads: str | None = None  # the LoadOptions field it fills (what to load: load.py)

    @property
    def name(self) -> str:
        return self.dest or self.flag.lstrip("-").replace("-", "_")

    @property
    def positional(self) -> bool:
        return not self.flag.startswith("-")

    @property
    def switch(self) -> bool:
        return self.action in ("store_true", "store_false")

    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if self.switch:
            return "off"
        return "none" if self.default in (None, []) else "empty" if self.default == "" else str(self.default)


def option(flag, commands, help, **kw) -> Option:  # noqa: A002 (argparse's word)
    return Option(flag, tuple(commands), help, **kw)


OPTIONS: tuple[Option, ...] = (
    # --- what is generated (generate; the page's form for the servers) ---
    option("prompt", ["generate"], "the prompt (or from --parameters)", default="", metavar="PROMPT"),
    option("--parameters", ["generate"],
           "an AUTOMATIC1111 parameters text (as its PNG Info shows it, or as our images carry it): prompt, negative "
           "prompt, steps, sampler, Schedule type, CFG scale, seed, size and RNG; options given explicitly win; what "
           "it says that is not used is listed", metavar="TEXT"),
    option("--negative", ["generate"], "negative prompt", default=""),
    option("--seed", ["generate"], "base seed (-1: random); image i gets seed + i", type=int, shown_default="random"),
    option("--steps", RUN, "denoising steps", type=int, shown_default="20, or the preset's"),
    option("--guidance", RUN, "guidance scale; <= 1 runs the conditional pass alone (half the UNet batch)", type=float,
           shown_default="5, or the preset's"),
    option("--sampler", RUN, "the sampler, by AUTOMATIC1111's name", choices=list(SAMPLERS), metavar="SAMPLER",
           shown_default="the checkpoint's scheduler, or the preset's"),
    option("--schedule", [*SERVERS, "generate"],
           "Schedule type (for the servers: of requests that name none, and the page's default); "
           f"{DEFAULT_SCHEDULE}: the checkpoint's scheduler config as diffusers runs it; Automatic: each sampler's "
           "AUTOMATIC1111 default; the others are AUTOMATIC1111's", env="SDXL_SCHEDULE", default=DEFAULT_SCHEDULE,
           choices=list(SCHEDULES), metavar="SCHEDULE"),
    option("--rng", [*SERVERS, "generate"],
           "where the noise comes from (for the servers: of requests that name none, and the page's default); CPU: "
           "PyTorch's CPU generator per image seed, as AUTOMATIC1111's RNG CPU and ComfyUI draw it", env="SDXL_RNG",
           default=DEFAULT_RNG, choices=list(RNGS)),
    option("--dynamic-prompts", ["generate"], "how {a|b}, {2$$a|b|c} and __wildcard__ in the prompts are read "
           "(sd-dynamic-prompts'): Random, each image its own draw from its seed; Combinatorial, the combinations "
           "in order; Off, as written", default=FIELD["dynamic_prompts"].default,
           choices=FIELD["dynamic_prompts"].names, metavar="MODE"),
    option("--wildcards", [*SERVERS, "generate"], "folder of wildcard files: __name__ in a prompt is a random line of "
           "the file of that name (.txt; __dir/name__ in a subfolder); requests name files in it, never paths (a "
           "front end: the back end's folder is used)", env="SDXL_WILDCARDS", metavar="DIR", shown_default="none"),
    option("--size", RUN, "WIDTHxHEIGHT", shown_default="1024x1024, or the preset's (bench: the architecture's)"),
    option("--images", RUN, "images in one call (the compiled batch is rounded up to the device count)", type=int,
           default=4, loads="images_per_call"),
    option("--image", ["generate"], "start from this image (img2img): a PNG, JPEG or WebP file, fitted to --size by "
           "--resize-mode", metavar="FILE"),
    option("--strength", ["generate"], "denoising strength from --image, 0-1: how much of it is redrawn",
           type=float, shown_default="0.75 with --image"),
    option("--resize-mode", ["generate"], "how --image is fitted to --size (AUTOMATIC1111's resize modes)",
           default=DEFAULT_RESIZE_MODE, choices=list(RESIZE_MODES), metavar="MODE"),
    option("--mask", ["generate"], "repaint only where this mask (the size of --image) is white (inpainting); "
           "black keeps --image's pixels", metavar="FILE"),
    option("--mask-blur", ["generate"], "pixels the mask's edge is blurred by", type=int, metavar="PIXELS",
           shown_default=f"{DEFAULT_MASK_BLUR} with --mask"),
    option("--masked-content", ["generate"], "what the masked area starts from (AUTOMATIC1111's)",
           choices=list(MASKED_CONTENT), metavar="CONTENT", shown_default=f"{DEFAULT_MASKED_CONTENT} with --mask"),
    option("--inpaint-area", ["generate"], "Only masked: the mask's region redrawn at --size, pasted back into --image",
           choices=list(INPAINT_AREAS), metavar="AREA", shown_default=INPAINT_AREAS[0]),
    option("--mask-padding", ["generate"], "Only masked: pixels around the mask's region", type=int, metavar="PIXELS",
           shown_default=f"{DEFAULT_MASK_PADDING} with Only masked"),
    option("--hires", ["generate"], "hires fix (AUTOMATIC1111's): make the images at --size, upscale them by "
           "--hires-scale, denoise again at the larger size", action="store_true"),
    option("--hires-scale", ["generate"], "the hires fix's upscale", type=float, metavar="FACTOR",
           shown_default=f"{hires.DEFAULT_SCALE:g} with --hires"),
    option("--hires-upscaler", ["generate"], "how the hires fix upscales: the latents, the pixels, or the pixels "
           f"with an upscaler model of --upscalers, by name (A1111's: {', '.join(hires.UPSCALERS)}, R-ESRGAN 4x+, ...)",
           metavar="UPSCALER", shown_default=f"{hires.DEFAULT_UPSCALER} with --hires"),
    option("--hires-steps", ["generate"], "the hires pass's steps (0: as many as --steps)", type=int, metavar="N",
           shown_default="0 with --hires"),
    option("--hires-strength", ["generate"], "the hires pass's denoising strength, 0-1", type=float, metavar="STRENGTH",
           shown_default=f"{hires.DEFAULT_STRENGTH:g} with --hires"),
    # (A ControlNet unit, its options named as the page's fields, with their defaults and limits.)
    option("--controlnet", ["generate"], "ControlNet to load for --control-image: a diffusers-format folder or one "
           ".safetensors in diffusers' names; repeatable (--control-model picks one)", action="append",
           metavar="PATH", default=[], shown_default="none", loads="controlnets"),
    option("--control-image", ["generate"], "guide the images with this image through --controlnet (edges, a depth "
           "map, a pose...): a PNG, JPEG or WebP file, fitted to --size by Crop and resize", metavar="FILE"),
    option("--control-model", ["generate"], "which --controlnet, by its folder's or file's name", metavar="NAME",
           shown_default="the first"),
    option("--control-module", ["generate"], "what --control-image becomes first (sd-webui-controlnet's "
           "preprocessors)", default=FIELD["control_module"].default, choices=FIELD["control_module"].names),
    *(option(f"--{name.replace('_', '-')}", ["generate"], f"{help}, {FIELD[name].bounds[0]:g} to "
             f"{FIELD[name].bounds[1]:g}", type=int if FIELD[name].kind == "whole" else float,
             default=FIELD[name].default, metavar=metavar)
      for name, help, metavar in (("control_weight", "how strongly the ControlNet steers", "WEIGHT"),
                                  ("control_start", "from which fraction of the steps it acts", "FRACTION"),
                                  ("control_end", "until which fraction of the steps it acts", "FRACTION"),
                                  ("control_low", "canny's low threshold", "N"),
                                  ("control_high", "canny's high threshold", "N"))),
    option("--out", ["generate"], "where the PNGs are written", default="outputs"),
    # --- generate's X/Y/Z plot (AUTOMATIC1111's script: cli/xyz.py) ---
    option("--x-type", ["generate"], "make an X/Y/Z plot: what its X axis varies, by AUTOMATIC1111's label ("
           + ", ".join(t.label for t in AXIS_TYPES[1:]) + ")", metavar="TYPE"),
    option("--x-values", ["generate"], "the X axis's values in AUTOMATIC1111's syntax: comma-separated (\"quoted, "
           "with commas\"), ranges 1-5, 1-10 (+2), 10-1 (-3), 5-20 [4], 1.5-3 (+0.5)", metavar="VALUES"),
    *(option(f"--{n}-{what}", ["generate"], f"the plot's {n.upper()} axis: as --x-{what}", metavar=what.upper())
      for n in "yz" for what in ("type", "values")),
    option("--no-legend", ["generate"], "the plot's grid without its labels", action="store_false", dest="draw_legend"),
    option("--sub-grids", ["generate"], "with a Z axis, also each Z value's grid, each a file", action="store_true"),
    option("--margin-size", ["generate"], "pixels between the grid's cells", type=int, default=0, metavar="PIXELS"),
    # --- the model ---
    option("--preset", [*SERVERS, "generate"],
           "settings that go together (weights, sampler, spacing, steps, guidance, size), e.g. 'Lightning 4-step' or "
           "'Turbo'; options given explicitly win", env="SDXL_PRESET", choices=list(RECIPES), metavar="PRESET"),
    option("--preset", ["bench"],
           "one of the app's presets (" + ", ".join(RECIPES) + "): its weights, sampler, steps, guidance and size; "
           "options given explicitly win (an architecture's name here, the older spelling, is --architecture)",
           choices=[*RECIPES, *ARCHITECTURES], metavar="PRESET"),
    option("--architecture", ["bench", "make-tiny"],
           "tiny (a few MB), small (SDXL's block structure, narrower: CPU benchmarks) or sdxl (SDXL base 1.0's; "
           "about 14 GB as a checkpoint); bench: of --random-weights, and without --model the checkpoint it loads "
           "(tiny: the built-in one, else SDXL base 1.0)", default="tiny", choices=ARCHITECTURES),
    option("--model", MODEL,
           "Hub repo id, local diffusers directory, single-file .safetensors (A1111/ComfyUI layout, local or "
           "owner/repo/file.safetensors), or 'tiny'", env="SDXL_MODEL",
           shown_default="SDXL base 1.0, or the preset's", loads="model"),
    option("--random-weights", ["bench"], "random weights of the architecture (nothing is loaded)",
           action="store_true"),
    option("--config", MODEL,
           "for a single-file --model: the diffusers checkpoint (Hub id or directory) whose configs and tokenizers it "
           "uses; only those small files are fetched", env="SDXL_CONFIG", shown_default="SDXL base 1.0's",
           loads="config"),
    option("--unet", MODEL,
           "UNet weights file instead of the model's (diffusers or single-file layout, one .safetensors; local or "
           "owner/repo/file.safetensors, e.g. SDXL-Lightning's)", env="SDXL_UNET", loads="unet"),
    option("--lora", MODEL, "LoRA fused into the weights at load, kohya or diffusers format, scale default 1; "
           "repeatable (environment: comma-separated)", env="SDXL_LORA", action="append", metavar="FILE[:SCALE]",
           default=[], shown_default="none, or the preset's", loads="loras"),
    option("--embeddings", [*SERVERS, "generate"], "folder of textual inversion embeddings (SDXL's .safetensors with "
           "clip_l and clip_g, as AUTOMATIC1111's embeddings folder): a prompt names one by its file's name; a file "
           "that does not fit the model is skipped and listed (a front end: the back end's)", env="SDXL_EMBEDDINGS",
           metavar="DIR", shown_default="none", loads="embeddings"),
    option("--upscalers", [*SERVERS, "generate"], "folder of upscaler models for the hires fix and Extras "
           "(ESRGAN's and Real-ESRGAN's .pth or .safetensors, as AUTOMATIC1111's ESRGAN and RealESRGAN folders), "
           "each named as A1111 names it (RealESRGAN_x4plus: R-ESRGAN 4x+; another file: its name); a file that "
           "is not one is skipped and logged", env="SDXL_UPSCALERS", metavar="DIR", shown_default="none",
           loads="upscalers"),
    option("--controlnet", SERVERS, "ControlNet a request may use (sd-webui-controlnet's units, by this name: the "
           "folder's or file's): a diffusers-format folder or one .safetensors in diffusers' names; repeatable "
           "(environment: comma-separated)", env="SDXL_CONTROLNET", action="append", metavar="PATH", default=[],
           shown_default="none", loads="controlnets"),
    option("--refiner", [*SERVERS, "generate"], "SDXL refiner (folder, Hub id)", env="SDXL_REFINER", loads="refiner"),
    option("--refiner-switch-at", ["generate"], "where --refiner takes over: a fraction of the timesteps, 0-1",
           type=float, metavar="FRACTION", shown_default="0.8 with --refiner"),
    option("--ip-adapter", [*SERVERS, "generate"], "IP-Adapter for SDXL (an image as a prompt: ip-adapter_sdxl, "
           "ip-adapter-plus_sdxl_vit-h, ... as .safetensors or .bin) a ControlNet unit may name by its file's name, "
           "as sd-webui-controlnet's; needs --image-encoder", env="SDXL_IP_ADAPTER", metavar="FILE",
           shown_default="none", loads="ip_adapter"),
    option("--image-encoder", [*SERVERS, "generate"], "the CLIP image encoder --ip-adapter was trained with: a "
           "transformers folder (config.json, model.safetensors), h94/IP-Adapter's sdxl_models/image_encoder "
           "(ViT-bigG) for ip-adapter_sdxl, models/image_encoder (ViT-H) for the vit-h ones",
           env="SDXL_IMAGE_ENCODER", metavar="DIR", shown_default="none", loads="image_encoder"),
    option("--spacing", MODEL, "timestep spacing instead of the scheduler config's (few-step models: trailing)",
           env="SDXL_SPACING", choices=SPACINGS, loads="timestep_spacing"),
    option("--prediction-type", MODEL, "what the UNet predicts, instead of the scheduler config's (SDXL-Lightning's "
           "1-step UNet: sample)", env="SDXL_PREDICTION_TYPE", choices=("epsilon", "sample"),
           loads="prediction_type"),
    option("--dtype", MODEL, "parameter and activation dtype", env="SDXL_DTYPE", default="bfloat16", choices=DTYPES,
           loads="dtype"),
    option("--compute-dtype", ["bench"], "activation dtype", choices=DTYPES,
           shown_default="--dtype, but float32 on a CPU", loads="compute_dtype"),
    option("--attention", MODEL, "attention kernel: auto (the best per platform) or xla", env="SDXL_TPU_ATTENTION",
           default="auto", choices=("auto", "xla"), loads="attention"),
    option("--compile-cache", [*SERVERS, "generate"], "JAX's persistent compilation cache directory, with each "
           "size's compiled programs stored in it (a restart loads them untraced); '' for none",
           env="SDXL_TPU_COMPILE_CACHE", default=DEFAULT_COMPILE_CACHE,
           shown_default="~/.cache/sdxl_tpu/jax"),
    option("--compile-cache", ["bench"], "JAX's persistent compilation cache directory, with the stored programs",
           shown_default="a fresh directory, so compiles are cold"),
    option("--max-prompt-chunks", SERVERS,
           f"the longest prompt, in chunks of 75 tokens as A1111 splits them ({DEFAULT_MAX_CHUNKS}: 225 tokens); "
           "every program has room for N, so no prompt recompiles", env="SDXL_MAX_PROMPT_CHUNKS", type=int,
           default=DEFAULT_MAX_CHUNKS, metavar="N", loads="max_prompt_chunks"),
    # --- what the servers compile, preview and serve ---
    option("--sizes", SERVERS, "comma-separated WIDTHxHEIGHT sizes to compile, or 'sdxl' for SDXL's nine trained "
           "sizes; ready once the first is compiled, the others follow in the background", env="SDXL_SIZES",
           shown_default="1024x1024, or the preset's; 256x256 for the tiny model"),
    option("--network-sizes", SERVERS, "the sizes of --sizes at which the programs of --controlnet, --ip-adapter and "
           "--refiner compile at start too; elsewhere a request that first uses one compiles it (on a TPU v5e some "
           "two minutes)", env="SDXL_NETWORK_SIZES", metavar="SIZES", shown_default="every size"),
    option("--preview-every", [*SERVERS, "bench"], "live previews every N denoising steps; auto: about four a run; "
           "0: none", env="SDXL_PREVIEW_EVERY", type=preview_every, metavar="N", shown_default="auto"),
    option("--preview", [*SERVERS, "bench"], "how live previews are decoded: 'approx' (a linear latent-to-RGB map, "
           "no weights), 'taesd' (the tiny autoencoder madebyollin/taesdxl, downloaded once; bench with "
           "--random-weights: random weights of its shape) or a local TAESD directory in diffusers format",
           env="SDXL_PREVIEW", default="approx", loads="preview"),
    option("--image-format", SERVERS, "format of served images, parameters embedded (jpeg: quality 95, fastest; "
           "png: lossless)", env="SDXL_IMAGE_FORMAT", default="jpeg", choices=list(FORMATS)),
    option("--queue-size", SERVERS, "requests that may wait; more are told the server is busy",
           env="SDXL_QUEUE_SIZE", type=int, default=16),
    option("--drain-seconds", SERVERS, "on SIGTERM, how long requests already accepted may take to finish before the "
           "process exits", env="SDXL_DRAIN_SECONDS", type=float, default=60.0),
    option("--metrics", SERVERS, "where GET /metrics (Prometheus) is served: 'public' (on --port), 'off', or "
           "HOST:PORT for a listener of its own, e.g. 127.0.0.1:9100", env="SDXL_METRICS", default="public"),
    option("--api-key", SERVERS, "when set, the APIs of other tools (/sdapi/v1, /v1/images, /v1/models; MCP) take "
           "requests carrying it: a Bearer token (OpenAI's clients) or HTTP basic's password (A1111's --api-auth)",
           env="SDXL_API_KEY", metavar="KEY"),
    option("--mcp", ["app"], "'on': /generate is also a tool of an MCP server at /gradio_api/mcp/ for LLM agents; "
           "'auto': on on a Hugging Face Space (SPACE_ID set)", env="SDXL_MCP", default="auto",
           choices=["auto", "on", "off"]),
    option("--host", ["app"], "address to listen on (0.0.0.0 on Spaces)", env="GRADIO_SERVER_NAME",
           default="127.0.0.1"),
    option("--port", ["app"], "port", env="GRADIO_SERVER_PORT", type=int, default=7860),
    option("--host", ["serve"], "address to listen on (0.0.0.0 in a container)", default="127.0.0.1"),
    option("--port", ["serve"], "port", type=int, default=8000),
    option("--keep-images", ["app"], "seconds a served image stays downloadable", env="SDXL_KEEP_IMAGES",
           type=float, default=3600.0),
    option("--image-cache-mb", ["app"], "most disk the served images may take; the oldest go first",
           env="SDXL_IMAGE_CACHE_MB", type=int, default=1024),
    option("--backend", ["app"], "URL of back ends (`python -m sdxl_tpu serve`, usually behind a load balancer): the "
           "page sends each generation there and loads no model; the model options are then the back end's and "
           "unused here", env="SDXL_BACKEND"),
    # --- what bench measures ---
    option("--runs", ["bench"], "timed calls", type=int, default=5),
    option("--controlnets", ["bench"], "random ControlNets (0-3, as ControlNetModel.from_unet makes them; "
           "--random-weights) in every call: what they cost a step", type=int, default=0, metavar="N"),
    option("--features", ["bench"], "random networks beside the model (--random-weights), all loaded at once, each "
           "timed in calls alternated with plain ones: controlnet, ip-adapter (ViT-bigG) or ip-adapter-plus (ViT-H), "
           "refiner (switch at 0.8); comma-separated", metavar="LIST"),
    option("--no-warm-compile", ["bench"], "skip the second process that measures a warm (cached) compile",
           action="store_false", dest="warm_compile"),
    option("--compare-progress", ["bench"], "also compile the stepwise loop (per-step progress) and compare its "
           "latency", action="store_true"),
    option("--compare-previews", ["bench"], "also measure live previews: the stepwise loop with and without them, "
           "calls alternated", action="store_true"),
    option("--peak-tflops", ["bench"], "per-device peak for utilisation", type=float,
           shown_default="the datasheet's, where known"),
    option("--compile-only", ["bench"], "compile, report compile time and compiled memory, run nothing (e.g. does "
           "SDXL at 1024x1024 fit a 16 GB chip?)", action="store_true"),
    option("--json", ["bench"], "print one JSON object", action="store_true"),
    # --- make-tiny ---
    option("directory", ["make-tiny"], "where the checkpoint is written", metavar="DIR"),
    option("--seed", ["make-tiny"], "seed of the random weights", type=int, default=0),
    option("--preset", ["make-tiny"], "the older spelling of --architecture", choices=ARCHITECTURES),
)


def options_for(command: str) -> list[Option]:
    if command not in COMMANDS:
        raise ValueError(f"no command {command!r}")
    return [o for o in OPTIONS if command in o.commands]


def default_of(flag: str, command: str = "serve") -> Any:
    """The table's default of `flag` for `command` (so other defaults can be the command line's)."""
    return next(o.default for o in options_for(command) if o.flag == flag)


def load_values(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """What `command`'s options say to load: LoadOptions field -> value (None: not given)."""
    return {o.loads: getattr(args, o.name) for o in options_for(command) if o.loads}
