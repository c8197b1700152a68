"""Presets: what each bundles, and which of them a sampler table and the request rules accept."""

from __future__ import annotations

import pytest

from sdxl_tpu.sampler.from_config import samplers_for
from sdxl_tpu.request.names import SAMPLERS
from sdxl_tpu.request.recipes import RECIPES, SAMPLING, recipe_named, settle
from sdxl_tpu.request.request import Request


def test_every_preset_is_a_valid_request_for_its_sampler_table():
    for recipe in RECIPES.values():
        assert recipe.sampler in SAMPLERS
        Request.of("a cat", steps=recipe.steps, guidance_scale=recipe.guidance, sampler=recipe.sampler,
                   size=recipe.size or "1024x1024")
        config = {"timestep_spacing": recipe.spacing or "leading",
                  "prediction_type": recipe.prediction_type or "epsilon"}
        assert recipe.sampler in samplers_for(config)[0], recipe.name


def test_lightning_and_turbo_as_published():
    one, four = recipe_named("Lightning 1-step"), recipe_named("Lightning 4-step")
    assert one.unet == "ByteDance/SDXL-Lightning/sdxl_lightning_1step_unet_x0.safetensors"
    assert one.prediction_type == "sample" and four.prediction_type is None
    assert (four.sampler, four.spacing, four.steps, four.guidance) == ("Euler", "trailing", 4, 0.0)
    turbo = recipe_named("Turbo")
    assert (turbo.model, turbo.sampler, turbo.spacing, turbo.size, turbo.guidance) == (
        "stabilityai/sdxl-turbo", "Euler a", "trailing", "512x512", 0.0)
    assert SAMPLING == ["Quality", "Balanced", "Fast"]
    assert recipe_named("Quality").summary == "30 steps of DPM++ 2M Karras, guidance 5"
    with pytest.raises(ValueError, match="no preset 'x'"):
        recipe_named("x")


def test_settle_prefers_what_is_given_then_the_preset_then_the_default():
    assert settle(None) == {"sampler": None, "steps": 20, "guidance": 5.0, "size": "1024x1024"}
    s = settle(recipe_named("Turbo"), steps=3)
    assert (s["steps"], s["sampler"], s["guidance"], s["size"]) == (3, "Euler a", 0.0, "512x512")


def test_what_a_preset_loads_unless_options_say_otherwise():
    from sdxl_tpu.request.load import LoadOptions

    assert LoadOptions.of({}).model == "stabilityai/stable-diffusion-xl-base-1.0"
    turbo = LoadOptions.of({"timestep_spacing": "leading"}, recipe_named("Turbo"))
    assert (turbo.model, turbo.timestep_spacing, turbo.unet) == ("stabilityai/sdxl-turbo", "leading", None)
    lightning = LoadOptions.of({"model": "/m/base"}, recipe_named("Lightning 1-step"))
    assert (lightning.model, lightning.unet, lightning.timestep_spacing, lightning.prediction_type) == (
        "/m/base", "ByteDance/SDXL-Lightning/sdxl_lightning_1step_unet_x0.safetensors", "trailing", "sample")


def test_the_lcm_preset_brings_its_lora_unless_one_is_given():
    from sdxl_tpu.server.settings import parse_settings

    lcm = recipe_named("LCM-LoRA 4-step")
    assert (lcm.sampler, lcm.steps, lcm.guidance, lcm.brings_weights) == ("LCM", 4, 1.0, True)
    assert parse_settings(["--preset", lcm.name], env={}).load.loras == (lcm.lora,)
    assert parse_settings(["--preset", lcm.name, "--lora", "mine.safetensors:0.5"],
                          env={}).load.loras == ("mine.safetensors:0.5",)
    assert parse_settings([], env={}).load.loras == ()
    assert "LCM-LoRA 4-step" not in SAMPLING  # it needs its weights: chosen at launch, not in the page's menu
