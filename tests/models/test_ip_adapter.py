"""IP-Adapter for SDXL on random tiny weights: the CLIP image encoder against transformers'
CLIPVisionModelWithProjection, its preprocessing against CLIPImageProcessor, and the UNet with a plain
and a plus adapter, written in the published files' layout (.safetensors and torch's .bin), against
diffusers' UNet2DConditionModel after its own _load_ip_adapter_weights; per-row scales (0: as if there
were none) and a new image recompile nothing; files that are not what they should be are refused
saying why."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from PIL import Image
from reference import SMALL_UNET, nchw_to_nhwc, perturb_norms, rel_l2
from ip_adapter_files import VISION, adapter_state, write_adapter
from upscaler_files import write_torch_zip

from sdxl_tpu import CompileCounter
from sdxl_tpu.imaging.clip_image import clip_batch
from sdxl_tpu.models.ip_adapter import IPAdapterConfig
from sdxl_tpu.models.layers import Precision
from sdxl_tpu.weights.checkpoint import load_unet
from sdxl_tpu.weights.errors import CheckpointError, IPAdapterError
from sdxl_tpu.weights.ip_adapter import check_image_encoder, load_image_encoder, load_ip_adapter

TOL = 1e-4
F32 = Precision()
UNET = SMALL_UNET
POOLED, LATENT = 32, (16, 16)


def _reference_unet(tmp_path):
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    unet = perturb_norms(UNet2DConditionModel(addition_embed_type="text_time", **UNET))
    unet.save_pretrained(tmp_path / "unet")
    return unet


def _inputs(features: torch.Tensor):
    gen = torch.Generator().manual_seed(0)
    b, (h, w) = features.shape[0], LATENT
    return dict(sample=torch.randn(b, 4, h, w, generator=gen), timesteps=torch.tensor([999.0, 321.5]),
                context=torch.randn(b, 7, UNET["cross_attention_dim"], generator=gen),
                text_embeds=torch.randn(b, POOLED, generator=gen),
                time_ids=torch.tensor([[1024, 1024, 0, 0, 1024, 1024], [768, 1344, 16, 32, 1024, 1024]],
                                      dtype=torch.float32))


def _theirs(unet, x, features, scale: float) -> np.ndarray:
    from diffusers.models.attention_processor import IPAdapterAttnProcessor2_0

    for processor in unet.attn_processors.values():
        if isinstance(processor, IPAdapterAttnProcessor2_0):
            processor.scale = [scale]
    with torch.no_grad():
        out = unet(x["sample"], x["timesteps"], x["context"],
                   added_cond_kwargs=dict(text_embeds=x["text_embeds"], time_ids=x["time_ids"],
                                          image_embeds=[features[:, None]])).sample
    return nchw_to_nhwc(out)


@nnx.jit
def _ours(unet, adapter, features, scale, sample, timesteps, context, text_embeds, time_ids):
    return unet(sample, timesteps, context, text_embeds, time_ids, image_prompt=adapter(features, scale))


@nnx.jit
def _ours_plain(unet, sample, timesteps, context, text_embeds, time_ids):
    return unet(sample, timesteps, context, text_embeds, time_ids)


@pytest.mark.parametrize("kind, suffix", [("plain", ".safetensors"), ("plus", ".bin")])
def test_unet_with_ip_adapter_matches_diffusers(kind, suffix, tmp_path):
    """Two calls of one compiled program: rows at scales (0.7, 0), then another image at (0, 1.3).
    A row at 0 is the UNet without an adapter, as diffusers skips it at 0."""
    plus = kind == "plus"
    theirs_unet = _reference_unet(tmp_path)
    ours_unet = load_unet(tmp_path / "unet", F32)
    embed_dim = VISION["hidden_size"] if plus else VISION["projection_dim"]
    state = adapter_state(theirs_unet, plus, embed_dim)
    ours_adapter = load_ip_adapter(write_adapter(state, tmp_path / f"ip-adapter{suffix}"), ours_unet)
    assert ours_adapter.config.plus == plus
    theirs_unet._load_ip_adapter_weights([state], low_cpu_mem_usage=False)

    gen = torch.Generator().manual_seed(7)
    shape = (2, 17, embed_dim) if plus else (2, embed_dim)
    images = [torch.randn(shape, generator=gen) for _ in range(2)]
    x = _inputs(images[0])
    args = [jnp.asarray(nchw_to_nhwc(x["sample"]))] + [jnp.asarray(x[k].numpy()) for k in
                                                        ("timesteps", "context", "text_embeds", "time_ids")]
    without = np.asarray(_ours_plain(ours_unet, *args))
    out = np.asarray(_ours(ours_unet, ours_adapter, jnp.asarray(images[0].numpy()), jnp.array([0.7, 0.0]), *args))
    with_image, off = _theirs(theirs_unet, x, images[0], 0.7), _theirs(theirs_unet, x, images[0], 0.0)
    errors = [rel_l2(out[0], with_image[0]), rel_l2(out[1], off[1])]
    with CompileCounter() as counter:
        out2 = np.asarray(_ours(ours_unet, ours_adapter, jnp.asarray(images[1].numpy()), jnp.array([0.0, 1.3]),
                                *args))
    assert counter.compiles == 0
    errors += [rel_l2(out2[0], off[0]), rel_l2(out2[1], _theirs(theirs_unet, x, images[1], 1.3)[1])]
    print(f"unet with {kind} IP-Adapter: rel L2 {', '.join(f'{e:.1e}' for e in errors)}")
    assert max(errors) <= TOL
    np.testing.assert_array_equal(out[1], without[1])  # (scale 0: exactly the UNet without an adapter)
    np.testing.assert_array_equal(out2[0], without[0])
    assert rel_l2(with_image[0], off[0]) > 1e-2  # (the image counted)
    two = torch.stack(images, dim=1)  # two images a row: their tokens side by side, as diffusers' projection
    with torch.no_grad():
        ref_tokens = theirs_unet.encoder_hid_proj([two])[0]
    tokens = ours_adapter.tokens(jnp.asarray(two.numpy()))
    assert rel_l2(tokens, ref_tokens.reshape(2, -1, ref_tokens.shape[-1]).numpy()) <= TOL


@pytest.mark.parametrize("hidden_act", ["quick_gelu", "gelu"])
def test_image_encoder_matches_transformers(hidden_act, tmp_path):
    import transformers

    torch.manual_seed(0)
    config = transformers.CLIPVisionConfig(hidden_act=hidden_act, **VISION)
    theirs = perturb_norms(transformers.CLIPVisionModelWithProjection(config))
    theirs.save_pretrained(tmp_path / "image_encoder")
    ours = load_image_encoder(tmp_path / "image_encoder")
    pixels = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = theirs(pixels, output_hidden_states=True)
    got = ours(jnp.asarray(nchw_to_nhwc(pixels)))
    errors = rel_l2(got.image_embeds, ref.image_embeds.numpy()), rel_l2(got.penultimate, ref.hidden_states[-2].numpy())
    print(f"image encoder ({hidden_act}): image_embeds rel L2 {errors[0]:.1e}, hidden_states[-2] {errors[1]:.1e}")
    assert max(errors) <= TOL
    plain = IPAdapterConfig(plus=False, image_embed_dim=24, cross_attention_dim=48, num_tokens=4, blocks=())
    check_image_encoder(plain, ours.config)
    check_image_encoder(dataclasses.replace(plain, plus=True, image_embed_dim=32), ours.config)
    with pytest.raises(IPAdapterError, match="projected embeddings 24 wide; this image encoder's are 16"):
        check_image_encoder(plain, dataclasses.replace(ours.config, projection_dim=16))


def test_preprocessing_matches_clip_image_processor():
    from transformers import CLIPImageProcessor

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (37, 301, 3), np.uint8)),
              Image.fromarray(rng.integers(0, 256, (500, 229, 4), np.uint8), "RGBA"),
              Image.fromarray(rng.integers(0, 256, (224, 224), np.uint8), "L"),
              Image.fromarray(rng.integers(0, 256, (999, 1000, 3), np.uint8)).convert("P")]
    theirs = CLIPImageProcessor()(images, return_tensors="np").pixel_values.transpose(0, 2, 3, 1)
    ours = clip_batch(images)
    assert ours.shape == theirs.shape == (4, 224, 224, 3) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, atol=1e-6, rtol=0)
    array = np.asarray(images[0])
    np.testing.assert_array_equal(clip_batch([array]), ours[:1])


def _hostile(tmp_path, unet, case: str):
    """A file that is not a usable IP-Adapter for `unet` (diffusers'), and a word its refusal says."""
    state = adapter_state(unet, False, 24)
    path = tmp_path / f"{case}.safetensors"
    if case == "pickle_runs_code":
        import os

        class Evil:
            def __reduce__(self):
                return os.system, (f"touch {tmp_path / 'pwned'}",)

        write_torch_zip(path.with_suffix(".bin"), {"image_proj": Evil()}, {})
        return path.with_suffix(".bin"), "posix.system"
    if case == "not_an_adapter":
        return write_adapter({"unet": {"conv_in.weight": torch.zeros(2, 2)}}, path), "not an IP-Adapter"
    if case == "faceid":
        state["image_proj"] = {"proj.0.weight": torch.zeros(8, 4), "norm.weight": torch.zeros(4)}
        return write_adapter(state, path), "FaceID"
    if case == "sd15_adapter":
        state["ip_adapter"] = {k: v for k, v in state["ip_adapter"].items() if int(k.split(".")[0]) < 20}
        return write_adapter(state, path), "cross-attentions"
    if case == "wrong_shape":
        state["ip_adapter"]["5.to_v_ip.weight"] = torch.zeros(3, 48)
        return write_adapter(state, path), "wrong shape: ip_adapter.5.to_v_ip.weight"
    if case == "missing":
        del state["ip_adapter"]["7.to_k_ip.weight"]
        return write_adapter(state, path), "missing: ip_adapter.7.to_k_ip.weight"
    if case == "other_width":
        state["image_proj"] = {"proj.weight": torch.zeros(4 * 32, 24), "proj.bias": torch.zeros(4 * 32),
                               "norm.weight": torch.zeros(32), "norm.bias": torch.zeros(32)}
        return write_adapter(state, path), "32 wide"
    if case == "truncated":
        write_adapter(state, path)
        path.write_bytes(path.read_bytes()[:1000])
        return path, "not a readable .safetensors"
    if case == "bin_of_a_list":
        torch.save([torch.zeros(2)], path.with_suffix(".bin"))
        return path.with_suffix(".bin"), "not an IP-Adapter"
    assert case == "text"
    path = path.with_suffix(".txt")
    path.write_text("hello")
    return path, "not a .safetensors or .bin"


HOSTILE = ["pickle_runs_code", "not_an_adapter", "faceid", "sd15_adapter", "wrong_shape", "missing", "other_width",
           "truncated", "bin_of_a_list", "text"]


def test_files_that_are_not_ip_adapters_are_refused_saying_why(tmp_path):
    theirs = _reference_unet(tmp_path)
    ours = load_unet(tmp_path / "unet", F32)
    for case in HOSTILE:
        path, word = _hostile(tmp_path, theirs, case)
        with pytest.raises(CheckpointError) as err:
            load_ip_adapter(path, ours)
        message = str(err.value)
        assert word in message and path.name in message, (case, message)
    assert not (tmp_path / "pwned").exists()
    (tmp_path / "whole_clip").mkdir()
    (tmp_path / "whole_clip" / "config.json").write_text('{"model_type": "clip", "vision_config": {}}')
    with pytest.raises(IPAdapterError, match="CLIPVisionModelWithProjection"):
        load_image_encoder(tmp_path / "whole_clip")
    with pytest.raises(IPAdapterError, match="no config.json"):
        load_image_encoder(tmp_path / "nowhere")
