"""`python -m sdxl_tpu bench`: the workload and its figures (run.py), and the FLOPs of a
configuration (flops.py)."""
