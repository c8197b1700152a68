"""The architectures, in one place: each one's component configs exactly as diffusers'
config.json files hold them, and SDXL base 1.0's model index (its scheduler config is
sampler/from_config.py's).

tiny:  a few MB, for tests and running offline (`sdxl_tpu.weights.tiny` writes it as a checkpoint).
small: SDXL's block structure, narrower and shallower, 256x256, for CPU benchmarks.
sdxl:  SDXL base 1.0's architecture exactly (tests/models/test_full_size.py checks it against the
       published config and parameter counts).
"""

from __future__ import annotations

from typing import Any

DIFFUSERS_VERSION = "0.42.1"
TRANSFORMERS_VERSION = "5.24.0"



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
                heads=(2, 2, 4), groups: int = 16, time_dim: int = 8, sample_size: int = 32,
                time_ids: int = 6) -> dict[str, Any]:
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
        "out_channels": 4, "projection_class_embeddings_input_dim": pooled_dim + time_ids * time_dim,
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


def architecture_configs(architecture: str, vocab_size: int = 49408) -> dict[str, Any]:
    """Component configs (as config.json files hold them) and the default image size of an
    architecture (request/names.py's ARCHITECTURES).

    tiny:  a few MB, for tests and running offline.
    small: SDXL's block structure, narrower and shallower, 256x256: a CPU call takes seconds, so a
           side-by-side comparison measures compute rather than overhead.
    sdxl:  SDXL base 1.0's architecture exactly.
    """
    if architecture == "tiny":
        te1 = text_encoder_config(vocab_size, projection=False)
        te2 = text_encoder_config(vocab_size, projection=True)
        unet = unet_config(64, 32)
        vae, size = vae_config(), (64, 64)
    elif architecture == "small":
        te1 = text_encoder_config(vocab_size, projection=False, hidden=256, layers=4, mlp_ratio=4)
        te2 = text_encoder_config(vocab_size, projection=True, hidden=256, layers=4, mlp_ratio=4)
        unet = unet_config(512, 256, channels=(64, 128, 256), transformer_layers=(1, 1, 2), heads=(1, 2, 4), groups=32,
                           time_dim=256, sample_size=32)
        vae, size = vae_config((32, 64, 128, 128), groups=32, layers=1), (256, 256)
    elif architecture == "sdxl":
        te1 = text_encoder_config(vocab_size, projection=False, hidden=768, layers=12, heads=12, mlp_ratio=4)
        te2 = text_encoder_config(vocab_size, projection=True, hidden=1280, layers=32, heads=20, mlp_ratio=4)
        unet = unet_config(2048, 1280, channels=(320, 640, 1280), transformer_layers=(1, 2, 10), heads=(5, 10, 20),
                           groups=32, time_dim=256, sample_size=128)
        vae, size = vae_config((128, 256, 512, 512), groups=32, layers=2, sample_size=1024), (1024, 1024)
    else:
        raise ValueError(f"unknown architecture {architecture!r}; use tiny, small or sdxl")
    return {"text_encoder": te1, "text_encoder_2": te2, "unet": unet, "vae": vae, "size": size}


def refiner_configs(architecture: str, vocab_size: int = 49408) -> dict[str, Any]:
    """An architecture's refiner, as SDXL refiner 1.0 is SDXL base's: the second text encoder alone
    (its hidden states are the context), a UNet conditioned on five numbers (the size, the crop
    and an aesthetic score), the same VAE. Tiny: the tiny base's text encoder 2 and VAE, its UNet
    with other widths; sdxl: SDXL refiner 1.0's."""
    base = architecture_configs(architecture, vocab_size)
    te2 = base["text_encoder_2"]
    if architecture == "sdxl":
        unet = unet_config(1280, 1280, channels=(384, 768, 1536, 1536), transformer_layers=(4, 4, 4, 4),
                           heads=(6, 12, 24, 24), groups=32, time_dim=256, sample_size=128, time_ids=5)
        unet.update(down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
                    up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"])
    else:
        width = te2["hidden_size"]
        unet = unet_config(width, te2["projection_dim"], channels=(32, 48, 48), heads=(2, 2, 2), time_ids=5,
                           time_dim=base["unet"]["addition_time_embed_dim"], sample_size=base["unet"]["sample_size"])
        unet["cross_attention_dim"] = width
    return {"text_encoder_2": te2, "unet": unet, "vae": base["vae"]}


def refiner_model_index() -> dict[str, Any]:
    """SDXL refiner 1.0's model index: an img2img pipeline without the first text encoder."""
    index = model_index()
    return {**index, "_class_name": "StableDiffusionXLImg2ImgPipeline", "force_zeros_for_empty_prompt": False,
            "requires_aesthetics_score": True, "text_encoder": [None, None], "tokenizer": [None, None]}


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
