"""IP-Adapters from disk: the published SDXL files (h94/IP-Adapter's ip-adapter_sdxl and
ip-adapter-plus_sdxl_vit-h, .safetensors or torch's .bin, read without torch or pickle's code), and
the CLIP image encoder they take, a transformers folder (config.json and model.safetensors of a
CLIPVisionModelWithProjection).

A file holds `image_proj.*` (the projection, in the original IP-Adapter's names) and
`ip_adapter.<n>.to_k_ip.weight` / `.to_v_ip.weight`, where n counts the UNet's attention processors
as the original code (and diffusers' _convert_ip_adapter_attn_to_diffusers) does: in the order torch
registered the modules (down blocks, up blocks, then the mid block), self- and cross-attention of each
transformer block, so the cross-attentions are 1, 3, 5, ... Names are mapped onto models/ip_adapter.py
as diffusers' _convert_ip_adapter_image_proj_to_diffusers maps them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from flax import nnx

from ..models.clip_vision import CLIPVisionConfig, CLIPVisionModelWithProjection
from ..models.ip_adapter import IPAdapter, IPAdapterConfig, RESAMPLER_HEAD_DIM, unet_attention_shapes
from ..models.layers import Precision
from .errors import CheckpointError, IPAdapterError
from .tensors import TensorSource, load_into, read_json, weight_files
from .torch_zip import read_torch_zip

MAX_BIN_BYTES = 4 << 30  # (the published SDXL .bin files hold 0.7 and 1.0 GB)
BIN_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")

# The plus adapter's resampler: the original IP-Adapter's names -> diffusers' (to_kv is split apart).
_PLUS_RENAMES = ((r"layers\.(\d+)\.0\.norm1\.", r"layers.\1.ln0."), (r"layers\.(\d+)\.0\.norm2\.", r"layers.\1.ln1."),
                 (r"layers\.(\d+)\.0\.to_q\.", r"layers.\1.attn.to_q."),
                 (r"layers\.(\d+)\.0\.to_out\.", r"layers.\1.attn.to_out.0."),
                 (r"layers\.(\d+)\.1\.0\.", r"layers.\1.ff.0."),
                 (r"layers\.(\d+)\.1\.1\.", r"layers.\1.ff.1.net.0.proj."),
                 (r"layers\.(\d+)\.1\.3\.", r"layers.\1.ff.1.net.2."))
_TO_KV = re.compile(r"layers\.(\d+)\.(?:0\.to_kv|attn\.to_kv)\.weight")
# Other IP-Adapter kinds, told apart by diffusers' loader by these keys: refused by name.
_OTHER_KINDS = (("perceiver_resampler.proj_in.weight", "FaceID Plus"), ("proj.3.weight", "full face"),
                ("norm.weight", "FaceID"))


def read_ip_adapter(path: str | Path) -> dict[str, np.ndarray]:
    """The tensors of an IP-Adapter file by their flat names (`image_proj.*`, `ip_adapter.*`)."""
    path = Path(path)
    if not path.is_file():
        raise IPAdapterError(f"IP-Adapter {path}: no such file")
    if path.suffix == ".safetensors":
        try:
            source = TensorSource([path])
            return {key: source.get(key) for key in source.keys()}
        except CheckpointError as e:
            raise IPAdapterError(f"IP-Adapter {path.name}: {e}") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise IPAdapterError(f"IP-Adapter {path.name}: not a readable .safetensors file "
                                 f"({type(e).__name__}: {str(e)[:200]})") from None
    if path.suffix in BIN_SUFFIXES:
        try:
            state = read_torch_zip(str(path), MAX_BIN_BYTES)
        except CheckpointError as e:
            raise IPAdapterError(f"IP-Adapter {path.name}: {e}") from None
        parts = [(part, state.get(part) if isinstance(state, dict) else None) for part in ("image_proj", "ip_adapter")]
        flat = {f"{part}.{key}": value for part, d in parts if isinstance(d, dict) for key, value in d.items()}
        if not all(isinstance(d, dict) for _, d in parts):
            raise IPAdapterError(f"IP-Adapter {path.name}: not an IP-Adapter (torch.save of a dict of 'image_proj' "
                                 "and 'ip_adapter' state dicts)")
        bad = [key for key, value in flat.items() if not isinstance(value, np.ndarray)]
        if bad:
            raise IPAdapterError(f"IP-Adapter {path.name}: {bad[0]} is not a tensor")
        return flat
    raise IPAdapterError(f"IP-Adapter {path.name}: not a .safetensors or .bin file")


def attention_numbers(unet) -> list[int]:
    """The number the IP-Adapter file gives each cross-attention of `unet`, by transformer_blocks() index."""
    count = lambda blocks: sum(len(m.transformer_blocks) for b in blocks if b.attentions is not None
                               for m in b.attentions)
    down, mid, up = count(unet.down_blocks), count([unet.mid_block]), count(unet.up_blocks)
    processors = [*range(down), *range(down + mid, down + mid + up), *range(down, down + mid)]
    numbers = [0] * len(processors)
    for position, index in enumerate(processors):
        numbers[index] = 2 * position + 1
    return numbers


def _image_proj(tensors: dict[str, np.ndarray], name: str) -> tuple[bool, dict[str, np.ndarray], dict[str, str]]:
    """(plus?, the projection's tensors by our names, the file's name of each)."""
    proj = {key[len("image_proj."):]: value for key, value in tensors.items() if key.startswith("image_proj.")}
    if "proj.weight" in proj:
        renamed = {key.replace("proj.", "image_embeds.", 1) if key.startswith("proj.") else key: key for key in proj}
        return False, {new: proj[old] for new, old in renamed.items()}, renamed
    if "latents" not in proj:
        for key, kind in _OTHER_KINDS:
            if key in proj:
                raise IPAdapterError(f"IP-Adapter {name}: an IP-Adapter {kind}, which is not supported (the plain "
                                     "and plus SDXL adapters are)")
        raise IPAdapterError(f"IP-Adapter {name}: no image projection (image_proj.proj.weight or "
                             "image_proj.latents): not an IP-Adapter")
    out, labels = {}, {}
    for key, value in proj.items():
        if m := _TO_KV.fullmatch(key):
            if value.ndim != 2 or value.shape[0] % 2:
                raise IPAdapterError(f"IP-Adapter {name}: image_proj.{key} of shape {value.shape} is not a "
                                     "keys-and-values projection")
            half = value.shape[0] // 2
            for part, rows in (("to_k", value[:half]), ("to_v", value[half:])):
                out[f"layers.{m.group(1)}.attn.{part}.weight"] = rows
                labels[f"layers.{m.group(1)}.attn.{part}.weight"] = key
            continue
        new = key
        for pattern, replacement in _PLUS_RENAMES:
            new = re.sub("^" + pattern, replacement, new)
        out[new], labels[new] = value, key
    return True, out, labels


def _shape(arrays: dict[str, np.ndarray], key: str, ndim: int, name: str) -> tuple[int, ...]:
    if key not in arrays or arrays[key].ndim != ndim:
        raise IPAdapterError(f"IP-Adapter {name}: image_proj.{key} is missing or not {ndim}-dimensional")
    return tuple(arrays[key].shape)


def ip_adapter_config(plus: bool, proj: dict[str, np.ndarray], unet, name: str) -> IPAdapterConfig:
    """The config of an adapter whose projection's tensors (our names) are `proj`, for `unet`."""
    blocks = unet_attention_shapes(unet)
    if not plus:
        (width,) = _shape(proj, "norm.weight", 1, name)
        out, embed = _shape(proj, "image_embeds.weight", 2, name)
        if out % width:
            raise IPAdapterError(f"IP-Adapter {name}: image_proj.proj.weight's {out} rows are not tokens of "
                                 f"the norm's width {width}")
        return IPAdapterConfig(plus=False, image_embed_dim=embed, cross_attention_dim=width, num_tokens=out // width,
                               blocks=blocks)
    _, queries, hidden = _shape(proj, "latents", 3, name)
    _, embed = _shape(proj, "proj_in.weight", 2, name)
    width, _ = _shape(proj, "proj_out.weight", 2, name)
    inner, _ = _shape(proj, "layers.0.attn.to_q.weight", 2, name)
    ff_inner, _ = _shape(proj, "layers.0.ff.1.net.0.proj.weight", 2, name)
    if inner % RESAMPLER_HEAD_DIM:
        raise IPAdapterError(f"IP-Adapter {name}: its resampler's attention width {inner} is not heads of "
                             f"{RESAMPLER_HEAD_DIM}")
    depth = len({int(m.group(1)) for key in proj if (m := re.match(r"layers\.(\d+)\.", key))})
    return IPAdapterConfig(plus=True, image_embed_dim=embed, cross_attention_dim=width, num_tokens=queries,
                           blocks=blocks, hidden_dims=hidden, depth=depth, heads=inner // RESAMPLER_HEAD_DIM,
                           ff_inner=ff_inner)


