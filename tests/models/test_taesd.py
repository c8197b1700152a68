"""TAESD (the tiny autoencoder for previews) matches diffusers' AutoencoderTiny, loads offline-safely."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from reference import nchw_to_nhwc, rel_l2

from sdxl_tpu.models.layers import Precision
from sdxl_tpu.models.taesd import AutoencoderTiny, TAESDConfig
from sdxl_tpu.weights.architectures import architecture_configs
from sdxl_tpu.weights.errors import CheckpointError
from sdxl_tpu.weights.hub import TAESD_REPO
from sdxl_tpu.weights.taesd import load_taesd
from sdxl_tpu.weights.tiny import write_tiny_taesd

F32 = Precision.of("float32")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A small random diffusers AutoencoderTiny (SDXL's block counts), saved in diffusers format."""
    from diffusers import AutoencoderTiny as TorchTiny

    torch.manual_seed(0)
    model = TorchTiny(encoder_block_out_channels=(8,) * 4, decoder_block_out_channels=(8,) * 4, latent_channels=4)
    with torch.no_grad():
        for p in model.parameters():  # He-scaled so activations stay of order one through the ReLUs
            p.normal_(0.0, (2.0 / np.prod(p.shape[1:])) ** 0.5 if p.ndim > 1 else 0.1)
    model.eval()
    directory = tmp_path_factory.mktemp("taesd") / "ref"
    model.save_pretrained(directory, safe_serialization=True)
    return model, directory


def test_decode_and_encode_match_diffusers(reference):
    torch_model, directory = reference
    ours = load_taesd(str(directory), F32)
    assert isinstance(ours, AutoencoderTiny) and ours.upscale == 8
    gen = torch.Generator().manual_seed(1)
    latents = 2.0 * torch.randn(2, 4, 16, 24, generator=gen)  # wide enough to reach the tanh clamp
    images = torch.rand(2, 3, 64, 96, generator=gen) * 2 - 1
    with torch.no_grad():
        ref_dec = torch_model.decode(latents).sample
        ref_enc = torch_model.encode(images).latents
    dec = np.asarray(ours.decode(jnp.asarray(nchw_to_nhwc(latents))))
    enc = np.asarray(ours.encode(jnp.asarray(nchw_to_nhwc(images))))
    assert dec.shape == (2, 128, 192, 3) and enc.shape == (2, 8, 12, 4)
    ref_dec, ref_enc = nchw_to_nhwc(ref_dec), nchw_to_nhwc(ref_enc)
    # Relative to the decoder's own [0, 1] output, so the final mul(2).sub(1) cannot hide errors.
    dec_err, enc_err = rel_l2(dec + 1, ref_dec + 1), rel_l2(enc, ref_enc)
    print(f"TAESD parity: decode rel L2 {dec_err:.2e}, encode rel L2 {enc_err:.2e}")
    for ref in (ref_dec, ref_enc):  # every channel of the reference varies over the image: not degenerate
        assert ref.std(axis=(1, 2)).min() > 1e-2
    assert dec_err <= 1e-4 and enc_err <= 1e-4


def test_tiny_taesd_loads_in_diffusers_and_here_and_previews_at_image_size(tmp_path):
    from diffusers import AutoencoderTiny as TorchTiny

    directory = write_tiny_taesd(tmp_path / "taesd")
    assert {p.name for p in directory.iterdir()} == {"config.json", "diffusion_pytorch_model.safetensors"}
    torch_model, info = TorchTiny.from_pretrained(directory, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched tensors
    ours = load_taesd(str(directory), F32)
    assert tuple(torch_model.config.num_decoder_blocks) == ours.config.num_decoder_blocks
    presets = architecture_configs("tiny")
    height, width = presets["size"]
    factor = 2 ** (len(presets["vae"]["block_out_channels"]) - 1)
    latents = np.random.default_rng(0).standard_normal((1, height // factor, width // factor, 4), np.float32)
    preview = np.asarray(ours.decode(jnp.asarray(latents)))
    assert preview.shape == (1, height, width, 3) and np.isfinite(preview).all()
    with torch.no_grad():
        ref = nchw_to_nhwc(torch_model.decode(torch.from_numpy(latents.transpose(0, 3, 1, 2))).sample)
    assert rel_l2(preview + 1, ref + 1) <= 1e-4


def test_offline_without_cache_is_one_clear_error(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(CheckpointError) as err:
        load_taesd("taesd", F32)
    message = str(err.value)
    assert TAESD_REPO in message and "--preview approx" in message and "\n" not in message
    assert not list((tmp_path / "empty-cache").rglob("*.safetensors"))


def test_directory_that_is_not_a_taesd_checkpoint_is_named(tmp_path, reference):
    empty = tmp_path / "no-config"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="no config.json") as err:
        load_taesd(str(empty), F32)
    assert str(empty) in str(err.value)
    wrong = tmp_path / "wrong-tensors"  # a valid config, but its tensors are a narrower model's
    wrong.mkdir()
    _, directory = reference
    config = json.loads((directory / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps({**config, "decoder_block_out_channels": [16] * 4,
                                                   "encoder_block_out_channels": [16] * 4}))
    (wrong / "diffusion_pytorch_model.safetensors").write_bytes(
        (directory / "diffusion_pytorch_model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="wrong shape") as err:
        load_taesd(str(wrong), F32)
    assert str(wrong) in str(err.value)


@pytest.mark.parametrize("change", [{"act_fn": "silu"}, {"upsample_fn": "bilinear"},
                                    {"num_decoder_blocks": [3, 3, 1]}, {"_class_name": "AutoencoderKL"}])
def test_unsupported_configs_are_refused(tmp_path, reference, change):
    _, directory = reference
    config = json.loads((directory / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError):
        load_taesd(str(tmp_path), F32)
    if "_class_name" not in change:
        with pytest.raises(ValueError):
            TAESDConfig.from_dict({**config, **change})
