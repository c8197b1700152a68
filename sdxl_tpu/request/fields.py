"""The form's fields: one list, from which everything else takes them. The page builds its inputs
from it and sends them in its order (so does the `/generate` API); the form's check names each
field by its label; the history keeps the fields marked HISTORY; the back end's JSON takes their
`api` names (Pipeline.generate's arguments); a pasted A1111 parameters text fills those marked
PASTED, read from its `infotext` key.

To add a field: one entry here (at the end, optional: older /generate callers leave it out), its
input in the page's layout (page/page_layout.py), and what it means to a Request. Every field but
the prompt is optional: a client may send the prompt alone (the JavaScript client sends null for what it leaves out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..imaging.hires import DEFAULT_SCALE as HIRES_SCALE
from ..imaging.hires import DEFAULT_STRENGTH as HIRES_STRENGTH
from ..imaging.hires import DEFAULT_UPSCALER as HIRES_UPSCALER
from ..imaging.hires import SCALE_RANGE as HIRES_SCALE_RANGE
from ..imaging.hires import UPSCALERS as HIRES_UPSCALERS
from ..imaging.mask import (DEFAULT_INPAINT_AREA, DEFAULT_MASK_BLUR, DEFAULT_MASK_PADDING, DEFAULT_MASKED_CONTENT,
                            INPAINT_AREAS, MASKED_CONTENT, MAX_MASK_BLUR, MAX_MASK_PADDING)
from ..imaging.control_image import CANNY_THRESHOLDS, PREPROCESSORS
from .names import (DEFAULT_PROMPT_MODE, DEFAULT_RESIZE_MODE, DEFAULT_RNG, DEFAULT_SCHEDULE, PROMPT_MODES, RESIZE_MODES,
                    RNGS, SAMPLERS, SCHEDULES)

MAX_SEED = 2**32 - 1
RANDOM_SEED = -1  # as in AUTOMATIC1111: a seed drawn at random for each run
MAX_STEPS = 50
MAX_BATCH_COUNT = 32  # calls in one run (A1111's Batch count; its slider goes to 100)
# A prompt past its token budget is cut, not refused (the token count says so): this bound only
# caps the work of reading one. The largest budget (8 chunks of 75 tokens) takes about 3,000
# characters of plain text, a few times that with A1111's brackets, weights and <lora:...> tags;
# checking and tokenizing 20,000 characters takes at most about 70 ms (bracket soup, the worst case).
MAX_PROMPT_CHARS = 20_000
GUIDANCE_RANGE = (0.0, 20.0)
STRENGTH_RANGE = (0.0, 1.0)  # img2img's denoising strength: 0 keeps the image, 1 all but replaces it
DEFAULT_STRENGTH = 0.75  # A1111's
DEFAULT_STYLE = "(No style)"
DEFAULT_SWITCH_AT = 0.8  # where the refiner takes over (A1111's Refiner switch at)
MAX_WEIGHT = 2.0  # a ControlNet's (sd-webui-controlnet's Control Weight slider)

HISTORY, PASTED = "history", "pasted"  # where a field is kept besides the form: a run's history, pasted parameters


@dataclass(frozen=True)
class Field:
    name: str  # the form's name: the page's element id, the history's key, /generate's argument
    label: str  # how the page and every message name it
    kind: str  # "text", "choice", "number", "whole" (a whole number), "switch" or "image"
    default: Any = None  # the page's starting value (None: the server's, e.g. its first size)
    api: str | None = None  # its name in POST /v1/generate and Pipeline.generate (None: the page's alone)
    kept: frozenset[str] = frozenset()  # HISTORY, PASTED
    optional: bool = False  # /generate's caller may leave it out (or send null): then the server's default
    limits: tuple[float, float] | None = None  # a number's range
    choices: tuple[str, ...] | None = None  # a choice's names where they are the same everywhere
    infotext: str | None = None  # its key in an A1111 parameters text
    restored: Any = None  # the value it takes when a run is restored with its seed (not None: it is set)
    needs: tuple[str, ...] = ()  # the fields it applies with (the page sends it always: unused without them)
    about: str = ""  # what it means, for a client's author (the API page)
    example: Any = None  # a realistic value for the API page's example call (None: its default)

    @property
    def bounds(self) -> tuple[float, float]:
        """A number's range (`limits`), where the field has one."""
        if self.limits is None:
            raise ValueError(f"the field {self.name!r} has no range")
        return self.limits

    @property
    def names(self) -> tuple[str, ...]:
        """A choice's names (`choices`), where they are the same everywhere."""
        if self.choices is None:
            raise ValueError(f"the field {self.name!r} has no fixed choices")
        return self.choices