class _Named:
    """Tensors (tensors.py's protocol) by our names, errors naming them as the file does."""

    def __init__(self, arrays: dict[str, np.ndarray], labels: dict[str, str]):
        self.arrays, self.labels = arrays, labels

    def keys(self) -> list[str]:
        return list(self.arrays)

    def label(self, key: str) -> str:
        return self.labels.get(key, key)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.arrays[key].shape)

    def get(self, key: str) -> np.ndarray:
        return self.arrays[key]


def load_ip_adapter(path: str | Path, unet, precision: Precision = Precision()) -> IPAdapter:
    """An IP-Adapter file (plain or plus, told by its keys) for `unet` (abstract or concrete)."""
    path = Path(path)
    name = path.name
    tensors = read_ip_adapter(path)
    if any("lora" in key for key in tensors if key.startswith("ip_adapter.")):
        raise IPAdapterError(f"IP-Adapter {name}: it carries LoRA weights (a FaceID adapter), which are not supported")
    plus, proj, proj_labels = _image_proj(tensors, name)
    config = ip_adapter_config(plus, proj, unet, name)
    arrays = {f"image_proj.{key}": value for key, value in proj.items()}
    labels = {f"image_proj.{new}": f"image_proj.{old}" for new, old in proj_labels.items()}
    numbers = attention_numbers(unet)
    found = {int(m.group(1)) for key in tensors if (m := re.fullmatch(r"ip_adapter\.(\d+)\.to_[kv]_ip\.weight", key))}
    if found != set(numbers):
        raise IPAdapterError(f"IP-Adapter {name}: made for a UNet with {len(found)} cross-attentions; this UNet has "
                             f"{len(numbers)} (an adapter for another model, e.g. SD 1.5's?)")
    widths = {block.attn2.to_k.kernel.shape[0] for block in unet.transformer_blocks()}
    if widths != {config.cross_attention_dim}:
        raise IPAdapterError(f"IP-Adapter {name}: its image tokens are {config.cross_attention_dim} wide; this UNet's "
                             f"cross-attention takes {sorted(widths)}")
    for i, n in enumerate(numbers):
        for part in ("to_k_ip", "to_v_ip"):
            labels[f"{part}.{i}.weight"] = key = f"ip_adapter.{n}.{part}.weight"
            if key in tensors:  # (else load_into names it missing)
                arrays[f"{part}.{i}.weight"] = tensors[key]
    known = set(labels.values())
    unexpected = sorted(key for key in tensors if key.startswith("ip_adapter.") and key not in known
                        or not key.startswith(("image_proj.", "ip_adapter.")))
    if unexpected:
        raise IPAdapterError(f"IP-Adapter {name}: unexpected tensors {', '.join(unexpected[:5])}")
    model = nnx.eval_shape(lambda: IPAdapter(config, precision))
    return load_into(model, _Named(arrays, labels), component=f"IP-Adapter ({name})")


