"""Presets of how to generate: model weights, sampler, spacing, steps, guidance and size that go
together, by the names SDXL users know ("Lightning 4-step", "Turbo", "Quality ...").

Two kinds. Sampling presets only choose sampler, steps and guidance: any SDXL model runs them, and
the playground offers them in a menu. Model presets also bring their own weights (SDXL-Lightning's
distilled UNet over SDXL base, SDXL-Turbo's checkpoint): chosen at launch (`--preset`), as weights
are loaded once.
"""

from __future__ import annotations

from dataclasses import dataclass

from .names import SDXL_BASE as BASE

LIGHTNING = "ByteDance/SDXL-Lightning"


@dataclass(frozen=True)
class Recipe:
    name: str
    sampler: str
    steps: int
    guidance: float
    model: str | None = None            # weights it needs (None: whatever model is loaded)
    unet: str | None = None             # a UNet weights file over `model`
    spacing: str | None = None          # timestep spacing (None: the scheduler config's)
    prediction_type: str | None = None  # what the UNet predicts (None: the scheduler config's)
    size: str | None = None             # its native size (None: the app's default)
    lora: str | None = None             # a LoRA fused at load, "file[:scale]" (when no --lora is given)

    @property
    def brings_weights(self) -> bool:
        return self.model is not None or self.unet is not None or self.lora is not None

    @property
    def summary(self) -> str:
        guidance = "no guidance" if self.guidance <= 1 else f"guidance {self.guidance:g}"
        return f"{self.steps} steps of {self.sampler}, {guidance}"


def _lightning(steps: int) -> Recipe:
    # ByteDance's recipe: Euler, trailing spacing, no guidance; the 1-step UNet predicts x0.
    x0 = steps == 1
    return Recipe(f"Lightning {steps}-step", "Euler", steps, 0.0, model=BASE,
                  unet=f"{LIGHTNING}/sdxl_lightning_{steps}step_unet{'_x0' if x0 else ''}.safetensors",
                  spacing="trailing", prediction_type="sample" if x0 else None, size="1024x1024")


RECIPES: dict[str, Recipe] = {r.name: r for r in [
    Recipe("Quality", "DPM++ 2M Karras", 30, 5.0),
    Recipe("Balanced", "Euler", 20, 5.0),
    Recipe("Fast", "DPM++ 2M Karras", 12, 5.0),
    *(_lightning(n) for n in (1, 2, 4, 8)),
    # SDXL-Turbo: 512x512, 1 to 4 steps, Euler ancestral with trailing spacing, no guidance.
    Recipe("Turbo", "Euler a", 1, 0.0, model="stabilityai/sdxl-turbo", spacing="trailing", size="512x512"),
    # LCM-LoRA over SDXL base, as its authors run it: LCMScheduler, 4 steps, no guidance.
    Recipe("LCM-LoRA 4-step", "LCM", 4, 1.0, model=BASE,
           lora="latent-consistency/lcm-lora-sdxl/pytorch_lora_weights.safetensors", size="1024x1024"),
]}
SAMPLING = [name for name, r in RECIPES.items() if not r.brings_weights]


def recipe_named(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"no preset {name!r}; presets: {', '.join(RECIPES)}") from None


# What a generation uses when neither the user nor a preset says otherwise (the weights a preset
# brings are LoadOptions.of's business).
DEFAULTS = dict(sampler=None, steps=20, guidance=5.0, size="1024x1024")


def settle(recipe: Recipe | None, **given) -> dict:
    """Each of DEFAULTS' settings: as given (not None), else the preset's, else the default."""
    out = {}
    for key, default in DEFAULTS.items():
        value = given.get(key)
        if value is None and recipe is not None:
            value = getattr(recipe, key)
        out[key] = default if value is None else value
    return out
