"""What goes wrong with weights, in words for the user (no JAX: a front end reports them too)."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint does not match the model it is loaded into, or cannot be found."""


class PreviewDecoderError(CheckpointError):
    """The TAESD preview decoder asked for could not be loaded (the message says what to do)."""


class IPAdapterError(CheckpointError):
    """An IP-Adapter file, or the image encoder it needs, that cannot be used (the message says why)."""


class RefinerError(CheckpointError):
    """A refiner that cannot be used with the model (the message says why)."""
