"""A request's prompts read as dynamic prompts' templates (a1111/dynamic_prompts.py): checked
before any work (every wildcard a template can reach looked up), then each image's own prompt made
from its seed, or the combinations in order, keeping the template for its parameters text."""

from __future__ import annotations

from ..a1111.dynamic_prompts import Wildcards, checked_template, draw, first_combinations, is_dynamic
from .errors import RequestError
from .names import PROMPT_MODES


def checked_prompts(texts: dict[str, str | tuple[str, ...]], wildcards: Wildcards | None) -> None:
    """checked_template on each field's text (or its texts, one an image), by its label, which
    leads the refusal's message."""
    for label, text in texts.items():
        for template in (text if isinstance(text, tuple) else (text,)):
            try:
                checked_template(template, wildcards)
            except RequestError as e:
                raise RequestError(f"{label}: {e}") from None


def image_prompts(template: str, seeds: list[int], wildcards: Wildcards, mode: str) -> list[str] | None:
    """The prompt of each image (one seed each) in `mode` (names.PROMPT_MODES), None where the template is
    plain text (or the mode Off): every image's prompt is the template. Combinatorial: the
    combinations in order, from the first again when the images outnumber them."""
    if mode == PROMPT_MODES[0] or not is_dynamic(template):
        return None
    if mode == PROMPT_MODES[1]:
        return [draw(template, seed, wildcards) for seed in seeds]
    made = first_combinations(template, wildcards, len(seeds))
    return [made[i % len(made)] for i in range(len(seeds))]


def made_prompts(templates: list[str], shared: bool, seeds: list[int], wildcards: Wildcards | None,
                 mode: str) -> tuple[list[str], list[str | None]]:
    """A call's prompts from its images' `templates` (one each; `shared`: one template for all, so
    Combinatorial takes its combinations in order; else each image's first), and each image's
    template where its prompt was made from one (else None). Without `wildcards` the prompts are
    made by the server they are sent to: the templates, as they are."""
    if wildcards is None:
        return templates, [None] * len(seeds)
    if shared:
        made = image_prompts(templates[0], seeds, wildcards, mode)
        return (templates, [None] * len(seeds)) if made is None else (made, list[str | None](templates))
    each = [image_prompts(t, [s], wildcards, mode) for t, s in zip(templates, seeds)]
    return ([t if m is None else m[0] for t, m in zip(templates, each)],
            [None if m is None else t for t, m in zip(templates, each)])
