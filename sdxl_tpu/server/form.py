"""The playground's form (its fields are request/fields.py's): the values as a client sends them,
checked into one Request with the style applied; the example prompts; the seed or file of a picked
gallery image; a prompt's token count."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..a1111.dynamic_prompts import Wildcards
from ..request.control import form_unit
from ..request.errors import RequestError
from ..request.fields import FIELD, FIELDS, FORM, MAX_PROMPT_CHARS
from ..a1111.prompts import CHUNK_TOKENS, EmbeddingNames, NetworkTag, chunk_prompt, split_network_tags
from ..request.request import NO_WILDCARDS, Request
from ..request.styles import MAX_STYLED_PROMPT_CHARS, apply_style, style_entry
from ..request.values import choice_input, json_type, number_input, seed_input, text_input
from .errors import log_refusal
from .offer import Offer


EXAMPLES = [
    "A majestic lion jumping from a big stone at night",
    "An astronaut riding a green horse",
    "A red panda reading a book in a cozy library, warm light",
    "A lighthouse on a cliff during a storm, dramatic waves",
]


def picked_item(items: Any, index: Any) -> Any:
    """What the page keeps of the gallery image at `index` (from a select event): its seed, or its
    file; None if there is none."""
    if isinstance(index, bool) or not isinstance(index, int) or not isinstance(items, list):
        return None
    return items[index] if 0 <= index < len(items) else None


def form_values(values: Sequence[Any]) -> dict[str, Any]:
    """The form's fields as the page and /generate send them (fields.FORM's order; the optional ones
    may be left out), by name."""
    return dict(zip(FORM, values))


def validate(values: Mapping[str, Any], offer: Offer, read_file: Callable[[Any, str], bytes] | None = None,
             wildcards: Wildcards | None = NO_WILDCARDS, each: Mapping[str, list] | None = None) -> Request:
    """The form's fields as a client sent them (JSON values, by name) as one checked Request with
    the style applied, for what `offer` offers. A form has one value per field: lists are refused,
    not taken per image. An optional field left out (or null) is the offer's default: its sampler,
    Schedule type and RNG; the Schedule type is checked with the sampler that will run it. The seed
    is drawn at random where it is -1 (as in A1111) or Randomize is on (the page's switch of old,
    which API clients may still send). The image is a file object of the page's upload, read by
    `read_file(value, label)` (uploads.Uploads.read; None: no image is taken); without one, the
    strength and resize mode the form always sends are not used. `wildcards`: the server's (None:
    a front end's prompts, made by its back end). `each`: what the server makes per image (an X/Y/Z
    plot's call), by API name: prompts (their styles applied), seeds, guidance, and `count`."""
    fallback = offer.defaults()
    # Left out or null (every field but the prompt may be): the offer's default, else the field's.
    v = {f.name: fallback.get(f.name, f.default) if f.optional and values.get(f.name) is None else values.get(f.name)
         for f in FIELDS}
    for switch in ("hires", "refiner"):
        if not isinstance(v[switch], (bool, type(None))):
            raise RequestError(f"{FIELD[switch].label} must be true or false, got {json_type(v[switch])}.")
    style_entry(v["style"])  # an unknown style is refused before the rest is checked
    randomize, seed = v["randomize"], v["seed"]
    if not isinstance(randomize, bool):
        raise RequestError(f"{FIELD['randomize'].label} must be true or false, got {json_type(randomize)}.")
    if not (randomize and seed is None):  # a cleared seed field does not matter when the seed is drawn
        seed_input(seed, FIELD["seed"].label)
    given: dict[str, Any] = {f.api: v[f.name] for f in FIELDS if f.api}
    # The page always sends the image's settings, the mask's and the hires fix's: checked all the
    # same, then not used without the image (and the mask), or with the hires fix off.
    for name, needed in ((f.api, f.needs) for f in FIELDS if f.needs and f.api):
        if given[name] is not None and not all(v[other] for other in needed):  # (by the form's names)
            f = FIELD[name]
            if f.limits:
                number_input(given[name], f.label, *f.limits, whole=f.kind == "whole")
            else:
                choice_input(given[name], f.label, f.choices or ())
            given[name] = None
    if given["image"] is not None and read_file is None:
        raise RequestError(f"{FIELD['image'].label}: this server takes no images.")
    for name in ("image", "mask"):  # (a mask without its image is refused by name, unread)
        if given[name] is not None and given["image"] is not None and read_file is not None:
            given[name] = read_file(given[name], FIELD[name].label)
    request = Request.of(**{**given, "seed": None if randomize else seed, **(each or {})}, sizes=offer.sizes,
                         samplers=offer.samplers, per_image=each is not None,
                         controlnet=form_unit(v, offer.controlnets, read_file), controlnets=offer.controlnets,
                         ip_adapters=offer.ip_adapters, upscalers=offer.upscalers, wildcards=wildcards,
                         max_chars=MAX_PROMPT_CHARS if each is None else MAX_STYLED_PROMPT_CHARS)
    if each is not None:
        return request  # (its prompts styled already, each image's own)
    # The style wraps what the user typed (their text is what the length limit applies to).
    if not isinstance(request.prompt, str) or not isinstance(request.negative_prompt, str):
        raise TypeError("a form's request has one prompt for all its images")  # (per_image=False)
    prompt, negative = apply_style(v["style"], request.prompt, request.negative_prompt)
    return dataclasses.replace(request, prompt=prompt, negative_prompt=negative)


