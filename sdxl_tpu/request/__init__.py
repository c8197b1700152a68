"""What a generation is, in plain Python (no JAX, no HTTP): the form's fields (one list), a request and
its checks, the errors it can meet, the names it chooses from, what to load, presets and styles."""
