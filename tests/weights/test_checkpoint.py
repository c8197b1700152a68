"""Loading checkpoints: strict tensor matching, clear errors, variants, the Hub cache."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from sdxl_tpu import CheckpointError, Precision, load_models, load_unet, load_vae
from sdxl_tpu.weights.tensors import TensorSource, weight_files

UNET_FILE = "diffusion_pytorch_model.safetensors"


def _copy_component(tiny: Path, name: str, dst: Path) -> tuple[Path, dict[str, np.ndarray]]:
    shutil.copytree(tiny / name, dst)
    return dst, load_file(str(dst / UNET_FILE))


def test_missing_tensor_is_named(tiny_checkpoint, tmp_path):
    d, tensors = _copy_component(tiny_checkpoint, "unet", tmp_path / "unet")
    del tensors["mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight"]
    save_file(tensors, str(d / UNET_FILE))
    with pytest.raises(CheckpointError, match=r"missing: mid_block\.attentions\.0\."
                                              r"transformer_blocks\.0\.attn2\.to_k\.weight"):
        load_unet(d, Precision())


def test_unexpected_tensor_is_named(tiny_checkpoint, tmp_path):
    d, tensors = _copy_component(tiny_checkpoint, "unet", tmp_path / "unet")
    tensors["down_blocks.0.resnets.0.extra_proj.weight"] = np.zeros((4, 4), np.float32)
    save_file(tensors, str(d / UNET_FILE))
    with pytest.raises(CheckpointError, match=r"unexpected: down_blocks\.0\.resnets\.0\.extra_proj\.weight"):
        load_unet(d, Precision())


def test_wrong_shape_is_named(tiny_checkpoint, tmp_path):
    d, tensors = _copy_component(tiny_checkpoint, "unet", tmp_path / "unet")
    name = "up_blocks.1.resnets.2.conv1.weight"
    tensors[name] = tensors[name][:, :-1]
    save_file(tensors, str(d / UNET_FILE))
    expected = re.escape(f"wrong shape: {name} (checkpoint (64, 95, 3, 3), model (64, 96, 3, 3))")
    with pytest.raises(CheckpointError, match=expected):
        load_unet(d, Precision())


def test_unsupported_config_value_names_key_and_value(tiny_checkpoint, tmp_path):
    d, _ = _copy_component(tiny_checkpoint, "unet", tmp_path / "unet")
    config = json.loads((d / "config.json").read_text())
    config["time_cond_proj_dim"] = 256  # LCM-style guidance embedding: not supported
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"time_cond_proj_dim=256"):
        load_unet(d, Precision())
    config["time_cond_proj_dim"] = None
    config["down_block_types"][1] = "SimpleCrossAttnDownBlock2D"
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"down_block_types entry 'SimpleCrossAttnDownBlock2D'"):
        load_unet(d, Precision())


def test_legacy_vae_attention_names_load(tiny_checkpoint, tmp_path):
    d, _ = _copy_component(tiny_checkpoint, "vae", tmp_path / "vae")
    tensors = load_file(str(d / UNET_FILE))
    legacy = {}
    for k, v in tensors.items():
        for new, old in ((".to_q.", ".query."), (".to_k.", ".key."), (".to_v.", ".value."),
                         (".to_out.0.", ".proj_attn.")):
            if ".mid_block.attentions." in k:
                k = k.replace(new, old)
        legacy[k] = v
    assert any(".proj_attn." in k for k in legacy)
    save_file(legacy, str(d / UNET_FILE))
    vae = load_vae(d, Precision())
    np.testing.assert_array_equal(
        np.asarray(vae.decoder.mid_block.attentions[0].to_q.kernel[...]),
        tensors["decoder.mid_block.attentions.0.to_q.weight"].T)


def test_fp16_variant_preferred_and_bf16_tensors_read(tmp_path):
    a = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    save_file(a, str(tmp_path / "diffusion_pytorch_model.safetensors"))
    save_file({"w": (a["w"] + 1).astype(np.float16)}, str(tmp_path / "diffusion_pytorch_model.fp16.safetensors"))
    files = weight_files(tmp_path)
    assert [f.name for f in files] == ["diffusion_pytorch_model.fp16.safetensors"]
    assert [f.name for f in weight_files(tmp_path, prefer_variant=None)] == ["diffusion_pytorch_model.safetensors"]
    # bfloat16 tensors (numpy has no bf16; safetensors' numpy backend cannot read them directly)
    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    values = np.array([[1.5, -2.25, 3.0]], dtype=np.float32)
    header = json.dumps({"w": {"dtype": "BF16", "shape": [1, 3], "data_offsets": [0, 6]}}).encode()
    raw = values.astype(ml_dtypes.bfloat16).tobytes()
    (bf16 / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + raw)
    got = TensorSource([bf16 / "model.safetensors"]).get("w")
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.astype(np.float32), values)
    # every file's tensors, with their metadata entry skipped; a dtype we do not read is named
    save_file({"w": a["w"], "ids": np.arange(4, dtype=np.uint16)}, str(tmp_path / "multi.safetensors"),
              metadata={"format": "pt"})
    source = TensorSource([tmp_path / "multi.safetensors", bf16 / "model.safetensors"])
    assert sorted(source.keys()) == ["ids", "w"] and source.shape("ids") == (4,)
    np.testing.assert_array_equal(source.get("w"), values)  # the later file's "w"
    with pytest.raises(CheckpointError, match="ids has dtype U16"):
        source.get("ids")


def test_half_precision_weights_cast_on_the_device_equal_the_host_cast(tmp_path):
    """A float16 checkpoint loaded as bfloat16: the tensors go to the device as stored and are laid
    out and cast there; every parameter equals ml_dtypes' cast of the file's tensor (round to
    nearest even), in every network and every kind of tensor (kernels 2-D and 4-D, embeddings, norms)."""
    from sdxl_tpu.weights.tensors import flax_params_as_torch
    from sdxl_tpu.weights.tiny import write_checkpoint

    root = write_checkpoint(tmp_path / "fp16", dtype=np.float16)
    models = load_models(root, dtype="float32", param_dtype="bfloat16")
    for name, network in (("text_encoder", models.text_encoder), ("text_encoder_2", models.text_encoder_2),
                          ("unet", models.unet), ("vae", models.vae)):
        files = TensorSource(weight_files(root / name))
        loaded = flax_params_as_torch(network)
        assert {str(a.dtype) for a in loaded.values()} == {"bfloat16"}
        assert {len(a.shape) for a in loaded.values()} >= ({1, 2, 4} if name in ("unet", "vae") else {1, 2})
        for key, value in loaded.items():
            stored = files.get(key if key in files.keys() else "text_model." + key)
            assert stored.dtype == np.float16
            np.testing.assert_array_equal(value.view(np.uint16), stored.astype(ml_dtypes.bfloat16).view(np.uint16),
                                          err_msg=f"{name}: {key}")


def test_no_weights_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="no .safetensors weights"):
        weight_files(tmp_path)


def test_bad_model_names_are_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="neither an existing directory nor a Hub repo id"):
        load_models(str(tmp_path / "does-not-exist"))
    with pytest.raises(CheckpointError, match="not a diffusers-format SDXL directory"):
        load_models(str(tmp_path))


def test_hub_repo_id_from_offline_cache_prefers_fp16(tiny_checkpoint, tmp_path):
    """A Hub id resolves through the HF cache with HF_HUB_OFFLINE=1, and fp16 variant weights win."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--sdxl-tiny"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(tiny_checkpoint, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    tensors = load_file(str(snapshot / "unet" / UNET_FILE))
    fp16 = {k: (v * 0.5).astype(np.float16) for k, v in tensors.items()}
    save_file(fp16, str(snapshot / "unet" / "diffusion_pytorch_model.fp16.safetensors"))
    script = (
        "import numpy as np, sdxl_tpu\n"
        "root = sdxl_tpu.resolve('acme/sdxl-tiny')\n"
        f"assert root.name == '{commit}', root\n"
        "m = sdxl_tpu.load_models('acme/sdxl-tiny', dtype='float32')\n"
        "print(np.asarray(m.unet.conv_in.bias[...]).tolist())\n")
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(got, fp16["conv_in.bias"].astype(np.float32), rtol=0, atol=0)
