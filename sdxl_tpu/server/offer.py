"""What a server offers (the back end's `GET /v1/info`), from which a page builds its menus and a
front end its whole form: the model, sizes, samplers, schedules, noise sources, presets and defaults.
Before the model is loaded (or a front end's back ends answer) a server offers what its settings say."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..request.control import NAME
from ..request.errors import RequestError
from ..imaging.hires import UPSCALERS
from ..request.fields import FIELD
from ..a1111.images import FORMATS
from ..request.names import RNGS, SAMPLERS, SCHEDULES
from ..a1111.prompts import CHUNK_TOKENS, MAX_CHUNKS
from ..request.recipes import RECIPES, Recipe, SAMPLING
from ..request.values import format_size, json_type, parse_size
from .settings import Settings


@dataclass(frozen=True)
class Offer:
    """What a server offers (the back end's `GET /v1/info`)."""
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
    loras: tuple[tuple[str, float], ...] = ()  # fused at load: (name, scale) (a back end of before: none said)
    controlnets: tuple[str, ...] = ()  # the ControlNets and IP-Adapter a request's units may name (request/control.py)
    ip_adapters: tuple[str, ...] = ()  # which of those are IP-Adapters
    embeddings: tuple[tuple[str, int], ...] = ()  # textual inversion embeddings a prompt may name: (name, vectors)
    skipped_embeddings: tuple[tuple[str, str], ...] = ()  # files of the embeddings folder not loaded: (name, why)
    upscalers: tuple[str, ...] = ()  # upscaler models the hires fix and Extras may name (A1111's names)
    refiner: str | None = None  # the refiner a request may switch to (refiner_switch_at), by name

    def defaults(self) -> dict[str, Any]:
        """The form's values where a client gives none, by field name: the launch preset's steps,
        guidance and sampler (else the fields' defaults and the offer's sampler), the offer's
        Schedule type and RNG, its first size."""
        recipe = RECIPES[self.preset] if self.preset else None
        return dict(steps=recipe.steps if recipe else FIELD["steps"].default,
                    guidance=recipe.guidance if recipe else FIELD["guidance"].default, sampler=self.default_sampler,
                    schedule=self.default_schedule, rng=self.default_rng, size=format_size(self.sizes[0]))

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "sizes": [format_size(s) for s in self.sizes],
                "loras": [{"name": name, "scale": scale} for name, scale in self.loras],
                "controlnets": list(self.controlnets), "ip_adapters": list(self.ip_adapters),
                "upscalers": list(self.upscalers),
                "embeddings": [{"name": name, "vectors": n} for name, n in self.embeddings],
                "skipped_embeddings": [{"name": name, "reason": why} for name, why in self.skipped_embeddings]}

    @staticmethod
    def from_json(data: Any) -> Offer:
        """A server's description as it came over the network; ValueError names what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"the description must be a JSON object, got {json_type(data)}")
        names = [f.name for f in dataclasses.fields(Offer) if f.default is dataclasses.MISSING]
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
        return Offer(model=data["model"], sizes=sizes, samplers=samplers, default_sampler=data["default_sampler"],
                         preset=data["preset"], presets=names_in(data["presets"], list(RECIPES), "presets"),
                         images_per_call=count, image_format=data["image_format"], max_prompt_chunks=chunks,
                         schedules=schedules, default_schedule=data["default_schedule"], rngs=rngs,
                         default_rng=data["default_rng"], loras=_loras(data.get("loras", [])),
                         controlnets=(controlnets := _controlnets(data.get("controlnets", []))),
                         ip_adapters=_ip_adapters(data.get("ip_adapters", []), controlnets),
                         embeddings=_listed(data.get("embeddings", []), "vectors", int),
                         skipped_embeddings=_listed(data.get("skipped_embeddings", []), "reason", str),
                         upscalers=_upscalers(data.get("upscalers", [])), refiner=_refiner(data.get("refiner")))


def _controlnets(value: Any) -> tuple[str, ...]:
    """The ControlNets a server's description names."""
    if not isinstance(value, list) or len(value) > 64 or not all(
            isinstance(name, str) and NAME.fullmatch(name) and len(name) <= 255 for name in value):
        raise ValueError("controlnets must be a list of names (letters, digits, '.', '_' and '-')")
    return tuple(value)


