"""A tiny, random, SDXL-architecture checkpoint in exact diffusers format, written without torch.

It is the offline fixture for tests and for running the app without a model hub: the same
file layout, config keys and tensor names as stabilityai/stable-diffusion-xl-base-1.0, with
small widths and a small byte-level BPE vocabulary.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from .clip import CLIPTextConfig, CLIPTextModel
from .unet import UNet2DConditionModel, UNetConfig
from .vae import AutoencoderKL, VAEConfig
from .weights import torch_shapes

TINY_VERSION = 1  # bump when the checkpoint written here changes
DIFFUSERS_VERSION = "0.42.1"
TRANSFORMERS_VERSION = "5.24.0"

SCHEDULER_CONFIG: dict[str, Any] = {  # as SDXL base 1.0 ships it
    "_class_name": "EulerDiscreteScheduler", "_diffusers_version": DIFFUSERS_VERSION,
    "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False,
    "interpolation_type": "linear", "num_train_timesteps": 1000, "prediction_type": "epsilon",
    "sample_max_value": 1.0, "set_alpha_to_one": False, "skip_prk_steps": True, "steps_offset": 1,
    "timestep_spacing": "leading", "trained_betas": None, "use_karras_sigmas": False,
}

# A few hundred words of the kind people type; the BPE merges are learned from them.
_CORPUS = """a photo of an astronaut riding a horse on the moon, a cat sitting on a red chair, portrait of a
woman with long hair, cinematic lighting, highly detailed, digital painting, landscape with mountains and a lake
at sunset, anime style girl, pixel art castle, neon city at night, 3d render of a robot, fantasy dragon flying
over a forest, watercolor flowers, oil painting of a ship in a storm, blurry, low quality, ugly, deformed, text,
watermark, photograph, sharp focus, dog, bird, tree, house, street, beach, snow, rain, sky, clouds, sun"""
_NUM_MERGES = 200


def text_encoder_config(vocab_size: int, *, projection: bool, hidden: int = 32, layers: int | None = None,
                        heads: int = 4, mlp_ratio: int = 2) -> dict[str, Any]:
    return {
        "architectures": ["CLIPTextModelWithProjection" if projection else "CLIPTextModel"],
        "attention_dropout": 0.0, "bos_token_id": 0, "dropout": 0.0,
        # SDXL base keeps the legacy eos_token_id 2: pooling takes the highest token id (EOT).
        "eos_token_id": 2, "hidden_act": "gelu" if projection else "quick_gelu", "hidden_size": hidden,
        "initializer_factor": 1.0, "initializer_range": 0.02, "intermediate_size": mlp_ratio * hidden,
        "layer_norm_eps": 1e-05, "max_position_embeddings": 77, "model_type": "clip_text_model",
        "num_attention_heads": heads, "num_hidden_layers": layers or (3 if projection else 2), "pad_token_id": 1,
        "projection_dim": hidden, "dtype": "float32", "transformers_version": TRANSFORMERS_VERSION,
        "vocab_size": vocab_size,
    }


def unet_config(cross_attention_dim: int, pooled_dim: int, *, channels=(32, 64, 64), transformer_layers=(1, 1, 2),
                heads=(2, 2, 4), groups: int = 16, time_dim: int = 8, sample_size: int = 32) -> dict[str, Any]:
    return {
        "_class_name": "UNet2DConditionModel", "_diffusers_version": DIFFUSERS_VERSION,
        "act_fn": "silu", "addition_embed_type": "text_time", "addition_embed_type_num_heads": 64,
        "addition_time_embed_dim": time_dim, "attention_head_dim": list(heads), "attention_type": "default",
        "block_out_channels": list(channels), "center_input_sample": False, "class_embed_type": None,
        "class_embeddings_concat": False, "conv_in_kernel": 3, "conv_out_kernel": 3,
        "cross_attention_dim": cross_attention_dim, "cross_attention_norm": None,
        "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
        "downsample_padding": 1, "dropout": 0.0, "dual_cross_attention": False, "encoder_hid_dim": None,
        "encoder_hid_dim_type": None, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 4,
        "layers_per_block": 2, "mid_block_only_cross_attention": None, "mid_block_scale_factor": 1,
        "mid_block_type": "UNetMidBlock2DCrossAttn", "norm_eps": 1e-05, "norm_num_groups": groups,
        "num_attention_heads": None, "num_class_embeds": None, "only_cross_attention": False,
        "out_channels": 4, "projection_class_embeddings_input_dim": pooled_dim + 6 * time_dim,
        "resnet_out_scale_factor": 1.0, "resnet_skip_time_act": False, "resnet_time_scale_shift": "default",
        "reverse_transformer_layers_per_block": None, "sample_size": sample_size, "time_cond_proj_dim": None,
        "time_embedding_act_fn": None, "time_embedding_dim": None, "time_embedding_type": "positional",
        "timestep_post_act": None, "transformer_layers_per_block": list(transformer_layers),
        "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"], "upcast_attention": None,
        "use_linear_projection": True,
    }


def vae_config(channels=(16, 16, 32, 32), *, groups: int = 8, layers: int = 1,
               sample_size: int = 256) -> dict[str, Any]:
    return {
        "_class_name": "AutoencoderKL", "_diffusers_version": DIFFUSERS_VERSION, "act_fn": "silu",
        "block_out_channels": list(channels),
        "down_block_types": ["DownEncoderBlock2D"] * len(channels), "force_upcast": True, "in_channels": 3,
        "latent_channels": 4, "layers_per_block": layers, "norm_num_groups": groups, "out_channels": 3,
        "sample_size": sample_size, "scaling_factor": 0.13025, "up_block_types": ["UpDecoderBlock2D"] * len(channels),
    }


def preset_configs(preset: str, vocab_size: int = 49408) -> dict[str, Any]:
    """Component configs (as config.json files hold them) and the default image size of a preset.

    tiny:  a few MB, for tests and running offline.
    small: SDXL's block structure, narrower and shallower, 256x256: a CPU call takes seconds, so a
           side-by-side comparison measures compute rather than overhead.
    sdxl:  SDXL base 1.0's architecture exactly.
    """
    if preset == "tiny":
        te1 = text_encoder_config(vocab_size, projection=False)
        te2 = text_encoder_config(vocab_size, projection=True)
        unet = unet_config(64, 32)
        vae, size = vae_config(), (64, 64)
    elif preset == "small":
        te1 = text_encoder_config(vocab_size, projection=False, hidden=256, layers=4, mlp_ratio=4)
        te2 = text_encoder_config(vocab_size, projection=True, hidden=256, layers=4, mlp_ratio=4)
        unet = unet_config(512, 256, channels=(64, 128, 256), transformer_layers=(1, 1, 2), heads=(1, 2, 4), groups=32,
                           time_dim=256, sample_size=32)
        vae, size = vae_config((32, 64, 128, 128), groups=32, layers=1), (256, 256)
    elif preset == "sdxl":
        te1 = text_encoder_config(vocab_size, projection=False, hidden=768, layers=12, heads=12, mlp_ratio=4)
        te2 = text_encoder_config(vocab_size, projection=True, hidden=1280, layers=32, heads=20, mlp_ratio=4)
        unet = unet_config(2048, 1280, channels=(320, 640, 1280), transformer_layers=(1, 2, 10), heads=(5, 10, 20),
                           groups=32, time_dim=256, sample_size=128)
        vae, size = vae_config((128, 256, 512, 512), groups=32, layers=2, sample_size=1024), (1024, 1024)
    else:
        raise ValueError(f"unknown preset {preset!r}; use tiny, small or sdxl")
    return {"text_encoder": te1, "text_encoder_2": te2, "unet": unet, "vae": vae, "size": size}


def model_index() -> dict[str, Any]:
    return {
        "_class_name": "StableDiffusionXLPipeline", "_diffusers_version": DIFFUSERS_VERSION,
        "force_zeros_for_empty_prompt": True, "add_watermarker": None,
        "feature_extractor": [None, None], "image_encoder": [None, None],
        "scheduler": ["diffusers", "EulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
        "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "CLIPTokenizer"],
        "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"],
    }


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2/CLIP's reversible byte -> printable character table.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def build_vocabulary(num_merges: int = _NUM_MERGES) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE vocabulary in CLIP's format, with merges learned from a small corpus.

    As in CLIP, every byte character exists alone and with the end-of-word marker, and the two
    special tokens come last, so <|endoftext|> has the highest id.
    """
    chars = list(_bytes_to_unicode().values())
    vocab_list = chars + [c + "</w>" for c in chars]
    words = Counter(_CORPUS.lower().replace(",", " ").split())
    splits = {w: [*w[:-1], w[-1] + "</w>"] for w in words}
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: Counter = Counter()
        for w, parts in splits.items():
            for a, b in zip(parts, parts[1:]):
                pairs[a, b] += words[w]
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        vocab_list.append(best[0] + best[1])
        for w, parts in splits.items():
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            splits[w] = merged
    vocab_list += ["<|startoftext|>", "<|endoftext|>"]
    return {tok: i for i, tok in enumerate(vocab_list)}, merges