def _vision_name(key: str) -> str:
    """Some savers drop the `vision_model.` prefix, as transformers 5 drops text_model. (tensors.py)."""
    return key if key.startswith(("vision_model.", "visual_projection.")) else "vision_model." + key


def image_encoder_config(raw: dict[str, Any], name: str) -> CLIPVisionConfig:
    if raw.get("model_type") == "clip" or "vision_config" in raw:
        raise IPAdapterError(f"image encoder {name}: a whole CLIP model's config; an IP-Adapter's image encoder is a "
                             "CLIPVisionModelWithProjection (as h94/IP-Adapter's image_encoder folders hold)")
    try:
        return CLIPVisionConfig.from_dict(raw)
    except ValueError as e:
        raise IPAdapterError(f"image encoder {name}: {e}") from None


def load_image_encoder(path: str | Path, precision: Precision = Precision()) -> CLIPVisionModelWithProjection:
    """The image encoder: a folder with config.json and model.safetensors (CLIPVisionModelWithProjection)."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise IPAdapterError(f"image encoder {path}: no config.json (a CLIPVisionModelWithProjection folder is needed)")
    config = image_encoder_config(dict(read_json(config_file)), path.name)
    model = nnx.eval_shape(lambda: CLIPVisionModelWithProjection(config, precision))
    return load_into(model, TensorSource(weight_files(path)), rename=_vision_name,
                     component=f"image encoder ({path.name})")


def check_image_encoder(adapter: IPAdapterConfig, encoder: CLIPVisionConfig) -> None:
    """Whether `encoder` gives what `adapter` takes: the projected embedding (plain) or the hidden
    states (plus) of its width; ip-adapter_sdxl takes ViT-bigG/14's (1280), the plus ViT-H/14's (1280 hidden)."""
    what, have = (("hidden states", encoder.hidden_size) if adapter.plus
                  else ("projected embeddings", encoder.projection_dim))
    if have != adapter.image_embed_dim:
        raise IPAdapterError(f"the IP-Adapter takes an image encoder's {what} {adapter.image_embed_dim} wide; this "
                             f"image encoder's are {have} wide (the wrong encoder for this adapter)")


class ImagePromptModels(NamedTuple):
    """An IP-Adapter and its image encoder, as a Pipeline takes them; `name`: what a call's unit names it by."""
    name: str
    adapter: IPAdapter
    encoder: CLIPVisionModelWithProjection


def load_image_prompt(name: str, adapter: str | Path, encoder: str | Path | None, unet,
                      precision: Precision = Precision()) -> ImagePromptModels:
    """The IP-Adapter file `adapter` for `unet` and the image encoder folder `encoder` it takes,
    checked against each other (IPAdapterError says what is wrong)."""
    if encoder is None:
        raise IPAdapterError(f"IP-Adapter {Path(adapter).name}: give its image encoder too (--image-encoder: "
                             "h94/IP-Adapter's sdxl_models/image_encoder for ip-adapter_sdxl, models/image_encoder "
                             "for the vit-h adapters)")
    loaded = load_ip_adapter(adapter, unet, precision)
    image_encoder = load_image_encoder(encoder, precision)
    check_image_encoder(loaded.config, image_encoder.config)
    return ImagePromptModels(name, loaded, image_encoder)