def _refiner(value: Any) -> str | None:
    if value is not None and not (isinstance(value, str) and 0 < len(value) <= 255):
        raise ValueError("refiner must be null or a name")
    return value


def _ip_adapters(value: Any, controlnets: tuple[str, ...]) -> tuple[str, ...]:
    """Which of a server's unit models are IP-Adapters (one at most)."""
    if not isinstance(value, list) or len(value) > 1 or not all(name in controlnets for name in value):
        raise ValueError("ip_adapters must be a list of at most one of the controlnets' names")
    return tuple(value)


def _upscalers(value: Any) -> tuple[str, ...]:
    """The upscaler models a server's description names (A1111's names: any text but Latent and Lanczos's)."""
    if not isinstance(value, list) or len(value) > 1000 or not all(
            isinstance(name, str) and 0 < len(name) <= 255 and name.isprintable() and name not in UPSCALERS
            for name in value) or len(set(value)) != len(value):
        raise ValueError("upscalers must be a list of distinct names")
    return tuple(value)


def _listed(value: Any, key: str, kind: type) -> tuple[tuple[str, Any], ...]:
    """[{name, key}] of a server's description: its embeddings (key "vectors", 1-75) or those it skipped ("reason")."""
    def one(entry: Any) -> tuple[str, Any]:
        name, other = (entry.get("name"), entry.get(key)) if isinstance(entry, dict) else (None, None)
        fits = (isinstance(other, int) and 1 <= other <= CHUNK_TOKENS if kind is int
                else isinstance(other, str) and len(other) <= 1000)
        if not isinstance(name, str) or not 0 < len(name) <= 255 or type(other) is not kind or not fits:
            raise ValueError(f"embeddings must be a list of {{name, {key}}}")
        return name, other

    if not isinstance(value, list) or len(value) > 10_000:
        raise ValueError(f"embeddings must be a list of {{name, {key}}}")
    return tuple(map(one, value))


def _loras(value: Any) -> tuple[tuple[str, float], ...]:
    """The LoRAs a server's description says it fused: [{name, scale}]."""
    def one(lora: Any) -> tuple[str, float]:
        name, scale = (lora.get("name"), lora.get("scale")) if isinstance(lora, dict) else (None, None)
        if not isinstance(name, str) or not 0 < len(name) <= 255 or isinstance(scale, bool) or not isinstance(
                scale, (int, float)) or not math.isfinite(scale):
            raise ValueError("loras must be a list of {name, scale}")
        return name, float(scale)

    if not isinstance(value, list) or len(value) > 100:
        raise ValueError("loras must be a list of {name, scale}")
    return tuple(map(one, value))


def provisional(settings: Settings) -> Offer:
    """What a server with `settings` offers until its model (or a back end) describes itself: every
    sampler, schedule and noise source; the launch preset's sampler, else SDXL base's (Euler); the
    LoRAs it fuses."""
    recipe, load = settings.recipe, settings.load
    return Offer(model=load.model, sizes=list(load.sizes), samplers=list(SAMPLERS),
                 default_sampler=recipe.sampler if recipe is not None else "Euler",
                 preset=recipe.name if recipe is not None else None, presets=offered_presets(recipe),
                 images_per_call=load.images_per_call, image_format=settings.image_format,
                 max_prompt_chunks=load.max_prompt_chunks, schedules=list(SCHEDULES),
                 default_schedule=settings.schedule, rngs=list(RNGS), default_rng=settings.rng,
                 loras=load.fused_loras, controlnets=load.unit_models, ip_adapters=load.ip_adapter_names)


def offered_presets(recipe: Recipe | None) -> list[str]:
    """The presets a page offers with launch preset `recipe`: that one when it brought its own
    weights (a distilled model has one way to run), else the sampling presets any SDXL model runs."""
    return [recipe.name] if recipe is not None and recipe.brings_weights else list(SAMPLING)
