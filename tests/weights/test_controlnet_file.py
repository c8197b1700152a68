"""ControlNets from disk: a diffusers folder, or one .safetensors file in diffusers' names (as A1111
and ComfyUI users keep them) whose config is read off its tensors; other layouts refused by name."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from reference import perturb_norms
from sdxl_tpu.models.layers import Precision
from sdxl_tpu.request.load import controlnet_name
from sdxl_tpu.weights.controlnets import load_controlnet
from sdxl_tpu.weights.errors import CheckpointError

F32 = Precision()
# SDXL's shape rules at a small width: 64-wide heads, 256-wide size embeddings.
BASE = dict(down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
            block_out_channels=[64, 128, 128], layers_per_block=2, attention_head_dim=[1, 2, 2],
            cross_attention_dim=48, use_linear_projection=True, addition_embed_type="text_time",
            addition_time_embed_dim=256, projection_class_embeddings_input_dim=32 + 6 * 256,
            conditioning_embedding_out_channels=[8, 8, 16, 24])
VARIANTS = {"full": dict(transformer_layers_per_block=[1, 1, 2]),
            "mid": dict(transformer_layers_per_block=[0, 0, 1]),
            "small": dict(transformer_layers_per_block=[0, 0, 0], mid_block_type="UNetMidBlock2D")}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_single_file_reads_as_its_folder(variant, tmp_path):
    from diffusers import ControlNetModel

    torch.manual_seed(0)
    reference = perturb_norms(ControlNetModel(**BASE, **VARIANTS[variant]))
    reference.save_pretrained(tmp_path / variant)
    single = tmp_path / f"diffusers_xl_{variant}.safetensors"
    shutil.copy(tmp_path / variant / "diffusion_pytorch_model.safetensors", single)
    assert controlnet_name(single) == f"diffusers_xl_{variant}" and controlnet_name(tmp_path / "a-1.0") == "a-1.0"

    folder, file = load_controlnet(tmp_path / variant, F32), load_controlnet(single, F32)
    # What computes alike: the parameters, and the settings read off the tensors (heads, projections,
    # the mid block), seen in the residuals of one call.
    for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(folder), jax.tree_util.tree_leaves_with_path(file),
                                 strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b)), path
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((1, 8, 8, 4)), np.float32(500.0), rng.standard_normal((1, 7, 48)),
            rng.standard_normal((1, 32)), np.array([[64, 64, 0, 0, 64, 64]], np.float32), rng.random((1, 64, 64, 3)),
            np.ones((1, folder.config.residuals), np.float32))
    args = tuple(jnp.asarray(a, jnp.float32) for a in args)
    for a, b in zip(jax.tree.leaves(folder(*args)), jax.tree.leaves(file(*args)), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_other_layouts_are_refused_by_name(tmp_path):
    ldm = tmp_path / "control_sd_xl.safetensors"
    save_file({"control_model.input_blocks.0.0.weight": np.zeros((4, 4, 3, 3), np.float32)}, str(ldm))
    with pytest.raises(CheckpointError, match="original .LDM. layout or a control-LoRA"):
        load_controlnet(ldm, F32)
    other = tmp_path / "lora.safetensors"
    save_file({"lora_unet_down.weight": np.zeros((4, 4), np.float32)}, str(other))
    with pytest.raises(CheckpointError, match="not a ControlNet"):
        load_controlnet(other, F32)
    with pytest.raises(CheckpointError, match="not a diffusers folder or a .safetensors file"):
        load_controlnet(tmp_path / "missing.ckpt", F32)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="missing .*config.json"):
        load_controlnet(tmp_path / "empty", F32)
