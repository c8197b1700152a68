"""A loaded pipeline as a server sees it before anything is generated: every program compiled,
nothing loaded beside the model (no ControlNet, IP-Adapter, refiner, embedding or upscaler). Tests
of the server and the page subclass it and set what they look at (tokenizers, samplers, sizes)."""

from sdxl_tpu.generate.upscaling import ModelUpscalers
from sdxl_tpu.weights.embeddings import Embeddings


class LoadedStandIn:
    sizes, images_per_call, tokenizers = [(64, 64)], 4, (None, None)
    call_programs = staticmethod(lambda guided=True, **kinds: ("encode", "noise", "denoise", "decode"))
    embeddings = Embeddings()
    upscalers = ModelUpscalers()
    unit_models, ip_adapters, refiner, ip_adapter, controlnets = (), (), None, None, {}
    model_name, samplers, default_sampler, max_prompt_chunks = "fake", {"Euler": None}, "Euler", 3

    def is_compiled(self, size, names=None):
        return True
