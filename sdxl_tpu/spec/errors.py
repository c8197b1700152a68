"""The errors a request can meet, as every entry point (API, CLI, playground) raises them."""

from __future__ import annotations


class RequestError(ValueError):
    """A request the user can fix; its message is what they see."""


class Cancelled(Exception):
    """The work is no longer wanted (the caller's `stop()` said so, or it has gone); the call
    ended between steps."""


class GenerationError(RuntimeError):
    """The pipeline produced something that is not an image (e.g. NaN)."""
