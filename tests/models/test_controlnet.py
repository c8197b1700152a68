"""ControlNet for SDXL against diffusers' ControlNetModel on the same random weights: its residuals
(weight, guess mode, the smaller variants' configs, BGR control images, pooled conditions) and the
UNet's output with them added, as diffusers' UNet2DConditionModel takes them."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from reference import SMALL_UNET, fill_zeros, nchw_to_nhwc, perturb_norms, rel_l2
from sdxl_tpu.models.controlnet import ControlNetConfig, guess_mode_ramp
from sdxl_tpu.models.layers import Precision
from sdxl_tpu.models.unet import ControlResiduals
from sdxl_tpu.weights.checkpoint import load_unet
from sdxl_tpu.weights.controlnets import load_controlnet

TOL = 1e-4
F32 = Precision()
UNET = SMALL_UNET
POOLED, LATENT = 32, (16, 16)
# The ControlNet's own settings beside the UNet's copied config: SDXL's full ControlNet, the "mid" and
# "small" variants' shapes (fewer transformer layers, none in a block; a mid block without attention),
# and the rarer options.
VARIANTS = {
    "full": {},
    "mid-like": dict(transformer_layers_per_block=[0, 0, 1]),
    "small-like": dict(transformer_layers_per_block=[0, 0, 0], mid_block_type="UNetMidBlock2D"),
    "bgr-pooled": dict(controlnet_conditioning_channel_order="bgr", global_pool_conditions=True,
                       conditioning_embedding_out_channels=[8, 8, 16, 24]),
}


def _reference_unet(tmp_path):
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    unet = perturb_norms(UNet2DConditionModel(addition_embed_type="text_time", **UNET))
    unet.save_pretrained(tmp_path / "unet")
    return unet


def _reference_controlnet(unet, variant: str, tmp_path, seed: int = 1):
    from diffusers import ControlNetModel

    torch.manual_seed(seed)
    config = {k: v for k, v in UNET.items() if k != "up_block_types"}
    config.update(VARIANTS[variant])
    model = perturb_norms(fill_zeros(ControlNetModel(addition_embed_type="text_time", **config), seed, 0.1))
    model.save_pretrained(tmp_path / f"controlnet-{variant}-{seed}")
    return model, load_controlnet(tmp_path / f"controlnet-{variant}-{seed}", F32)


def _inputs(batch: int = 2):
    gen = torch.Generator().manual_seed(0)
    h, w = LATENT
    return dict(sample=torch.randn(batch, 4, h, w, generator=gen),
                timesteps=torch.tensor([999.0, 321.5])[:batch],
                context=torch.randn(batch, 7, UNET["cross_attention_dim"], generator=gen),
                text_embeds=torch.randn(batch, POOLED, generator=gen),
                time_ids=torch.tensor([[1024, 1024, 0, 0, 1024, 1024], [768, 1344, 16, 32, 1024, 1024]],
                                      dtype=torch.float32)[:batch],
                image=torch.rand(batch, 3, h * 8, w * 8, generator=gen))


def _ours(controlnet, x, scales):
    return controlnet(jnp.asarray(nchw_to_nhwc(x["sample"])), jnp.asarray(x["timesteps"].numpy()),
                      jnp.asarray(x["context"].numpy()), jnp.asarray(x["text_embeds"].numpy()),
                      jnp.asarray(x["time_ids"].numpy()), jnp.asarray(nchw_to_nhwc(x["image"])),
                      jnp.asarray(scales, jnp.float32))


def _theirs(controlnet, x, scale: float, guess_mode: bool = False):
    with torch.no_grad():
        return controlnet(x["sample"], x["timesteps"], x["context"], x["image"], conditioning_scale=scale,
                          guess_mode=guess_mode, return_dict=False,
                          added_cond_kwargs=dict(text_embeds=x["text_embeds"], time_ids=x["time_ids"]))


# Guess mode's ramp on the full ControlNet, and not on a pooled one (diffusers ramps no pooled conditions).
@pytest.mark.parametrize("variant, guess_mode", [*((v, False) for v in VARIANTS), ("full", True), ("bgr-pooled", True)])
def test_controlnet_residuals_match_diffusers(variant, guess_mode, tmp_path):
    unet = _reference_unet(tmp_path)
    theirs_model, ours_model = _reference_controlnet(unet, variant, tmp_path)
    config = ours_model.config
    assert isinstance(config, ControlNetConfig) and config.mid_attention == (variant != "small-like")
    x, weight = _inputs(), 0.7
    down, mid = _theirs(theirs_model, x, weight, guess_mode)
    assert len(down) + 1 == config.residuals
    pooled = config.global_pool_conditions
    # diffusers ramps guess mode's factors only where conditions are not pooled.
    ramp = guess_mode_ramp(config.residuals) if guess_mode and not pooled else [1.0] * config.residuals
    ours = _ours(ours_model, x, np.tile(np.array(ramp) * weight, (2, 1)))
    for i, (a, b) in enumerate(zip([*ours.down, ours.mid], [*down, mid], strict=True)):
        err = rel_l2(a, nchw_to_nhwc(b))
        assert err <= TOL, (variant, i, err)
    assert float(jnp.abs(ours.mid).max()) > 0  # (the random zero convolutions made it count)


def test_unet_with_two_controlnets_matches_diffusers(tmp_path):
    """Two ControlNets, each with its own weight and image (diffusers' MultiControlNetModel sums
    their residuals), then the UNet with them: its output, and a row whose weights are 0 (outside its
    steps) is the UNet's own output."""
    unet = _reference_unet(tmp_path)
    ours_unet = load_unet(tmp_path / "unet", F32)
    nets = [_reference_controlnet(unet, "full", tmp_path, seed=1), _reference_controlnet(unet, "mid-like", tmp_path,
                                                                                         seed=2)]
    x = _inputs()
    images = [x["image"], torch.rand(x["image"].shape, generator=torch.Generator().manual_seed(5))]
    weights = [0.8, 0.5]
    down_sum, mid_sum = None, None
    for (theirs_model, _), image, weight in zip(nets, images, weights, strict=True):
        down, mid = _theirs(theirs_model, {**x, "image": image}, weight)
        down_sum = down if down_sum is None else [a + b for a, b in zip(down_sum, down, strict=True)]
        mid_sum = mid if mid_sum is None else mid_sum + mid
    with torch.no_grad():
        ref = unet(x["sample"], x["timesteps"], x["context"],
                   added_cond_kwargs=dict(text_embeds=x["text_embeds"], time_ids=x["time_ids"]),
                   down_block_additional_residuals=down_sum, mid_block_additional_residual=mid_sum).sample
        plain = unet(x["sample"], x["timesteps"], x["context"],
                     added_cond_kwargs=dict(text_embeds=x["text_embeds"], time_ids=x["time_ids"])).sample

    residuals = []
    for (_, ours_model), image, weight in zip(nets, images, weights, strict=True):
        n = ours_model.config.residuals
        scales = np.array([[weight] * n, [0.0] * n])  # the second row: past its end step
        residuals.append(_ours(ours_model, {**x, "image": image}, scales))
    control = ControlResiduals(tuple(sum(d) for d in zip(*(r.down for r in residuals), strict=True)),
                               sum(r.mid for r in residuals))
    out = ours_unet(jnp.asarray(nchw_to_nhwc(x["sample"])), jnp.asarray(x["timesteps"].numpy()),
                    jnp.asarray(x["context"].numpy()), jnp.asarray(x["text_embeds"].numpy()),
                    jnp.asarray(x["time_ids"].numpy()), control=control)
    assert rel_l2(out[0], nchw_to_nhwc(ref)[0]) <= TOL
    assert rel_l2(out[1], nchw_to_nhwc(plain)[1]) <= TOL
    assert rel_l2(nchw_to_nhwc(ref)[0], nchw_to_nhwc(plain)[0]) > 1e-2  # the ControlNets changed it


def test_controlnet_config_errors_name_the_key():
    base = {**{k: v for k, v in UNET.items() if k != "up_block_types"}, "addition_embed_type": "text_time"}
    with pytest.raises(ValueError, match="mid_block_type"):
        ControlNetConfig.from_dict({**base, "mid_block_type": "UNetMidBlock2DSimpleCrossAttn"})
    with pytest.raises(ValueError, match="controlnet_conditioning_channel_order"):
        ControlNetConfig.from_dict({**base, "controlnet_conditioning_channel_order": "yuv"})
    with pytest.raises(ValueError, match="down_block_types"):
        ControlNetConfig.from_dict({k: v for k, v in base.items() if k != "down_block_types"})
