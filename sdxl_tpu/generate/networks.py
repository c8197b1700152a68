"""The networks a Pipeline runs, as its programs take them: each nnx module split into its (static)
graph and its arrays, the arrays replicated on every device. Abstract networks
(Checkpoint.abstract()) give abstract parameters: enough to compile the programs while the weights
are read, which `take` then gives."""

from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import NamedSharding

from ..weights.checkpoint import Models
from .compiling.programs import NETWORKS


class Networks:
    """`graphs` and `params` by name (programs.NETWORKS', "taesd", controlnet_key(name)'s, ...)."""

    def __init__(self, replicated: NamedSharding):
        self.replicated = replicated
        self.graphs: dict[str, nnx.GraphDef] = {}
        self.params: dict[str, nnx.State] = {}
        self.abstract = False  # (some parameters are shapes alone)

    def add(self, key: str, module: nnx.Module) -> None:
        self.graphs[key], state = nnx.split(module)
        self.params[key] = self._replicate(state)
        self.abstract = self.abstract or _is_abstract(self.params[key])

    def _replicate(self, state: nnx.State) -> nnx.State:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.replicated)
                            if isinstance(x, jax.ShapeDtypeStruct) else jax.device_put(x, self.replicated), state)

    def take(self, models: Models) -> None:
        """The weights of `models`, networks of the shapes these were built from (abstract ones, filled)."""
        for name in NETWORKS:
            _, state = nnx.split(getattr(models, name))
            have, given = jax.tree.structure(self.params[name]), jax.tree.structure(state)
            shapes = lambda tree: [(x.shape, x.dtype) for x in jax.tree.leaves(tree)]  # noqa: E731
            if have != given or shapes(self.params[name]) != shapes(state):
                raise ValueError(f"{name}: the weights given are not of the networks this pipeline was built for")
            self.params[name] = self._replicate(state)
        self.abstract = any(_is_abstract(state) for state in self.params.values())


def _is_abstract(state: nnx.State) -> bool:
    return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(state))
