"""The compiling part of the generator: each size's sharded programs (programs.py), made once when
first needed, side by side (compiled.py), stored and read back untraced by a new process
(stored_programs.py), and JAX's set-up with the counter that proves nothing recompiles
(compilation.py)."""