def batch_count(values: Mapping[str, Any]) -> int:
    """The calls a run makes (the Batch count field; left out or null: one)."""
    f, value = FIELD["batch_count"], values.get("batch_count")
    return 1 if value is None else int(number_input(value, f.label, *f.bounds, whole=True))


def token_count(tokenizer: Any, chunks: int, prompt: Any, style: Any, unavailable: str,
                loras: Sequence[tuple[str, float]] = (), embeddings: Sequence[tuple[str, int]] = ()) -> str:
    """Markdown: how many of the encoder's tokens the prompt takes with the style's template
    applied (as it will be encoded; start and end tokens not counted, as A1111 counts; an
    embedding's vectors counted as its tokens), and a warning when it will be cut or is too long to
    be accepted; `unavailable` without a tokenizer. A line follows for each textual inversion
    embedding named (`embeddings`: (name, vectors) of those here), and for each `<lora:name:weight>`
    tag typed (never encoded): whether that LoRA is among those fused here (`loras`: (name, scale))."""
    try:
        text, tags = split_network_tags(text_input(prompt, "Prompt"))
        template = style_entry(style)[0]
    except RequestError as e:
        log_refusal("token count", e)
        return f"⚠️ {e}"
    count, named = _count(tokenizer, chunks, text, template, unavailable, tuple(embeddings))
    vectors, code = dict(embeddings), lambda name: "`" + name[:60].replace("`", "'") + "`"
    lines = [f"Embedding {code(name)}: {vectors[name]} vector{'s' if vectors[name] > 1 else ''}." for name in named]
    if embeddings and not named:  # (what the page lists of them, under the prompt, on the count's line)
        more = f" and {len(embeddings) - MAX_LISTED} more" if len(embeddings) > MAX_LISTED else ""
        count += f" · embeddings: {', '.join(code(name) for name, _ in embeddings[:MAX_LISTED])}{more}"
    return "  \n".join([count, *lines[:MAX_TAG_LINES], *network_lines(tags, dict(loras))])


@functools.lru_cache(maxsize=4)
def _embedding_names(tokenizer: Any, embeddings: tuple[tuple[str, int], ...]) -> EmbeddingNames:
    return EmbeddingNames.of(tokenizer, dict(embeddings))


def _count(tokenizer: Any, chunks: int, text: str, template: str, unavailable: str,
           embeddings: tuple[tuple[str, int], ...]) -> tuple[str, list[str]]:
    """The count's line, and the embeddings the text names."""
    limit = CHUNK_TOKENS * chunks
    if not text:
        return f"0 / {limit} tokens", []
    if tokenizer is None:
        return unavailable, []
    try:
        names = _embedding_names(tokenizer, embeddings) if embeddings else None
        encoded = chunk_prompt(tokenizer, template.replace("{prompt}", text), chunks, names)
    except Exception as e:  # (a tokenizer's surprise must not break typing)
        log_refusal("token count", e)
        return "No token count for this text.", []
    used = f"{encoded.count} chunk{'s' if encoded.count > 1 else ''}"
    if encoded.cut:
        return (f"⚠️ **{encoded.tokens + encoded.cut} / {limit} tokens**, {used}: the prompt will be cut after "
                f"token {limit}; the last {encoded.cut} are ignored.", encoded.embeddings)
    return f"{encoded.tokens} / {limit} tokens" + (f", {used}" if encoded.count > 1 else ""), encoded.embeddings


MAX_TAG_LINES = 5  # (a prompt may hold thousands of tags: the count stays a few lines)
MAX_LISTED = 12  # the embeddings listed by name under an empty prompt


def network_lines(tags: Sequence[NetworkTag], fused: Mapping[str, float]) -> list[str]:
    """A line per extra network named in the prompt (each once): a LoRA fused here, at which
    scale (a tag's weight does not change it), or not loaded here."""
    named = list({(t.kind, t.name): t for t in tags}.values())
    lines = []
    for tag in named[:MAX_TAG_LINES]:
        name = "`" + tag.name[:60].replace("`", "'") + "`"  # (the user's text, as code: no Markdown)
        if tag.kind == "hypernet":
            lines.append(f"Hypernetwork {name}: not applied (this server loads LoRAs only).")
        elif tag.name not in fused:
            lines.append(f"LoRA {name}: not loaded here (start the server with --lora to fuse it).")
        else:
            scale, weight = fused[tag.name], 1.0 if tag.weight is None else tag.weight
            unused = "" if weight == scale else f" (the tag's {weight:g} is not applied: LoRAs are fused at start)"
            lines.append(f"LoRA {name}: loaded, fused at {scale:g}{unused}.")
    if len(named) > MAX_TAG_LINES:
        lines.append(f"… and {len(named) - MAX_TAG_LINES} more tags.")
    return lines