_ALL = frozenset({HISTORY, PASTED})

FIELDS: tuple[Field, ...] = (
    Field("prompt", "Prompt", "text", "", api="prompt", kept=_ALL,
          example="a lighthouse on a cliff at dusk, oil painting",
          about="What to draw, with A1111's (word:1.2) weights; cut past the token budget (225 for SDXL)."),
    Field("negative", "Negative prompt", "text", "", api="negative_prompt", kept=_ALL, optional=True,
          example="blurry, low quality", about="What to leave out (may be empty)."),
    Field("style", "Style", "choice", DEFAULT_STYLE, kept=frozenset({HISTORY}), optional=True,
          about="A style's template around the prompt, by name (see the page's menu)."),
    Field("seed", "Seed", "whole", RANDOM_SEED, api="seed", kept=_ALL, optional=True, limits=(RANDOM_SEED, MAX_SEED),
          infotext="Seed", example=1234, about="The first image's seed, the others' follow it; -1 draws one."),
    Field("randomize", "Randomize seed", "switch", False, optional=True,
          restored=False,  # (a restored run comes with its seed)
          about="True draws a seed whatever `seed` says (the page's -1 does the same)."),
    Field("guidance", "Guidance scale", "number", 5.0, api="guidance_scale", kept=_ALL, optional=True,
          limits=GUIDANCE_RANGE, infotext="CFG scale", about="How closely to follow the prompt (A1111's CFG scale)."),
    Field("steps", "Steps", "whole", 20, api="steps", kept=_ALL, optional=True, limits=(1, MAX_STEPS), infotext="Steps",
          about="Denoising steps."),
    Field("size", "Size", "choice", api="size", kept=_ALL, optional=True, infotext="Size",
          about="'WIDTHxHEIGHT', one of the sizes the server compiled."),
    Field("sampler", "Sampler", "choice", api="sampler", kept=_ALL, optional=True, infotext="Sampler",
          choices=SAMPLERS, about="A1111's sampler name; left out: the model's own."),
    Field("schedule", "Schedule type", "choice", DEFAULT_SCHEDULE, api="schedule", kept=_ALL, optional=True,
          infotext="Schedule type", choices=SCHEDULES,
          about="Checkpoint (as diffusers runs the model) or one of A1111's schedule types."),
    Field("rng", "RNG", "choice", DEFAULT_RNG, api="rng", kept=_ALL, optional=True, infotext="RNG", choices=RNGS,
          about="Where the noise comes from: JAX, or CPU (PyTorch's CPU noise, as A1111 and ComfyUI draw it)."),
    # img2img (added last: /generate's older callers send the fields above and nothing more).
    Field("image", "Image", "image", api="image", optional=True,
          about="Start from this image (img2img): on the page and /generate an uploaded file (Gradio's file "
                "object); in POST /v1/generate a PNG, JPEG or WebP file as base64, bare or as a data: URL; "
                "fitted to the size by resize_mode. Left out: from noise."),
    Field("strength", "Denoising strength", "number", DEFAULT_STRENGTH, api="strength", optional=True,
          limits=STRENGTH_RANGE, kept=frozenset({PASTED}), infotext="Denoising strength",
          needs=("image",),
          about="With an image: how far from it, 0 (kept) to 1 (all but replaced); left out: 0.75, A1111's."),
    Field("resize_mode", "Resize mode", "choice", DEFAULT_RESIZE_MODE, api="resize_mode", optional=True,
          choices=RESIZE_MODES,
          needs=("image",),
          about="With an image: how it is fitted to the size, as A1111's: Just resize (stretched), Crop and "
                "resize (covering, centred), Resize and fill (inside, the bands filled from its edges)."),
    # inpainting (after img2img's, for the same reason)
    Field("mask", "Mask", "image", api="mask", optional=True,
          about="With an image: where to repaint it (inpainting), an image of the same size (or of the size to "
                "make: a mask of the fitted image, as for outpainting with Resize and fill): white repaints, "
                "black keeps (or, where it has transparency, its opaque part repaints), sent as the image is. "
                "Outside the blurred mask the results keep the image's pixels. Left out: all of it (img2img)."),
    Field("mask_blur", "Mask blur", "whole", DEFAULT_MASK_BLUR, api="mask_blur", optional=True,
          limits=(0, MAX_MASK_BLUR), kept=frozenset({PASTED}), infotext="Mask blur",
          needs=("image", "mask"),
          about="With a mask: how far its edge is blurred, in pixels (A1111's Mask blur)."),
    Field("masked_content", "Masked content", "choice", DEFAULT_MASKED_CONTENT, api="masked_content", optional=True,
          choices=MASKED_CONTENT, kept=frozenset({PASTED}), infotext="Masked content",
          needs=("image", "mask"),
          about="With a mask: what the masked area starts from, as A1111's: fill (its surroundings' colours), "
                "original (the image), latent noise, latent nothing."),
    # hires fix (after inpainting's, for the same reason)
    Field("hires", "Hires. fix", "switch", False, api="hires", optional=True, kept=frozenset({PASTED}),
          about="Text to image only: make the images at the size, upscale them, denoise again at the larger size "
                "(A1111's Hires. fix)."),
    Field("hires_scale", "Hires upscale", "number", HIRES_SCALE, api="hires_scale", optional=True,
          limits=HIRES_SCALE_RANGE, kept=frozenset({PASTED}), infotext="Hires upscale",
          needs=("hires",),
          about="With hires: by how much; the upscaled size must be one the server offers."),
    Field("hires_upscaler", "Hires upscaler", "choice", HIRES_UPSCALER, api="hires_upscaler", optional=True,
          choices=HIRES_UPSCALERS, kept=frozenset({PASTED}), infotext="Hires upscaler",
          needs=("hires",),
          about="With hires: Latent (the latents, bilinear) or Lanczos (the image, then encoded again), as A1111's."),
    Field("hires_steps", "Hires steps", "whole", 0, api="hires_steps", optional=True, limits=(0, MAX_STEPS),
          kept=frozenset({PASTED}), infotext="Hires steps",
          needs=("hires",),
          about="With hires: the second pass's steps; 0: as many as the first."),
    Field("hires_strength", "Hires denoising strength", "number", HIRES_STRENGTH, api="hires_strength",
          optional=True, kept=frozenset({PASTED}), limits=STRENGTH_RANGE,
          needs=("hires",),
          about="With hires: how far the second pass goes from the upscaled image, 0 to 1 (A1111's Denoising "
                "strength; default 0.7)."),
    # Only masked (after the hires fix's, for the same reason)
    Field("inpaint_area", "Inpaint area", "choice", DEFAULT_INPAINT_AREA, api="inpaint_area", optional=True,
          choices=INPAINT_AREAS, kept=frozenset({PASTED}), infotext="Inpaint area", needs=("image", "mask"),
          about="With a mask: Whole picture (the image fitted to the size), or Only masked (the mask's region "
                "and some padding cropped, denoised at the size, pasted back: the results are the image's own "
                "size, the rest of it kept), as A1111's."),
    Field("mask_padding", "Only masked padding, pixels", "whole", DEFAULT_MASK_PADDING, api="mask_padding",
          optional=True, limits=(0, MAX_MASK_PADDING), kept=frozenset({PASTED}), infotext="Masked area padding",
          needs=("image", "mask"),
          about="With Only masked: how far around the mask the cropped region reaches."),
    # The page's ControlNet unit, as sd-webui-controlnet's panel has one (after Only masked's, for the
    # same reason). Page fields: POST /v1/generate and /sdapi/v1 take a list of units instead
    # (request/control.py), which these make one of.
    Field("control_image", "ControlNet image", "image", optional=True,
          about="Guide the images with this image through a loaded ControlNet (edges, a depth map, a pose you "
                "made...): an uploaded file, as the image is; fitted to the size by Crop and resize. Through the "
                "IP-Adapter: the image as a prompt, its centre as the image encoder sees it. Left out: none."),
    Field("control_model", "ControlNet", "choice", optional=True, needs=("control_image",),
          about="Which of the loaded ControlNets, or the IP-Adapter (GET /controlnet/model_list); left out: the "
                "first."),
    Field("control_module", "Preprocessor", "choice", "none", optional=True, choices=PREPROCESSORS,
          needs=("control_image",),
          about="What the ControlNet image becomes first: none (used as it is), canny (its edges), invert (white "
                "lines on black from black on white), as sd-webui-controlnet's."),
    Field("control_weight", "Control weight", "number", 1.0, optional=True, limits=(0.0, MAX_WEIGHT),
          needs=("control_image",), about="How strongly the ControlNet steers, 0 to 2 (A1111's Control Weight)."),
    Field("control_start", "Starting control step", "number", 0.0, optional=True, limits=(0.0, 1.0),
          needs=("control_image",), about="From which fraction of the steps the ControlNet acts, 0 to 1."),
    Field("control_end", "Ending control step", "number", 1.0, optional=True, limits=(0.0, 1.0),
          needs=("control_image",), about="Until which fraction of the steps it acts, above the start."),
    Field("control_low", "Canny low threshold", "whole", CANNY_THRESHOLDS[0], optional=True, limits=(1, 255),
          needs=("control_image",), about="With canny: edges weaker than this are dropped."),
    Field("control_high", "Canny high threshold", "whole", CANNY_THRESHOLDS[1], optional=True, limits=(1, 255),
          needs=("control_image",), about="With canny: edges stronger than this are kept."),
    # Dynamic prompts (after the ControlNet unit's, for the same reason).
    Field("dynamic_prompts", "Dynamic prompts", "choice", DEFAULT_PROMPT_MODE, api="dynamic_prompts", optional=True,
          choices=PROMPT_MODES, kept=frozenset({HISTORY}),
          about="How {a|b|c}, {2$$a|b|c}, {0.5::a|b} and __wildcard__ in the prompts are read, as "
                "sd-dynamic-prompts: Random (each image draws its own prompt from its seed), Combinatorial (the "
                "combinations in order, one an image), Off (the prompt as written)."),
    # A1111's Batch count (its API's n_iter): calls in one run (last: older callers leave it out).
    Field("batch_count", "Batch count", "whole", 1, optional=True, limits=(1, MAX_BATCH_COUNT),
          kept=frozenset({HISTORY}),
          about="Calls in one run, as A1111's Batch count: each makes a call's images, the seeds following on; "
                "progress is over them all; Stop ends the run, the finished calls' images staying in view."),
    # The refiner (A1111's), shown where the server loads one (last: older callers leave them out).
    Field("refiner", "Refiner", "switch", False, optional=True, kept=frozenset({HISTORY}),
          about="The page's switch for the refiner; the APIs give refiner_switch_at alone."),
    Field("refiner_switch_at", "Refiner switch at", "number", DEFAULT_SWITCH_AT, api="refiner_switch_at",
          optional=True, limits=(0.0, 1.0), kept=_ALL, infotext="Refiner switch at", needs=("refiner",),
          about="Hand the last steps to the server's refiner (GET /v1/info's refiner), as A1111's Refiner: those "
                "whose timestep is below this fraction's, 0 to 1 (0.8: the last fifth). Left out: no refiner."),
)
FIELD = {f.name: f for f in FIELDS}
FORM = tuple(f.name for f in FIELDS)  # the form's fields in the order the page and /generate send them
# How few of them a /generate call may send: up to the last one that cannot be left out.
FEWEST_INPUTS = 1 + max(i for i, f in enumerate(FIELDS) if not f.optional)
BY_API = {f.api: f for f in FIELDS if f.api}
# Pipeline.generate's keyword where it differs from the API name (diffusers' inpainting pipelines'
# `mask_image`, for people coming from them); tests/request/test_fields.py checks generate against this.
PYTHON_NAMES = {"mask": "mask_image"}


def kept(where: str) -> tuple[str, ...]:
    """The names of the fields kept `where` (HISTORY, PASTED), in the form's order."""
    return tuple(f.name for f in FIELDS if where in f.kept)


def restoring(values: dict[str, Any]) -> dict[str, Any]:
    """A restored run's form values: with its seed, the fields that follow from having one
    (Randomize off)."""
    if "seed" not in values:
        return dict(values)
    return {**{f.name: f.restored for f in FIELDS if f.restored is not None}, **values}
