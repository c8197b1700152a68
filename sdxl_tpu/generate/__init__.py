"""The generator (JAX): prompt to images. sampling.py reads top to bottom; pipeline.py compiles its
stages per size (programs.py) and runs them, replicated and sharded over the devices; loading.py
builds a Pipeline from a checkpoint. Only the server's local engine imports this package."""
