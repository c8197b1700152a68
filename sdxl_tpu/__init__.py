"""sdxl-tpu: Stable Diffusion XL in JAX/Flax, served from one compiled, replicated pipeline."""

from .checkpoint import Models, load_models, load_text_encoder, load_tokenizers, load_unet, load_vae, resolve
from .clip import CLIPTextConfig, CLIPTextModel
from .compilation import CompileCounter, enable_compile_cache
from .layers import Precision
from .pipeline import GenerationError, GenerationResult, ImageInfo, Pipeline, load_pipeline
from .scheduler import EulerDiscrete
from .unet import UNet2DConditionModel, UNetConfig
from .vae import AutoencoderKL, VAEConfig
from .weights import CheckpointError

__all__ = ["AutoencoderKL", "CLIPTextConfig", "CLIPTextModel", "CheckpointError", "CompileCounter", "EulerDiscrete",
           "GenerationError", "GenerationResult", "ImageInfo", "Models", "Pipeline", "Precision", "enable_compile_cache",
           "load_pipeline",
           "UNet2DConditionModel", "UNetConfig", "VAEConfig", "load_models", "load_text_encoder", "load_tokenizers",
           "load_unet", "load_vae", "resolve"]
