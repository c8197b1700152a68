"""One request, checked once: what a call makes, spelled out per image (`ImageInfo`), and what it
made (`GenerationResult`). The checks of each field are values.py's; the fields' limits fields.py's.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from .errors import RequestError
from .fields import DEFAULT_STRENGTH, FIELD, MAX_PROMPT_CHARS, MAX_SEED, RANDOM_SEED
from ..imaging.hires import DEFAULT_SCALE, DEFAULT_UPSCALER, UPSCALERS, Hires, scales_to, upscaled_size
from ..imaging.hires import DEFAULT_STRENGTH as DEFAULT_HIRES_STRENGTH
from ..imaging.image_input import image_input
from ..imaging.mask import (DEFAULT_INPAINT_AREA, DEFAULT_MASK_BLUR, DEFAULT_MASK_PADDING, DEFAULT_MASKED_CONTENT,
                            INPAINT_AREAS, MASKED_CONTENT, ONLY_MASKED, Crop, blur_mask, crop_region, fit_mask,
                            mask_input)
from .names import (DEFAULT_PROMPT_MODE, DEFAULT_RESIZE_MODE, DEFAULT_RNG, DEFAULT_SCHEDULE, PROMPT_MODES, RESIZE_MODES,
                    RNGS, SAMPLERS, SCHEDULES)
from ..imaging.resize import fit_image, image_array
from .control import ControlRequest, control_requests
from ..a1111.dynamic_prompts import Wildcards
from .templates import checked_prompts, made_prompts
from .values import (choice_input, json_type, number_input, parse_size, per_image, prompt_input, schedule_input,
                     seed_input, size_input)


# -- the request ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageInfo:
    """The parameters of one image."""
    seed: int
    prompt: str
    negative_prompt: str
    guidance_scale: float
    steps: int
    size: tuple[int, int]  # (width, height)
    sampler: str | None = None  # None: the pipeline's default (it fills it in)
    schedule: str = DEFAULT_SCHEDULE  # one of names.SCHEDULES
    rng: str = DEFAULT_RNG  # one of names.RNGS: where the noise comes from
    strength: float | None = None  # img2img's denoising strength; None: from noise
    mask_blur: int | None = None  # inpainting's (None: no mask)
    masked_content: str | None = None  # inpainting's: one of mask.MASKED_CONTENT (None: no mask)
    hires: Hires | None = None  # a hires fix after the first pass at `size` (None: none)
    inpaint_area: str | None = None  # inpainting's: one of mask.INPAINT_AREAS (None: no mask)
    mask_padding: int | None = None  # Only masked's padding, in pixels (None: not Only masked)
    # ControlNet units (request/control.py), each with its control image at `size` (compared by
    # their settings: a call's images share the units' settings, each request its own images).
    controls: tuple[ControlRequest, ...] = ()
    # The dynamic templates the prompts were made from (sd-dynamic-prompts' "Template"); None: as written.
    template: str | None = None
    negative_template: str | None = None
    refiner_switch_at: float | None = None  # the fraction of the steps after which the refiner runs (None: none)


# What a Request's may differ in image by image (the templates: where its prompts were made from one).
PER_IMAGE = ("seed", "prompt", "negative_prompt", "guidance_scale", "template", "negative_template")


@dataclass
class GenerationResult:
    images: list  # PIL.Image.Image
    infos: list[ImageInfo]
    # seconds: text_encoding, (from an image) image_encoding, denoising, decoding, total
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int]:
        return [i.seed for i in self.infos]


def guided(infos: Sequence[ImageInfo]) -> bool:
    """Whether a call needs classifier-free guidance (any image's guidance above 1); without it
    the UNet runs the conditional pass alone."""
    return any(i.guidance_scale > 1 for i in infos)


PREVIEWS_PER_RUN = 4  # the default cadence: about this many previews in a run of any length


def preview_cadence(setting: int | None, steps: int) -> int:
    """Steps between live previews: `setting` (0: none), or by default about PREVIEWS_PER_RUN a run."""
    if setting is not None:
        return setting
    return max(1, steps // (PREVIEWS_PER_RUN + 1)) if steps > 1 else 0


def _label(name: str) -> str:
    """How the page and every message name a field (fields.py)."""
    return FIELD[name].label


def _one_or_each(value: Any, name: str, check: Callable[[Any], Any], per_image: bool) -> Any:
    """A value for every image or, where `per_image`, a list of one value per image (its length
    is checked against the image count when the request is spelled out)."""
    if per_image and isinstance(value, (list, tuple)):
        if not value:
            raise RequestError(f"{name}: a list of per-image values must not be empty.")
        return tuple(check(v) for v in value)
    return check(value)


def _hires(size: tuple[int, int], sizes: Sequence[tuple[int, int]] | None, upscalers: Sequence[str],
           hires_scale: Any, hires_upscaler: Any, hires_steps: Any, hires_strength: Any) -> Hires:
    """A checked hires fix from `size` to one of `sizes` (None: any), by Latent, Lanczos or one of `upscalers`."""
    check = lambda name, v, whole=False: number_input(v, _label(name), *FIELD[name].bounds, whole=whole)
    scale = DEFAULT_SCALE if hires_scale is None else float(check("hires_scale", hires_scale))
    target = upscaled_size(size, scale)
    if sizes is None and (target[0] % 8 or target[1] % 8):  # (SDXL's latents: 8 pixels each way)
        raise RequestError(f"{_label('hires_scale')} {scale:g} makes {target[0]}x{target[1]} from {size[0]}x{size[1]}: "
                           "the upscaled width and height must be multiples of 8.")
    if sizes is not None and target not in sizes:
        reach = scales_to(size, sizes)
        at = f"{size[0]}x{size[1]}"
        raise RequestError(f"{_label('hires_scale')} {scale:g} makes {target[0]}x{target[1]} from {at}, which is not a "
                           "size this server offers; " + (
                               f"from {at} these upscales reach one: {', '.join(f'{s:g}' for s in reach)}." if reach
                               else f"no upscale of {at} reaches one."))
    return Hires(scale=scale, size=target,
                 upscaler=DEFAULT_UPSCALER if hires_upscaler is None else choice_input(
                     hires_upscaler, _label("hires_upscaler"), (*UPSCALERS, *upscalers)),
                 steps=0 if hires_steps is None else int(check("hires_steps", hires_steps, True)),
                 strength=DEFAULT_HIRES_STRENGTH if hires_strength is None else float(
                     check("hires_strength", hires_strength)))


NO_WILDCARDS = Wildcards(None)  # (a server given no folder: each __name__ is refused, naming none)
MAX_COUNT = 1024  # (a server makes at most its images per call in one request: engines check that)


def random_seed() -> int:
    return secrets.randbelow(MAX_SEED + 1)


def seed_or_random(value: Any) -> int:
    """A checked seed; RANDOM_SEED (-1) is one drawn at random, as A1111 reads it."""
    seed = seed_input(value, _label("seed"))
    return random_seed() if seed == RANDOM_SEED else seed


@dataclass(frozen=True)
class Request:
    """What one call makes. Each of prompt, negative_prompt, seed and guidance_scale is one value
    for every image or a tuple of one per image; a single seed is a base: image i gets seed + i."""
    prompt: str | tuple[str, ...]
    negative_prompt: str | tuple[str, ...]
    seed: int | tuple[int, ...]
    guidance_scale: float | tuple[float, ...]
    steps: int
    size: tuple[int, int]
    sampler: str | None = None  # by name; None: the pipeline's default
    schedule: str = DEFAULT_SCHEDULE
    rng: str = DEFAULT_RNG
    strength: float | None = None  # from an image (img2img): its denoising strength
    mask_blur: int | None = None  # inpainting's: with a mask only
    masked_content: str | None = None
    hires: Hires | None = None
    inpaint_area: str | None = None
    mask_padding: int | None = None
    count: int | None = None  # images to make (None: as many as the server makes a call, 4 by default)
    # From an image: the image fitted to `size`, (height, width, 3) uint8 (None: from noise).
    image: Any = field(default=None, compare=False, repr=False)
    # Inpainting: the mask, blurred and fitted as the image, (height, width) uint8, 255 repaints.
    mask: Any = field(default=None, compare=False, repr=False)
    # Only masked: the whole image and mask the fitted ones were cropped from, to paste results back.
    crop: Crop | None = field(default=None, compare=False, repr=False)
    controls: tuple[ControlRequest, ...] = field(default=(), compare=False, repr=False)  # (control.py's, at `size`)
    # How the prompts' {a|b} and __wildcard__ are read (names.PROMPT_MODES), and the server's
    # wildcards (None: the prompts are not made here but by a front end's back end, as sent).
    dynamic_prompts: str = DEFAULT_PROMPT_MODE
    wildcards: Wildcards | None = field(default=NO_WILDCARDS, compare=False, repr=False)
    refiner_switch_at: float | None = None  # (ImageInfo's)

    @staticmethod
    def of(prompt: Any, negative_prompt: Any = "", *, seed: Any = None, guidance_scale: Any = 5.0,
           steps: Any = 20, size: Any = (1024, 1024), sizes: Sequence[tuple[int, int]] | None = None,
           sampler: Any = None, samplers: Sequence[str] | None = None, schedule: Any = None, rng: Any = None,
           strength: Any = None, image: Any = None, resize_mode: Any = None, mask: Any = None,
           mask_blur: Any = None, masked_content: Any = None, mask_blurred: bool = False, inpaint_area: Any = None,
           mask_padding: Any = None, hires: Any = None, count: Any = None, hires_scale: Any = None,
           hires_upscaler: Any = None, hires_steps: Any = None, hires_strength: Any = None, controlnet: Any = None,
           controlnets: Sequence[str] = (), ip_adapters: Sequence[str] = (), upscalers: Sequence[str] = (),
           per_image: bool = True, max_chars: int = MAX_PROMPT_CHARS, dynamic_prompts: Any = None,
           wildcards: Wildcards | None = NO_WILDCARDS, refiner_switch_at: Any = None) -> "Request":
        """Check everything; `seed=None` or -1 draws a random seed (a per-image -1, one for that image);
        `sizes` and `samplers` are those available (default: all of names.SAMPLERS); without
        `per_image`, lists are refused (a form has one value per field); prompts are at most
        `max_chars` characters. From an image (img2img): `image` (image_input.image_input's forms: a
        PIL image, an array, a file's bytes or base64), fitted to the size by `resize_mode` (A1111's;
        default Just resize), and `strength`, its denoising strength from 0 to 1 (default A1111's
        0.75). Inpainting: `mask` (the same forms, the image's size; mask.mask_input), `mask_blur`
        (default 4), `masked_content` (default original), `inpaint_area` (Whole picture, or Only
        masked: the mask's region and `mask_padding` pixels around it, default 32, cropped and fitted
        to the size, the results pasted back), as A1111's (`mask_blurred`: the mask comes blurred by
        mask_blur already, as a front end forwards it). With `hires` true, A1111's hires fix:
        `hires_scale` (default 2; the upscaled size must be one of `sizes`), `hires_upscaler` (Latent,
        Lanczos or one of the `upscalers` models), `hires_steps` (0: as many as the first pass) and
        `hires_strength` (default 0.7). `controlnet`: ControlNet units (control.py; `controlnets`:
        the names loaded, `ip_adapters` those that are IP-Adapters). `dynamic_prompts`:
        names.PROMPT_MODES' (default Random), from `wildcards` (None: a back end's, the syntax alone
        checked here). `refiner_switch_at`: where a refiner takes over, 0 to 1. The images are checked last."""
        def prompt_text(v: Any) -> str:
            text = prompt_input(v, _label("prompt"), max_chars)
            if not text:
                raise RequestError("Prompt is empty: please enter a prompt.")
            return text

        def number(name: str, whole: bool = False) -> Callable[[Any], Any]:
            return lambda v: number_input(v, _label(name), *FIELD[name].bounds, whole=whole)

        def field(value: Any, name: str, check: Callable[[Any], Any]) -> Any:
            return _one_or_each(value, _label(name), check, per_image)

        sampler = None if sampler is None else choice_input(sampler, _label("sampler"),
                                                            SAMPLERS if samplers is None else samplers)
        schedule = DEFAULT_SCHEDULE if schedule is None else choice_input(schedule, _label("schedule"), SCHEDULES)
        if sampler is not None:  # the default sampler's combination is checked once it is known
            schedule_input(sampler, schedule)
        checked = dict(
            prompt=field(prompt, "prompt", prompt_text),
            negative_prompt=field(negative_prompt, "negative",
                                  lambda v: prompt_input(v, _label("negative"), max_chars)),
            seed=random_seed() if seed is None else field(seed, "seed", seed_or_random),
            guidance_scale=field(guidance_scale, "guidance", lambda v: float(number("guidance")(v))),
            steps=int(number("steps", whole=True)(steps)),
            size=size_input(size, sizes) if sizes is not None else parse_size(size),
            sampler=sampler, schedule=schedule,
            rng=DEFAULT_RNG if rng is None else choice_input(rng, _label("rng"), RNGS),
            count=None if count is None else int(number_input(count, "Image count", 1, MAX_COUNT, whole=True)),
            dynamic_prompts=DEFAULT_PROMPT_MODE if dynamic_prompts is None else choice_input(
                dynamic_prompts, _label("dynamic_prompts"), PROMPT_MODES),
            wildcards=wildcards, refiner_switch_at=None if refiner_switch_at is None else float(number_input(
                refiner_switch_at, "Refiner switch at", 0.0, 1.0)))
        if checked["dynamic_prompts"] != PROMPT_MODES[0]:  # (a typo'd wildcard refused now, not mid-run)
            checked_prompts({_label("prompt"): checked["prompt"], _label("negative"): checked["negative_prompt"]},
                            wildcards)
        inpainting = dict(mask_blur=mask_blur, masked_content=masked_content, inpaint_area=inpaint_area,
                          mask_padding=mask_padding)
        for name, value in (("strength", strength), ("mask", mask), *inpainting.items()):
            needs = "image" if name in ("strength", "mask") else "mask"
            if value is not None and {"image": image, "mask": mask}[needs] is None:
                raise RequestError(f"{_label(name)} applies to a {'starting image' if needs == 'image' else 'mask'}:"
                                   f" give the {_label(needs).lower()} too.")
        if hires is not None and not isinstance(hires, bool):
            raise RequestError(f"{_label('hires')} must be true or false, got {json_type(hires)}.")
        given = dict(hires_scale=hires_scale, hires_upscaler=hires_upscaler, hires_steps=hires_steps,
                     hires_strength=hires_strength)
        if not hires and (name := next((k for k, v in given.items() if v is not None), None)):
            raise RequestError(f"{_label(name)} applies to a hires fix: turn {_label('hires')} on too.")
        if hires:
            if image is not None:
                raise RequestError(f"{_label('hires')} applies to text to image, not to a starting image.")
            checked["hires"] = _hires(checked["size"], sizes, upscalers, **given)
        # (a mode without an image is checked, then unused: the command line always has one)
        mode = DEFAULT_RESIZE_MODE if resize_mode is None else choice_input(resize_mode, _label("resize_mode"),
                                                                            RESIZE_MODES)
        checked["controls"] = control_requests(controlnet, checked["size"], controlnets, ip_adapters)
        if hires and any(unit.model not in ip_adapters for unit in checked["controls"]):  # (an image prompt: both)
            raise RequestError(f"{_label('hires')} with ControlNet is not supported yet: make the image, then upscale "
                               "it with img2img.")
        if checked["refiner_switch_at"] is not None and (hires or checked["controls"]):  # (said before a run starts)
            raise RequestError("The refiner with a hires fix, ControlNet or an IP-Adapter is not supported yet: turn "
                               "one of them off.")
        if image is None:
            return Request(**checked)
        checked["strength"] = DEFAULT_STRENGTH if strength is None else float(number("strength")(strength))
        if mask is not None:
            checked["mask_blur"] = DEFAULT_MASK_BLUR if mask_blur is None else int(number("mask_blur", True)(mask_blur))
            checked["masked_content"] = (DEFAULT_MASKED_CONTENT if masked_content is None else
                                         choice_input(masked_content, _label("masked_content"), MASKED_CONTENT))
            checked["inpaint_area"] = (DEFAULT_INPAINT_AREA if inpaint_area is None else
                                       choice_input(inpaint_area, _label("inpaint_area"), INPAINT_AREAS))
            if checked["inpaint_area"] == ONLY_MASKED:  # (its padding means nothing to the whole picture)
                checked["mask_padding"] = (DEFAULT_MASK_PADDING if mask_padding is None else
                                           int(number("mask_padding", True)(mask_padding)))
        picture = image_input(image, _label("image"))
        if mask is None:
            return Request(**checked, image=image_array(fit_image(picture, checked["size"], mode)))
        binary = mask_input(mask, picture.size, _label("mask"), checked["size"])
        blurred = blur_mask(binary, 0 if mask_blurred else checked["mask_blur"])
        if binary.size != picture.size:  # a mask of the fitted image (outpainting: Resize and fill's new area)
            if checked["inpaint_area"] == ONLY_MASKED:
                raise RequestError(f"{_label('inpaint_area')} {ONLY_MASKED} takes a mask of the image's own size, "
                                   f"{picture.width}x{picture.height}.")
            return Request(**checked, image=image_array(fit_image(picture, checked["size"], mode)), mask=blurred)
        if checked["inpaint_area"] != ONLY_MASKED:
            return Request(**checked, image=image_array(fit_image(picture, checked["size"], mode)),
                           mask=fit_mask(blurred, checked["size"], mode))
        region = crop_region(blurred, checked["mask_padding"], checked["size"])
        if region is None:
            raise RequestError(f"{_label('inpaint_area')} {ONLY_MASKED} repaints what the mask marks, and this mask "
                               "marks nothing: paint the area to repaint in white.")
        # (A1111 crops the image at its own size whatever the resize mode, and fits the crop so)
        fill = "Resize and fill"
        return Request(**checked, image=image_array(fit_image(picture.crop(region), checked["size"], fill)),
                       mask=fit_mask(np.asarray(Image.fromarray(blurred, "L").crop(region)), checked["size"], fill),
                       crop=Crop(image_array(picture), blurred, region))

    def finish(self, images: list) -> list:
        """A call's images as the request asked for them: Only masked's pasted back into the image."""
        return images if self.crop is None else [self.crop.paste(image) for image in images]

    def seeds(self, n: int) -> list[int]:
        """The seeds of `n` images (a single seed is the first of them)."""
        return ([(self.seed + i) % (MAX_SEED + 1) for i in range(n)] if isinstance(self.seed, int)
                else per_image(self.seed, n, _label("seed")))

    def images(self, n: int) -> list[ImageInfo]:
        """The request spelled out for `n` images (their prompts made from the templates, if any)."""
        seeds = self.seeds(n)
        (prompts, templates), (negatives, negative_templates) = (  # (each image's, and its template if any)
            made_prompts(per_image(t, n, _label(name)), isinstance(t, str), seeds, self.wildcards, self.dynamic_prompts)
            for t, name in ((self.prompt, "prompt"), (self.negative_prompt, "negative")))
        columns = zip(seeds, prompts, negatives, per_image(self.guidance_scale, n, _label("guidance")), templates,
                      negative_templates)
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(ImageInfo) if f.name not in PER_IMAGE}
        return [ImageInfo(seed=s, prompt=p, negative_prompt=q, guidance_scale=g, template=t, negative_template=u,
                          **shared) for s, p, q, g, t, u in columns]
