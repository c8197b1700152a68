"""CLIP text encoders of SDXL, mirroring transformers' CLIPTextModel(WithProjection).

text_encoder:   CLIP ViT-L/14 text tower (quick_gelu).
text_encoder_2: OpenCLIP ViT-bigG/14 text tower (gelu) with text_projection.
SDXL uses the penultimate layer's hidden states of both and encoder 2's projected
pooled output, taken at the EOS token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import nnx

from .layers import ACTIVATIONS, Embed, LayerNorm, Precision, attention, Linear


@dataclass(frozen=True)
class CLIPTextConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int
    hidden_act: str
    layer_norm_eps: float
    eos_token_id: int
    projection_dim: int | None = None

    @staticmethod
    def from_dict(cfg: dict[str, Any], *, with_projection: bool) -> "CLIPTextConfig":
        act = cfg.get("hidden_act", "quick_gelu")
        if act not in ("quick_gelu", "gelu"):
            raise ValueError(f"text encoder config: unsupported hidden_act={act!r} (supported: quick_gelu, gelu)")
        try:
            return CLIPTextConfig(
                vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                intermediate_size=cfg["intermediate_size"], num_hidden_layers=cfg["num_hidden_layers"],
                num_attention_heads=cfg["num_attention_heads"],
                max_position_embeddings=cfg.get("max_position_embeddings", 77), hidden_act=act,
                layer_norm_eps=cfg.get("layer_norm_eps", 1e-5), eos_token_id=cfg.get("eos_token_id", 2),
                projection_dim=cfg.get("projection_dim") if with_projection else None)
        except KeyError as e:
            raise ValueError(f"text encoder config: missing key {e.args[0]!r}") from None


class EncoderShape(Protocol):
    """What an encoder layer reads off its config: the text's (CLIPTextConfig) or the image's
    (clip_vision.CLIPVisionConfig), whose layers are the same but not causal."""

    @property
    def hidden_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def hidden_act(self) -> str: ...
    @property
    def layer_norm_eps(self) -> float: ...


class CLIPAttention(nnx.Module):
    def __init__(self, c: EncoderShape, p: Precision, causal: bool = True):
        d = c.hidden_size
        self.heads, self.attention_kernel, self.causal = c.num_attention_heads, p.attention, causal
        self.q_proj, self.k_proj = Linear(d, d, p), Linear(d, d, p)
        self.v_proj, self.out_proj = Linear(d, d, p), Linear(d, d, p)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, n, d = x.shape
        split = lambda t: t.reshape(b, n, self.heads, d // self.heads)
        out = attention(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)), is_causal=self.causal,
                        kernel=self.attention_kernel)
        return self.out_proj(out.reshape(b, n, d))


class CLIPMLP(nnx.Module):
    def __init__(self, c: EncoderShape, p: Precision):
        self.fc1 = Linear(c.hidden_size, c.intermediate_size, p)
        self.fc2 = Linear(c.intermediate_size, c.hidden_size, p)
        self.act = ACTIVATIONS[c.hidden_act]

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(nnx.Module):
    def __init__(self, c: EncoderShape, p: Precision, causal: bool = True):
        self.layer_norm1 = LayerNorm(c.hidden_size, c.layer_norm_eps, p)
        self.self_attn = CLIPAttention(c, p, causal)
        self.layer_norm2 = LayerNorm(c.hidden_size, c.layer_norm_eps, p)
        self.mlp = CLIPMLP(c, p)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class CLIPEmbeddings(nnx.Module):
    def __init__(self, c: CLIPTextConfig, p: Precision):
        self.token_embedding = Embed(c.vocab_size, c.hidden_size, p)
        self.position_embedding = Embed(c.max_position_embeddings, c.hidden_size, p)

    def __call__(self, input_ids: jax.Array, embedded: jax.Array | None = None) -> jax.Array:
        """`embedded` (B, T, D): the vectors of textual inversion embeddings, taken where the id is
        negative (prompts.EMBEDDED) instead of a token's row, as A1111 and diffusers place them."""
        positions = jnp.arange(input_ids.shape[1])[None, :]
        tokens = self.token_embedding(jnp.maximum(input_ids, 0))
        if embedded is not None:
            tokens = jnp.where((input_ids < 0)[..., None], embedded.astype(tokens.dtype), tokens)
        return tokens + self.position_embedding(positions)


class CLIPEncoder(nnx.Module):
    def __init__(self, c: CLIPTextConfig, p: Precision):
        self.layers = nnx.List([CLIPEncoderLayer(c, p) for _ in range(c.num_hidden_layers)])


class CLIPTextTransformer(nnx.Module):
    def __init__(self, c: CLIPTextConfig, p: Precision):
        self.embeddings = CLIPEmbeddings(c, p)
        self.encoder = CLIPEncoder(c, p)
        self.final_layer_norm = LayerNorm(c.hidden_size, c.layer_norm_eps, p)


class CLIPTextModel(nnx.Module):
    """CLIP text tower; `text_projection` exists only for text_encoder_2 (CLIPTextModelWithProjection)."""

    def __init__(self, config: CLIPTextConfig, precision: Precision = Precision()):
        self.config = config
        self.text_model = CLIPTextTransformer(config, precision)
        self.text_projection = (Linear(config.hidden_size, config.projection_dim, precision, bias=False)
                                if config.projection_dim else None)

    def __call__(self, input_ids: jax.Array, embedded: jax.Array | None = None
                 ) -> tuple[jax.Array, jax.Array | None]:
        """Returns (penultimate hidden states, projected pooled output or None); `embedded`: the
        vectors of textual inversion embeddings where an id is negative (CLIPEmbeddings).

        The pooled output needs the last layer, so it is only computed when there is a
        projection; text_encoder (without one) stops after the penultimate layer.
        """
        tm = self.text_model
        x = tm.embeddings(input_ids, embedded)
        layers = tm.encoder.layers
        for layer in layers[:-1]:
            x = layer(x)
        penultimate = x
        if self.text_projection is None:
            return penultimate, None
        last = tm.final_layer_norm(layers[-1](x))
        pooled = last[jnp.arange(last.shape[0]), self._eos_position(input_ids)]
        return penultimate, self.text_projection(pooled)

    def _eos_position(self, input_ids: jax.Array) -> jax.Array:
        # transformers: configs with the legacy eos_token_id 2 take the highest id (EOT is the
        # largest in CLIP's vocabulary); others take the first occurrence of eos_token_id. An
        # embedding's positions (id -1) are never the highest: pooled at the end token, as A1111
        # pools (transformers would pool at an added token's id, the highest).
        if self.config.eos_token_id == 2:
            return jnp.argmax(input_ids, axis=-1)
        return jnp.argmax((input_ids == self.config.eos_token_id).astype(jnp.int32), axis=-1)
