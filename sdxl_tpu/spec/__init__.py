"""What a generation is, in plain Python: the names a request chooses from, the form's fields, a
request and its checks, errors, A1111's prompts and parameters texts, recipes, styles, image files
with their parameters, the command-line options. It imports neither JAX nor flax, nor anything of
sdxl_tpu outside it (but the version), so the parts that check requests and name things (a front
end among them) are JAX-free by construction (tests/test_layout.py proves it)."""
