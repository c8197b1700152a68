"""The errors a request (or a server's start) can meet, as every entry point (API, CLI, playground)
raises them."""

from __future__ import annotations


class RequestError(ValueError):
    """A request the user can fix; its message is what they see."""


class Cancelled(Exception):
    """The work is no longer wanted (the caller's `stop()` said so, or it has gone); the call
    ended between steps."""


class GenerationError(RuntimeError):
    """The pipeline produced something that is not an image (e.g. NaN)."""


class CompileError(RuntimeError):
    """The model loaded, but the programs it needs to serve did not compile (e.g. more device
    memory than the chip has); the message names what failed, the log holds XLA's whole report."""


class DeviceMemoryError(CompileError):
    """The networks to load do not fit a device's memory (each device holds them all); the message
    says what each takes and what to leave out."""
