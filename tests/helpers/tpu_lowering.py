"""Lowers every per-size program for TPU at SDXL base 1.0's architecture and 1024x1024, from
whatever machine runs it (JAX lowers for a platform it does not have), with shapes alone: the
networks are built abstractly (nnx.eval_shape) and the parameters are ShapeDtypeStructs, so no
weight is in memory. Run by tests/models/test_tpu_lowering.py in a process of its own with four
simulated devices (a v5e-4 host's mesh); prints one JSON object: per program, what its lowered
StableHLO says (which attention calls reach the splash kernel and at what sequence lengths, how
its arguments are sharded, whether it calls back to the host)."""

from __future__ import annotations

import json
import re
import sys
import time
from collections import Counter

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sdxl_tpu.generate.compiling.layout import BATCH, Layout
from sdxl_tpu.generate.compiling.programs import PROGRAMS, program
from sdxl_tpu.models.layers import Precision
from sdxl_tpu.weights.architectures import architecture_configs
from sdxl_tpu.weights.tiny import abstract_networks

SIZE = (1024, 1024)


def splash_calls(text: str) -> dict[int, int]:
    """Sequence length -> call sites of the functions that run the splash kernel (JAX outlines
    each attention function once per shape and calls it from every layer of that shape)."""
    bodies = re.split(r"\n  func\.func ", text)
    calls: Counter = Counter()
    for body in bodies:
        head = re.match(r"(?:private |public )?@([\w.$-]+)\((?:%arg0: tensor<\d+x(\d+)x)?", body)
        if head and head.group(2) and "call @_splash_attention" in body and "tpu_custom_call" not in body:
            calls[int(head.group(2))] += len(re.findall(r"call @%s\(" % re.escape(head.group(1)), text))
    return dict(calls)


def arguments(text: str) -> dict[str, int]:
    """How the main function's arguments are sharded: split over the batch axis, or replicated."""
    main = text[text.index("func.func public @main"):]
    signature = main[:main.index(") -> (")]
    return {"batch": signature.count('[{"batch"}'), "replicated": len(re.findall(r"sdy.sharding<@mesh, \[(?:\{\}|\])",
                                                                               signature)),
            "all": len(re.findall(r"%arg\d+:", signature))}


def main() -> None:
    began = time.perf_counter()
    configs = architecture_configs("sdxl")
    mesh = Mesh(np.array(jax.devices()), (BATCH,))
    replicated = NamedSharding(mesh, P())
    graphs, params = {}, {}
    for name, network in abstract_networks(configs, Precision.of("bfloat16")).items():
        graphs[name], state = nnx.split(network)
        params[name] = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), state)
    layout = Layout(mesh=mesh, batch=len(jax.devices()), vae_factor=8, latent_channels=4, condition_channels=0,
                    chunks=3, text_widths=(768, 1280), text_dtype="bfloat16", pooled_dim=1280, stepwise=False)
    report = {"devices": len(jax.devices()), "mesh": re.sub(r"\s", "", str(dict(mesh.shape))), "programs": {}}
    for name in PROGRAMS:
        fn, args = program(name, layout, SIZE, graphs, params)
        text = fn.trace(*args).lower(lowering_platforms=("tpu",)).as_text()
        report["programs"][name] = {"splash_calls": splash_calls(text), "arguments": arguments(text),
                                    "mesh": 'sdy.mesh @mesh = <["batch"=' in text,
                                    "kernels": text.count("@tpu_custom_call("), "callbacks": text.count("callback")}
    report["seconds"] = round(time.perf_counter() - began, 1)
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
