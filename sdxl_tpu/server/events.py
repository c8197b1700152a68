"""What a request's work reports as it goes: one small type per meaning, read by name (as
k-diffusion's callback hands a dict with named keys), matched by type.

    an engine's Ticket reports          Progress, Preview (the images), then Ended
    the server's stream yields          Started, Progress, Shown (the previews' files), Called (a run
                                        of several calls: after each), then Done
    a back end's generation queues      Accepted, Progress, Preview, then Result or Failed
                                        (and its HTTP side waits for one: Keepalive when none came)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Started:
    """The request is checked: the seeds it will make, its denoising steps (a call's), whether it
    waits for a program still compiling (the first call of its kind at its size on a new server),
    the calls it makes (A1111's Batch count, an X/Y/Z plot's), and the steps of them all as far as
    they are known before they run (0: `steps` each)."""
    seeds: list[int]
    steps: int
    compiling: bool = False
    calls: int = 1
    total: int = 0

    @property
    def all_steps(self) -> int:
        return self.total or self.steps * self.calls


@dataclass(frozen=True)
class Progress:
    """After each denoising step (in a run of several calls: counted over them all, in `call` of
    `calls`)."""
    step: int
    steps: int
    call: int = 1
    calls: int = 1


@dataclass(frozen=True)
class Preview:
    """Live previews, now and then: the request's images at `step` (uint8 arrays, or a back end's
    JPEG files)."""
    step: int
    steps: int
    images: Any


@dataclass(frozen=True)
class Ended:
    """The ticket's outcome (images, failure or cancellation) is ready to take."""


@dataclass(frozen=True)
class Shown:
    """Live previews written for the page: (path, caption) each."""
    gallery: list[tuple[str, str]]


@dataclass(frozen=True)
class Done:
    """The images written, (path, caption) each; their seeds; the summary line (markdown); what
    ran, as the form names it (sampler, schedule, rng)."""
    gallery: list[tuple[str, str]]
    seeds: list[int]
    summary: str
    ran: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Called:
    """A call of a run of several is done: its images (`done`), and which call it was (`call` of
    `calls`, from 1)."""
    done: Done
    call: int
    calls: int


@dataclass(frozen=True)
class Accepted:
    """A back end's generation is checked and queued."""


@dataclass(frozen=True)
class Result:
    """A back end's answer: its JSON body."""
    body: dict[str, Any]


@dataclass(frozen=True)
class Failed:
    """A back end's refusal or failure: HTTP status, message, Retry-After seconds (None: none)."""
    status: int
    message: str
    retry_after: int | None = None


@dataclass(frozen=True)
class Keepalive:
    """Nothing new for a while: the work goes on."""


BackendEvent = Accepted | Progress | Preview | Result | Failed | Keepalive
