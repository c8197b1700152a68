"""Where weights come from and how they reach the networks: the Hub and local paths (hub.py),
safetensors <-> Flax parameters (tensors.py), diffusers checkpoints (checkpoint.py), A1111 and
ComfyUI single files (single_file.py), LoRA fused at load (lora.py), and the tiny checkpoint the
tests and `--model tiny` use (tiny.py)."""
