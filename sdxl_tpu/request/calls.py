"""A request for more images than one call makes (A1111's Batch count and its API's n_iter, OpenAI's
n), as the calls that make them: a call's worth of images each, the seeds following on."""

from __future__ import annotations

import dataclasses

from .fields import MAX_SEED
from .request import Request


def split(request: Request, count: int, per_call: int) -> list[Request]:
    """The requests of `count` images, at most `per_call` each, image i of them seeded seed + i."""
    parts = []
    for start in range(0, count, per_call):
        n = min(per_call, count - start)
        seed = (request.seed + start) % (MAX_SEED + 1) if isinstance(request.seed, int) else request.seed
        parts.append(dataclasses.replace(request, seed=seed, count=n))
    return parts
