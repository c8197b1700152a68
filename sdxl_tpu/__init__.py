"""sdxl-tpu: Stable Diffusion XL in JAX/Flax, served from one compiled, replicated pipeline."""

from .checkpoint import Models, load_models, load_text_encoder, load_tokenizers, load_unet, load_vae, resolve
from .clip import CLIPTextConfig, CLIPTextModel
from .layers import Precision
from .unet import UNet2DConditionModel, UNetConfig
from .vae import AutoencoderKL, VAEConfig
from .weights import CheckpointError

__all__ = ["AutoencoderKL", "CLIPTextConfig", "CLIPTextModel", "CheckpointError", "Models", "Precision",
           "UNet2DConditionModel", "UNetConfig", "VAEConfig", "load_models", "load_text_encoder", "load_tokenizers",
           "load_unet", "load_vae", "resolve"]
