"""The runtime package needs neither torch nor diffusers."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import sys
# Make torch and diffusers unimportable (and invisible to importlib.util.find_spec).
for name in ("torch", "diffusers", "torchvision", "accelerate"):
    sys.modules[name] = None
import sdxl_tpu, jax.numpy as jnp
models = sdxl_tpu.load_models(sys.argv[1], dtype="float32")
tok1, tok2 = sdxl_tpu.load_tokenizers(sys.argv[1])
ids = tok1("a photo of a cat", padding="max_length", max_length=77, return_tensors="np").input_ids
hidden, _ = models.text_encoder(jnp.asarray(ids))
assert hidden.shape == (1, 77, 32), hidden.shape
leaked = [m for m in ("torch", "diffusers") if sys.modules.get(m) is not None]
assert not leaked, leaked
print("ok")
"""


def test_import_and_load_without_torch_or_diffusers(tiny_checkpoint):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_checkpoint)], capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
