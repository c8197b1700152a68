"""sdxl-tpu: Stable Diffusion XL in JAX/Flax, served from one compiled, replicated pipeline."""

from .checkpoint import Models, load_models, load_text_encoder, load_tokenizers, load_unet, load_vae, resolve
from .clip import CLIPTextConfig, CLIPTextModel
from .compilation import CompileCounter, enable_compile_cache
from .layers import Precision
from .pipeline import GenerationError, GenerationResult, Pipeline, load_pipeline
from .request import ImageInfo, Request, RequestError
from .samplers import EulerDiscrete
from .scheduler import Sampler
from .unet import UNet2DConditionModel, UNetConfig
from .vae import AutoencoderKL, VAEConfig
from .hub import CheckpointError

__all__ = ["AutoencoderKL", "CLIPTextConfig", "CLIPTextModel", "CheckpointError", "CompileCounter", "EulerDiscrete",
           "GenerationError", "GenerationResult", "ImageInfo", "Models", "Pipeline", "Precision", "Request",
           "RequestError", "Sampler", "UNet2DConditionModel", "UNetConfig", "VAEConfig", "enable_compile_cache",
           "load_models", "load_pipeline", "load_text_encoder", "load_tokenizers", "load_unet", "load_vae", "resolve"]
