"""The samplers' host half: each sampler is a table of coefficients for one compiled update,
computed on the host in numpy (float64 math on diffusers' float32 schedules), by name; the sigma
schedules and timestep spacings they share; PyTorch's CPU noise. No JAX: the device half (the
update itself) is generate/sampler_update.py."""
