"""What every compiled program of a pipeline is built for, whatever the image size: the mesh and
the call's batch, the latents' and the texts' shapes, which extras (an IP-Adapter, a refiner) the
programs take; and the batch a call compiles for."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ...request.values import parse_size

if TYPE_CHECKING:  # (jax.Device is the class, exported as a variable a type checker cannot read as a type)
    from jaxlib._jax import Device
else:
    Device = jax.Device
Size = tuple[int, int]  # (width, height) in pixels
BATCH = "batch"  # the mesh axis images are split over


def call_batch(images: int, devices: int) -> int:
    """The compiled batch for `images` per call: rounded up so every device gets as many."""
    return math.ceil(images / devices) * devices


@dataclass(frozen=True)
class Layout:
    """What every program of a pipeline is built for, whatever the size."""
    mesh: Mesh
    batch: int  # images per call, a multiple of the devices
    vae_factor: int  # pixels per latent, each way
    latent_channels: int  # the VAE's
    # An inpainting UNet's input channels beside the latents (the mask and the masked image's
    # latents: latent_channels + 1), 0 for a base UNet.
    condition_channels: int
    chunks: int  # room for the longest prompt, in chunks of 77 tokens
    text_widths: tuple[int, int]  # each text encoder's hidden states' (their context side by side)
    pooled_dim: int
    stepwise: bool  # one denoising step per call (progress, previews, stop), else all steps in one loop

    text_dtype: str = "float32"  # the token embeddings' (textual inversion vectors are given in it)
    image_prompt_size: int = 0  # an IP-Adapter's image encoder's input, each way (0: none)
    # A refiner's programs (REFINER's): the second encoder's context alone, five time ids a pass
    # (the aesthetic score differs), its pooled width; refiner_pooled_dim 0: no refiner.
    refiner: bool = False
    refiner_pooled_dim: int = 0

    @property
    def context_dim(self) -> int:
        return self.text_widths[1] if self.refiner else sum(self.text_widths)

    @property
    def for_refiner(self) -> Layout:
        """The layout of the refiner's programs."""
        return dataclasses.replace(self, refiner=True, pooled_dim=self.refiner_pooled_dim)

    @property
    def batch_sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(BATCH))

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    @property
    def noise_rows(self) -> int:
        """Noisy rows' worth of the host's step noise (RNG CPU) the denoising state holds: one for
        the stepwise loop; for the fused one enough that a call of the default 20 steps takes all
        of it in one transfer and one dispatch (a dispatch per noisy row cost 1.44x a step on a CPU)."""
        return 1 if self.stepwise else 20

    def checked_sizes(self, sizes: Sequence[Size | str]) -> list[Size]:
        """`sizes` as (width, height), each side a positive multiple of the VAE's factor (ValueError)."""
        checked = [parse_size(s) for s in sizes]
        for w, h in checked:
            if w <= 0 or h <= 0 or w % self.vae_factor or h % self.vae_factor:
                raise ValueError(f"size {w}x{h}: width and height must be positive multiples of {self.vae_factor}")
        return checked

    def latent_shape(self, size: tuple[int, int]) -> tuple[int, int, int]:
        """(h, w, C) of one image's latents at `size` (width, height)."""
        return size[1] // self.vae_factor, size[0] // self.vae_factor, self.latent_channels

    def condition_shape(self, size: tuple[int, int]) -> tuple[int, int, int]:
        """An image's condition (sampler_update.State.condition): one unused channel for a base UNet."""
        return (*self.latent_shape(size)[:2], max(self.condition_channels, 1))
