"""sdxl_tpu.bench.flops: each counted primitive against a hand count, and the presets' UNet and VAE
against PyTorch's own FLOP counter run over diffusers' models (an independent count)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from sdxl_tpu.bench.flops import function_flops, model_flops
from sdxl_tpu.models.attention import attention
from sdxl_tpu.weights.architectures import architecture_configs

f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)


def test_dot_general_is_twice_output_times_contraction():
    assert function_flops(lambda x, w: x @ w, f32(3, 5, 7), f32(7, 11)) == 2 * (3 * 5 * 11) * 7
    # Batch dimensions are in the output, not in the contraction.
    batched = lambda a, b: jnp.einsum("bij,bjk->bik", a, b)
    assert function_flops(batched, f32(2, 3, 4), f32(2, 4, 5)) == 2 * (2 * 3 * 5) * 4
    # Contracting two dimensions at once.
    two = lambda a, b: jnp.einsum("ijk,jkl->il", a, b)
    assert function_flops(two, f32(3, 4, 5), f32(4, 5, 6)) == 2 * (3 * 6) * (4 * 5)


def test_element_wise_work_is_not_counted():
    assert function_flops(lambda x: jnp.tanh(x * 2 + 1).sum() / jax.nn.softmax(x).max(), f32(64, 64)) == 0


def test_conv_is_twice_output_times_window_times_input_channels():
    conv = lambda x, k: lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    assert function_flops(conv, f32(2, 8, 8, 3), f32(3, 3, 3, 16)) == 2 * (2 * 8 * 8 * 16) * (3 * 3 * 3)
    # The layout does not matter: the same convolution in PyTorch's NCHW / OIHW.
    conv_nchw = lambda x, k: lax.conv_general_dilated(x, k, (1, 1), "SAME")
    assert function_flops(conv_nchw, f32(2, 3, 8, 8), f32(16, 3, 3, 3)) == 2 * (2 * 8 * 8 * 16) * (3 * 3 * 3)


def test_grouped_conv_counts_the_input_channels_of_one_group():
    # 8 input channels in 4 groups of 2, 12 output channels, 3x3, stride 2, no padding: 7x7 -> 3x3.
    conv = lambda x, k: lax.conv_general_dilated(x, k, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                                 feature_group_count=4)
    assert function_flops(conv, f32(1, 7, 7, 8), f32(3, 3, 2, 12)) == 2 * (1 * 3 * 3 * 12) * (3 * 3 * 2)


@pytest.mark.parametrize("expensive_first", [True, False])
def test_cond_counts_its_most_expensive_branch(expensive_first):
    matmul, cheap = (lambda x, w: x @ w @ w), (lambda x, w: x @ w)
    branches = (matmul, cheap) if expensive_first else (cheap, matmul)
    fn = lambda p, x, w: lax.cond(p, *branches, x, w)
    assert function_flops(fn, jax.ShapeDtypeStruct((), jnp.bool_), f32(4, 8), f32(8, 8)) == 2 * (2 * 4 * 8 * 8)


def test_sub_programs_count_once_per_call_and_scan_bodies_once_per_iteration():
    inner = jax.jit(lambda x, w: x @ w)
    assert function_flops(lambda x, w: inner(inner(x, w), w), f32(4, 8), f32(8, 8)) == 2 * (2 * 4 * 8 * 8)
    scan = lambda x, w: lax.scan(lambda c, _: (c @ w, None), x, None, length=6)[0]
    assert function_flops(scan, f32(4, 8), f32(8, 8)) == 6 * (2 * 4 * 8 * 8)


@pytest.mark.parametrize("kernel", ["auto", "xla"])
def test_attention_counts_two_products_whichever_kernel(kernel):
    # (batch, length, heads, head_dim): q k^T and (softmax) v, each 2 * b * h * L * L * d.
    b, length, heads, d = 2, 256, 4, 32
    q = f32(b, length, heads, d)
    flops = function_flops(lambda q, k, v: attention(q, k, v, kernel=kernel), q, q, q)
    assert flops == 2 * (2 * b * heads * length * length * d)


def _torch_flops(preset: str) -> dict[str, int]:
    """PyTorch's FlopCounterMode over diffusers' UNet2DConditionModel and AutoencoderKL, built from
    the same config dicts on the meta device (shapes only: nothing is allocated or computed).

    FlopCounterMode counts what we count: mm/addmm/bmm as 2*M*N*K (bias additions left out) and
    convolution as 2 * output elements * kh * kw * in_channels / groups. Attention runs through
    F.scaled_dot_product_attention, which off-GPU takes the math path, two bmm (q k^T, then
    weights x v), counted as 2*b*h*Lq*Lk*d each; a fused SDPA kernel would be counted by the
    same formula. Norms, activations, softmax, upsampling and the sinusoidal embeddings are not
    counted on either side.
    """
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    from torch.utils.flop_counter import FlopCounterMode

    c = architecture_configs(preset)
    w, h = c["size"]
    unet_cfg = c["unet"]
    pooled = unet_cfg["projection_class_embeddings_input_dim"] - 6 * unet_cfg["addition_time_embed_dim"]
    factor = 2 ** (len(c["vae"]["block_out_channels"]) - 1)
    with torch.device("meta"):
        unet = diffusers.UNet2DConditionModel.from_config(unet_cfg)
        vae = diffusers.AutoencoderKL.from_config(c["vae"])
        latents = torch.empty(1, 4, h // factor, w // factor)
        context = torch.empty(1, 77, unet_cfg["cross_attention_dim"])
        cond = dict(text_embeds=torch.empty(1, pooled), time_ids=torch.empty(1, 6))
        with FlopCounterMode(display=False) as unet_count:
            unet(latents, torch.tensor([999.0]), context, added_cond_kwargs=cond)
        with FlopCounterMode(display=False) as vae_count:
            vae.decode(latents)
    return {"unet": unet_count.get_total_flops(), "vae_decode": vae_count.get_total_flops()}


@pytest.mark.parametrize("preset", ["tiny", "small", "sdxl"])
def test_preset_flops_equal_pytorch_flop_counter_over_diffusers(preset):
    c = architecture_configs(preset)
    ours = model_flops(c["unet"], c["vae"], c["size"])
    reference = _torch_flops(preset)
    print(f"{preset} at {c['size']}: ours {ours}, PyTorch over diffusers {reference}")
    # They agree to the FLOP today (torch 2.13, diffusers 0.42); 0.5 % leaves room for either
    # side to count some small layer differently without hiding a missing block.
    for part in ("unet", "vae_decode"):
        assert ours[part] == pytest.approx(reference[part], rel=0.005), part


def test_sdxl_flops_are_the_mission_figures():
    """SDXL base at 1024x1024: about 6.76 TFLOP per UNet evaluation and 10.5 TFLOP per VAE decode
    per image (MISSION.md); the exact figures are checked against PyTorch above."""
    c = architecture_configs("sdxl")
    flops = model_flops(c["unet"], c["vae"], (1024, 1024))
    assert round(flops["unet"] / 1e12, 2) == 6.76
    assert round(flops["vae_decode"] / 1e12, 1) == 10.5


@pytest.mark.parametrize("preset", ["tiny", "sdxl"])
def test_controlnet_flops_equal_pytorch_flop_counter_over_diffusers(preset):
    """`bench --controlnets`' figure: one ControlNet made from the preset's UNet (as
    ControlNetModel.from_unet makes it), counted as PyTorch counts diffusers' on the meta device."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    from torch.utils.flop_counter import FlopCounterMode

    from sdxl_tpu.bench.flops import controlnet_flops
    from sdxl_tpu.bench.random_weights import controlnet_config
    from sdxl_tpu.models.controlnet import ControlNetConfig

    c = architecture_configs(preset)
    w, h = c["size"]
    factor = 2 ** (len(c["vae"]["block_out_channels"]) - 1)
    config = controlnet_config(c["unet"], factor)
    ours = controlnet_flops(ControlNetConfig.from_dict(config), (w, h), factor)
    pooled = config["projection_class_embeddings_input_dim"] - 6 * config["addition_time_embed_dim"]
    with torch.device("meta"):
        net = diffusers.ControlNetModel.from_config(config)
        with FlopCounterMode(display=False) as count:
            net(torch.empty(1, 4, h // factor, w // factor), torch.tensor([999.0]),
                torch.empty(1, 77, config["cross_attention_dim"]), torch.empty(1, 3, h, w),
                added_cond_kwargs=dict(text_embeds=torch.empty(1, pooled), time_ids=torch.empty(1, 6)))
    print(f"{preset} ControlNet at {w}x{h}: ours {ours}, PyTorch over diffusers {count.get_total_flops()}")
    assert ours == pytest.approx(count.get_total_flops(), rel=0.005)
