"""The SDXL UNet (diffusers UNet2DConditionModel with text_time conditioning), channels-last: its
config and its top level; the blocks are unet_blocks.py's (diffusers' unet_2d_blocks.py).

Module and attribute names mirror diffusers' module tree, so weight names map mechanically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.typing import DTypeLike

from ..request.configs import check_supported, warn_unknown
from .layers import Conv, GroupNorm, Precision, TimestepEmbedding, timestep_embedding
from .unet_blocks import BasicTransformerBlock, DownBlock, ImagePrompt, MidBlock, TextContext, UpBlock


DOWN_BLOCKS = ("DownBlock2D", "CrossAttnDownBlock2D")
UP_BLOCKS = ("UpBlock2D", "CrossAttnUpBlock2D")

# Config keys whose value must be one of these (diffusers' defaults among them).
_REQUIRED_VALUES: dict[str, tuple] = {
    "act_fn": ("silu",),
    "addition_embed_type": ("text_time",),
    "mid_block_type": ("UNetMidBlock2DCrossAttn",),
    "center_input_sample": (False,),
    "class_embed_type": (None,),
    "num_class_embeds": (None,),
    "class_embeddings_concat": (False,),
    "encoder_hid_dim": (None,),
    "encoder_hid_dim_type": (None,),
    "time_embedding_type": ("positional",),
    "time_embedding_act_fn": (None,),
    "timestep_post_act": (None,),
    "time_cond_proj_dim": (None,),
    "resnet_time_scale_shift": ("default",),
    "resnet_skip_time_act": (False,),
    "resnet_out_scale_factor": (1, 1.0),
    "only_cross_attention": (False,),
    "mid_block_only_cross_attention": (None, False),
    "dual_cross_attention": (False,),
    "attention_type": ("default",),
    "cross_attention_norm": (None,),
    "conv_in_kernel": (3,),
    "conv_out_kernel": (3,),
    "downsample_padding": (1,),
    "mid_block_scale_factor": (1, 1.0),
}
# Keys that only matter for training or are derived/irrelevant at inference.
_IGNORED = {"sample_size", "dropout", "addition_embed_type_num_heads"}
_USED = {"in_channels", "out_channels", "down_block_types", "up_block_types", "block_out_channels",
         "layers_per_block", "norm_num_groups", "norm_eps", "cross_attention_dim", "transformer_layers_per_block",
         "reverse_transformer_layers_per_block", "attention_head_dim", "num_attention_heads",
         "use_linear_projection", "upcast_attention", "addition_time_embed_dim", "flip_sin_to_cos", "freq_shift",
         "time_embedding_dim", "projection_class_embeddings_input_dim"}


def _per_block(value: Any, n: int, key: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"unet config: {key}={value!r} must have one entry per block ({n})")
        return list(value)
    return [value] * n


def _per_layer(value: int | list[int], n: int) -> list[int]:
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


@dataclass(frozen=True)
class UNetConfig:
    in_channels: int
    out_channels: int
    down_block_types: tuple[str, ...]
    up_block_types: tuple[str, ...]
    block_out_channels: tuple[int, ...]
    layers_per_block: tuple[int, ...]
    norm_num_groups: int
    norm_eps: float
    cross_attention_dim: tuple[int, ...]
    transformer_layers: tuple            # per down block: per-resnet counts
    up_transformer_layers: tuple         # per up block: per-resnet counts
    mid_transformer_layers: tuple[int, ...]
    num_attention_heads: tuple[int, ...]
    use_linear_projection: bool
    upcast_attention: bool
    addition_time_embed_dim: int
    flip_sin_to_cos: bool
    freq_shift: float
    time_embed_dim: int
    projection_class_embeddings_input_dim: int

    @staticmethod
    def from_dict(cfg: dict[str, Any]) -> "UNetConfig":
        check_supported("unet", cfg, _REQUIRED_VALUES)
        if cfg.get("addition_embed_type") != "text_time":
            raise ValueError(f"unet config: unsupported addition_embed_type={cfg.get('addition_embed_type')!r} "
                             "(SDXL needs 'text_time')")
        warn_unknown("unet", cfg, _USED | _IGNORED | set(_REQUIRED_VALUES))
        down, up = tuple(cfg["down_block_types"]), tuple(cfg["up_block_types"])
        for key, types, allowed in (("down_block_types", down, DOWN_BLOCKS), ("up_block_types", up, UP_BLOCKS)):
            bad = [t for t in types if t not in allowed]
            if bad:
                raise ValueError(f"unet config: unsupported {key} entry {bad[0]!r} (supported: {allowed})")
        channels = tuple(cfg["block_out_channels"])
        n = len(channels)
        if len(down) != n or len(up) != n:
            raise ValueError(f"unet config: down_block_types, up_block_types and block_out_channels "
                             f"must have the same length (got {len(down)}, {len(up)}, {n})")
        if cfg.get("norm_num_groups", 32) is None:
            raise ValueError("unet config: unsupported norm_num_groups=None")
        layers = _per_block(cfg.get("layers_per_block", 2), n, "layers_per_block")
        tlpb = _per_block(cfg.get("transformer_layers_per_block", 1), n, "transformer_layers_per_block")
        reverse = cfg.get("reverse_transformer_layers_per_block") or list(reversed(tlpb))
        heads = cfg.get("num_attention_heads") or cfg.get("attention_head_dim", 8)
        heads = _per_block(heads, n, "num_attention_heads")
        if cfg.get("addition_time_embed_dim") is None:
            raise ValueError("unet config: addition_time_embed_dim is required for text_time conditioning")
        if cfg.get("projection_class_embeddings_input_dim") is None:
            raise ValueError("unet config: projection_class_embeddings_input_dim is required for text_time "
                             "conditioning")
        upcast = cfg.get("upcast_attention") or False
        return UNetConfig(
            in_channels=cfg.get("in_channels", 4), out_channels=cfg.get("out_channels", 4),
            down_block_types=down, up_block_types=up, block_out_channels=channels,
            layers_per_block=tuple(layers), norm_num_groups=cfg.get("norm_num_groups", 32),
            norm_eps=cfg.get("norm_eps", 1e-5),
            cross_attention_dim=tuple(_per_block(cfg.get("cross_attention_dim", 1280), n, "cross_attention_dim")),
            transformer_layers=tuple(tuple(_per_layer(t, layers[i])) for i, t in enumerate(tlpb)),
            up_transformer_layers=tuple(tuple(_per_layer(t, list(reversed(layers))[i] + 1))
                                        for i, t in enumerate(reverse)),
            mid_transformer_layers=tuple(_per_layer(tlpb[-1], 1)),
            num_attention_heads=tuple(heads), use_linear_projection=bool(cfg.get("use_linear_projection", False)),
            upcast_attention=bool(upcast), addition_time_embed_dim=cfg["addition_time_embed_dim"],
            flip_sin_to_cos=cfg.get("flip_sin_to_cos", True), freq_shift=cfg.get("freq_shift", 0),
            time_embed_dim=cfg.get("time_embedding_dim") or channels[0] * 4,
            projection_class_embeddings_input_dim=cfg["projection_class_embeddings_input_dim"])


def block_options(c: UNetConfig, p: Precision) -> dict[str, Any]:
    """What every down, mid and up block of a UNet of `c` (or of a ControlNet copying its down half) takes."""
    return dict(resnet_groups=c.norm_num_groups, resnet_eps=c.norm_eps, p=p,
                use_linear_projection=c.use_linear_projection, upcast_attention=c.upcast_attention)


def down_blocks(c: UNetConfig, p: Precision) -> nnx.List:
    """The down blocks (`down_blocks`) of a UNet of `c`: a ControlNet has the same."""
    ch, blocks, out_ch = c.block_out_channels, [], c.block_out_channels[0]
    for i, (kind, layers, depths, heads, context_dim) in enumerate(zip(
            c.down_block_types, c.layers_per_block, c.transformer_layers, c.num_attention_heads,
            c.cross_attention_dim, strict=True)):
        in_ch, out_ch = out_ch, ch[i]
        blocks.append(DownBlock(in_ch, out_ch, c.time_embed_dim, layers, has_attention=kind == "CrossAttnDownBlock2D",
                                transformer_layers_per_block=depths, num_attention_heads=heads,
                                cross_attention_dim=context_dim, add_downsample=i < len(ch) - 1,
                                **block_options(c, p)))
    return nnx.List(blocks)


def mid_block(c: UNetConfig, p: Precision, *, has_attention: bool = True) -> MidBlock:
    return MidBlock(c.block_out_channels[-1], c.time_embed_dim, has_attention=has_attention,
                    transformer_layers_per_block=c.mid_transformer_layers,
                    num_attention_heads=c.num_attention_heads[-1], cross_attention_dim=c.cross_attention_dim[-1],
                    **block_options(c, p))


def conditioning(c: UNetConfig, time_embedding: TimestepEmbedding, add_embedding: TimestepEmbedding,
                 dtype: DTypeLike, timesteps: jax.Array, text_embeds: jax.Array, time_ids: jax.Array) -> jax.Array:
    """The vector every resnet adds (B, time_embed_dim): the timestep's embedding plus SDXL's
    text_time one (the pooled text embedding and the six micro-conditioning numbers)."""
    b = text_embeds.shape[0]
    timesteps = jnp.broadcast_to(jnp.asarray(timesteps, jnp.float32), (b,))
    t_emb = timestep_embedding(timesteps, c.block_out_channels[0], flip_sin_to_cos=c.flip_sin_to_cos,
                               freq_shift=c.freq_shift)
    emb = time_embedding(t_emb.astype(dtype))
    time_emb = timestep_embedding(time_ids.reshape(-1), c.addition_time_embed_dim,
                                  flip_sin_to_cos=c.flip_sin_to_cos, freq_shift=c.freq_shift).reshape(b, -1)
    add_emb = jnp.concatenate([text_embeds.astype(jnp.float32), time_emb], axis=-1)
    return emb + add_embedding(add_emb.astype(dtype))


def down_and_mid(blocks: nnx.List, mid: MidBlock, x: jax.Array, emb: jax.Array,
                 context: TextContext) -> tuple[jax.Array, list[jax.Array]]:
    """The down blocks then the mid block on `x` (after conv_in): the mid block's output and the
    skips the up blocks take (conv_in's output first), as a UNet and a ControlNet run them."""
    skips = [x]
    for block in blocks:
        x, block_skips = block(x, emb, context)
        skips.extend(block_skips)
    return mid(x, emb, context), skips


class ControlResiduals(NamedTuple):
    """What ControlNets add to a UNet: one residual per skip (`down`, in the skips' order) and one
    to the mid block's output, as diffusers' down_block_additional_residuals and
    mid_block_additional_residual."""
    down: tuple[jax.Array, ...]
    mid: jax.Array


class UNet2DConditionModel(nnx.Module):
    def __init__(self, config: UNetConfig, precision: Precision = Precision()):
        c, p = config, precision
        self.config = c
        ch = c.block_out_channels
        self.conv_in = Conv(c.in_channels, ch[0], p)
        self.time_embedding = TimestepEmbedding(ch[0], c.time_embed_dim, p)
        self.add_embedding = TimestepEmbedding(c.projection_class_embeddings_input_dim, c.time_embed_dim, p)
        n = len(ch)
        self.down_blocks = down_blocks(c, p)
        self.mid_block = mid_block(c, p)
        rev = list(reversed(ch))
        up, out_ch = [], rev[0]
        for i, (kind, layers, depths, heads, context_dim) in enumerate(zip(
                c.up_block_types, reversed(c.layers_per_block), c.up_transformer_layers,
                reversed(c.num_attention_heads), reversed(c.cross_attention_dim), strict=True)):
            prev_ch, out_ch = out_ch, rev[i]
            in_ch = rev[min(i + 1, n - 1)]
            up.append(UpBlock(in_ch, out_ch, prev_ch, c.time_embed_dim, layers + 1,
                              has_attention=kind == "CrossAttnUpBlock2D", transformer_layers_per_block=depths,
                              num_attention_heads=heads, cross_attention_dim=context_dim, add_upsample=i < n - 1,
                              **block_options(c, p)))
        self.up_blocks = nnx.List(up)
        self.conv_norm_out = GroupNorm(c.norm_num_groups, ch[0], c.norm_eps, p)
        self.conv_out = Conv(ch[0], c.out_channels, p)
        for i, block in enumerate(self.transformer_blocks()):
            block.cross_index = i

    def transformer_blocks(self) -> list[BasicTransformerBlock]:
        """Every BasicTransformerBlock, in the order an evaluation runs them."""
        return [layer for block in (*self.down_blocks, self.mid_block, *self.up_blocks)
                if block.attentions is not None for model in block.attentions for layer in model.transformer_blocks]

    def cross_kv(self, encoder_hidden_states: jax.Array) -> tuple[tuple[jax.Array, jax.Array], ...]:
        """Each transformer block's cross-attention keys and values (B, L, H, D) of the text
        (B, L, D), for __call__'s `cross_kv`. They depend on the prompt alone, so a call projects
        them once, not at every step: XLA hoists them out of a fused loop by itself, but not out of
        the server's one program a step (on a TPU v5e, 4 images at 1024x1024, that loop was 4.1 %
        slower than the fused one with them, 2.3 % without: RESULTS.md, 2026-12-07)."""
        states = encoder_hidden_states.astype(self.conv_in.dtype or encoder_hidden_states.dtype)
        return tuple(block.attn2.project_context(states) for block in self.transformer_blocks())

    def __call__(self, sample: jax.Array, timesteps: jax.Array, encoder_hidden_states: jax.Array,
                 text_embeds: jax.Array, time_ids: jax.Array, context_lengths: jax.Array | None = None,
                 control: ControlResiduals | None = None,
                 cross_kv: tuple[tuple[jax.Array, jax.Array], ...] | None = None,
                 image_prompt: ImagePrompt | None = None) -> jax.Array:
        """One UNet evaluation.

        sample: (B, H, W, C) latents; timesteps: (B,) or scalar; encoder_hidden_states: (B, L, D);
        text_embeds: (B, pooled_dim) pooled text embedding; time_ids: (B, 6) SDXL micro-conditioning;
        context_lengths: (B,) tokens of encoder_hidden_states that count (the rest: padding);
        control: ControlNets' residuals (controlnet.py), added to the skips and the mid block's output;
        cross_kv: cross_kv(encoder_hidden_states), projected beforehand (None: projected here);
        image_prompt: an IP-Adapter's keys and values and scales (ip_adapter.IPAdapter), or None.
        """
        dtype = self.conv_in.dtype or sample.dtype
        emb = conditioning(self.config, self.time_embedding, self.add_embedding, dtype, timesteps, text_embeds,
                           time_ids)
        context = TextContext(encoder_hidden_states.astype(dtype), context_lengths, kv=cross_kv, image=image_prompt)
        x, skips = down_and_mid(self.down_blocks, self.mid_block, self.conv_in(sample.astype(dtype)), emb, context)
        if control is not None:
            skips = [s + r.astype(s.dtype) for s, r in zip(skips, control.down, strict=True)]
            x = x + control.mid.astype(x.dtype)
        for block in self.up_blocks:
            n = len(block.resnets)
            block_skips, skips = skips[-n:], skips[:-n]
            upsample_size = tuple(skips[-1].shape[1:3]) if skips else None
            x = block(x, block_skips, emb, context, upsample_size)
        x = self.conv_out(jax.nn.silu(self.conv_norm_out(x)))
        return x