def _write_tokenizer(directory: Path, vocab: dict[str, int], merges: list[tuple[str, str]], pad_token: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
               "pad_token": pad_token}
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    config = {"add_prefix_space": False, "clean_up_tokenization_spaces": True, "do_lower_case": True,
              "errors": "replace", "model_max_length": 77, "tokenizer_class": "CLIPTokenizer", **special}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def random_weights(model: nnx.Module, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random float32 tensors for every parameter, under PyTorch names and shapes.

    Scaled so activations stay of order one through the network: weights ~ N(0, 1/fan_in),
    norm scales near one, small biases.
    """
    out = {}
    for name, shape in torch_shapes(model).items():
        if len(shape) == 1:
            base = 1.0 if name.endswith("weight") else 0.0
            out[name] = (base + 0.05 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith("embedding.weight"):
            out[name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
        else:
            fan_in = int(np.prod(shape[1:]))
            out[name] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return out


def _write_component(directory: Path, config: dict[str, Any], tensors: dict[str, np.ndarray], filename: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(directory / filename), metadata={"format": "pt"})


def write_checkpoint(directory: str | os.PathLike, preset: str = "tiny", *, seed: int = 0) -> Path:
    """Write a random checkpoint of `preset` in diffusers format to `directory` and return its path."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocab, merges = build_vocabulary()
    _write_tokenizer(root / "tokenizer", vocab, merges, pad_token="<|endoftext|>")
    _write_tokenizer(root / "tokenizer_2", vocab, merges, pad_token="!")
    configs = preset_configs(preset, vocab_size=len(vocab))
    builders = {
        "text_encoder": lambda c: CLIPTextModel(CLIPTextConfig.from_dict(c, with_projection=False)),
        "text_encoder_2": lambda c: CLIPTextModel(CLIPTextConfig.from_dict(c, with_projection=True)),
        "unet": lambda c: UNet2DConditionModel(UNetConfig.from_dict(c)),
        "vae": lambda c: AutoencoderKL(VAEConfig.from_dict(c)),
    }
    for name, build in builders.items():
        model = nnx.eval_shape(lambda: build(configs[name]))
        filename = "model.safetensors" if name.startswith("text") else "diffusion_pytorch_model.safetensors"
        _write_component(root / name, configs[name], random_weights(model, rng), filename)
    (root / "scheduler").mkdir(exist_ok=True)
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER_CONFIG, indent=2))
    (root / "model_index.json").write_text(json.dumps(model_index(), indent=2))
    return root


def write_tiny_checkpoint(directory: str | os.PathLike, *, seed: int = 0) -> Path:
    """Write the tiny SDXL checkpoint to `directory` (created if needed) and return its path."""
    return write_checkpoint(directory, "tiny", seed=seed)
