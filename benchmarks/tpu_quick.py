"""Quick measurements for tuning on a chip: one UNet evaluation, or attention alone, in seconds of
compile instead of the minutes of the whole pipeline's programs.

    python benchmarks/tpu_quick.py unet [--size 1024x1024] [--images 1] [--profile DIR] [--launch N] [--json]
    python benchmarks/tpu_quick.py attention [--json]

unet: SDXL base 1.0's UNet (random bf16 weights), one guided evaluation (2 rows an image, the
prompt's three-chunk context as the pipeline gives it): compile time, ms an evaluation, TFLOP/s,
and with --profile the device time by kind of operation (convolutions, matmuls, the attention
kernel, reductions, elementwise, copies/transposes) read from a jax.profiler trace.
`--save OUT.npy` keeps the output, `--against BEFORE.npy` says how far it moved (dB).
attention: each SDXL attention shape (the UNet's two self-attention levels, cross-attention on the
prompt, the VAE's mid block) under each kernel variant: ms a call and the largest error against
float32 attention.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import attention_kernels  # noqa: E402
from sdxl_tpu.models import attention as attn  # noqa: E402


def timed(fn, *args, runs: int = 10) -> float:
    """Median seconds of `runs` calls of a compiled `fn` (after one untimed call)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def per_call(fn, x, *rest, calls: int = 20) -> float:
    """Device seconds of one `fn(x, *rest)` (its output shaped as x): `calls` calls chained in one
    compiled loop against one, the difference per call, so dispatch and waiting cancel out."""

    def chained(n):
        return jax.jit(lambda x, *rest: jax.lax.fori_loop(0, n, lambda i, y: fn(y, *rest).astype(y.dtype), x))

    return (timed(chained(calls + 1), x, *rest, runs=5) - timed(chained(1), x, *rest, runs=5)) / calls


# --- the op-kind profile ---------------------------------------------------------------------

_OPCODE = re.compile(r"(?<![\w.])([a-z][\w\-]*)\(")  # the first lower-case name before "(": types take "[" or "{"

def op_kinds(hlo_text: str) -> dict[str, str]:
    """Each instruction of an optimized HLO module -> what kind of work it does: a fusion is what
    its fused computation holds (a 3x3 convolution, a matmul (TPU lowers dots to 1x1 convolutions),
    a Pallas kernel, a reduction, elementwise work), a plain copy or transpose a layout change."""
    bodies: dict[str, list[str]] = {}
    current = None
    for line in hlo_text.splitlines():
        stripped = line.strip()
        if stripped.endswith("{") and "=" not in stripped.split("(")[0]:
            current = stripped.split()[1 if stripped.startswith("ENTRY") else 0].lstrip("%")
            bodies[current] = []
        elif stripped == "}":
            current = None
        elif current is not None:
            bodies[current].append(stripped)

    def classify(lines: list[str], depth: int = 0) -> str:
        text = "\n".join(lines)
        if "tpu_custom_call" in text:
            return "attention kernel (Pallas)"
        if " convolution(" in text:
            return "convolution 3x3" if "size=3x3" in text else "matmul"
        if " dot(" in text:
            return "matmul"
        called = [c.lstrip("%") for line in lines for c in _called(line)]
        if depth < 3:
            kinds = {classify(bodies.get(c, []), depth + 1) for c in called}
            for kind in ("attention kernel (Pallas)", "convolution 3x3", "matmul"):
                if kind in kinds:
                    return kind
        if " reduce(" in text or " reduce-window(" in text:
            return "reduction (norms, softmax)"
        if any(op in text for op in (" transpose(", " copy(")) and not any(
                op in text for op in (" exponential(", " multiply(", " add(")):
            return "copy / transpose"
        return "elementwise"

    kinds = {}
    for body in bodies.values():
        for line in body:
            if " = " not in line:
                continue
            name = line.split(" = ")[0].strip().removeprefix("ROOT ").lstrip("%")
            op = line.split(" = ", 1)[1]
            found = _OPCODE.search(op)
            opcode = found.group(1) if found else ""
            if opcode == "fusion":
                kinds[name] = classify(sum((bodies.get(c.lstrip("%"), []) for c in _called(line)), []))
            elif opcode in ("copy", "transpose", "copy-start", "copy-done", "bitcast"):
                kinds[name] = "copy / transpose"
            elif opcode == "custom-call":
                kinds[name] = classify([line])
            elif opcode == "dot":
                kinds[name] = "matmul"
            elif opcode == "convolution":
                kinds[name] = classify([" " + line])
            elif opcode in ("reduce", "reduce-window"):
                kinds[name] = "reduction (norms, softmax)"
            else:
                kinds[name] = "other: " + opcode
    return kinds


def _called(line: str) -> list[str]:
    out = []
    for key in ("calls=", "to_apply=", "branch_computations={", "body=", "condition="):
        if key in line:
            rest = line.split(key, 1)[1]
            rest = rest.split("}", 1)[0] if key.endswith("{") else rest.split(",", 1)[0].split(" ", 1)[0]
            out += [c.strip() for c in rest.split(",")]
    return out


def device_time_by_kind(trace_dir: str, kinds: dict[str, str]) -> dict:
    """Device time of the traced calls by op kind, from the trace's XLA Ops line (TPU)."""
    from jax._src.lib import _profile_data

    files = sorted(Path(trace_dir).rglob("*.xplane.pb"))
    if not files:
        return {"error": f"no trace under {trace_dir}"}
    data = _profile_data.ProfileData.from_file(str(files[-1]))
    by_kind: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    categories: dict[str, float] = defaultdict(float)
    texts: dict[str, str] = {}
    stat_names: list[str] = []
    for plane in data.planes:
        if not plane.name.startswith("/device:TPU"):
            continue
        for line in plane.lines:
            if line.name != "XLA Ops":
                continue
            for event in line.events:
                name = event.name.split(" = ", 1)[0].strip().lstrip("%")  # the event is the instruction's text
                texts.setdefault(name, event.name[:240])
                if not stat_names:
                    stat_names.extend(str(k) for k, _ in event.stats)
                kind = kinds.get(name, "unknown")
                by_kind[kind] += event.duration_ns / 1e6
                by_op[name] += event.duration_ns / 1e6
                stats = dict(event.stats)
                if "hlo_category" in stats:
                    categories[str(stats["hlo_category"])] += event.duration_ns / 1e6
    total = sum(by_kind.values())
    return {"total_ms": total,
            "by_kind_ms": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "by_hlo_category_ms": dict(sorted(categories.items(), key=lambda kv: -kv[1])),
            "event_stats": stat_names,
            "ops_ms": [(name, ms, kinds.get(name, "unknown"), texts[name])
                       for name, ms in sorted(by_op.items(), key=lambda kv: -kv[1])]}


# --- one UNet evaluation -----------------------------------------------------------------------

def unet_eval(args: argparse.Namespace) -> dict:
    from sdxl_tpu.bench.flops import model_flops
    from sdxl_tpu.bench.random_weights import random_fill
    from sdxl_tpu.generate.sampling import MAX_TOKENS
    from sdxl_tpu.models.layers import Precision
    from sdxl_tpu.models.unet import UNet2DConditionModel, UNetConfig
    from sdxl_tpu.a1111.prompts import DEFAULT_MAX_CHUNKS
    from sdxl_tpu.weights.architectures import architecture_configs

    configs = architecture_configs(args.architecture)
    unet_cfg = configs["unet"]
    context_dim = unet_cfg["cross_attention_dim"]
    pooled_dim = unet_cfg["projection_class_embeddings_input_dim"] - 6 * unet_cfg["addition_time_embed_dim"]
    precision = Precision.of("bfloat16", attention=args.attention)
    unet = random_fill(nnx.eval_shape(lambda: UNet2DConditionModel(UNetConfig.from_dict(configs["unet"]),
                                                                     precision)), seed=2)
    graph, params = nnx.split(unet)
    width, height = (int(v) for v in args.size.split("x"))
    rows = 2 * args.images  # guided: each image's unconditional and conditional pass
    rng = np.random.default_rng(0)
    sample = jnp.asarray(rng.standard_normal((rows, height // 8, width // 8, 4)), jnp.float32)
    context = jnp.asarray(rng.standard_normal((rows, DEFAULT_MAX_CHUNKS * MAX_TOKENS, context_dim)), jnp.bfloat16)
    pooled = jnp.asarray(rng.standard_normal((rows, pooled_dim)), jnp.bfloat16)
    time_ids = jnp.tile(jnp.asarray([[height, width, 0, 0, height, width]], jnp.float32), (rows, 1))
    lengths = jnp.full((rows,), MAX_TOKENS, jnp.int32)
    t = jnp.float32(500.0)

    def forward(params, sample, context, pooled, time_ids, lengths):
        # (cast to the sample's dtype, so that --launch can feed an evaluation's output to the next)
        return nnx.merge(graph, params)(sample, t, context, pooled, time_ids, lengths).astype(sample.dtype)

    inputs = (params, sample, context, pooled, time_ids, lengths)
    start = time.perf_counter()
    compiled = jax.jit(forward).lower(*inputs).compile()
    compile_s = time.perf_counter() - start
    seconds = timed(compiled, *inputs, runs=args.runs)
    flops = model_flops(configs["unet"], configs["vae"], (width, height))["unet"] * rows
    report = {"what": "unet", "architecture": args.architecture, "size": args.size, "rows": rows,
              "attention": args.attention, "splash_min_length": attn.SPLASH_MIN_LENGTH, "gelu": args.gelu,
              "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS", ""),
              "device_kind": jax.devices()[0].device_kind, "compile_s": compile_s, "ms": seconds * 1e3,
              "tflops": flops / seconds / 1e12}
    out = np.asarray(compiled(*inputs).astype(jnp.float32))
    if args.save:
        np.save(args.save, out)
    if args.against:
        before = np.load(args.against)
        report["psnr_db_against_before"] = psnr(before, out)
    if args.launch:
        report["launch"] = launch_cost(compiled, forward, inputs, args.launch, tuple(args.launch_parts.split(",")))
    if args.profile:
        with jax.profiler.trace(args.profile):
            for _ in range(3):
                jax.block_until_ready(compiled(*inputs))
        hlo = compiled.as_text()
        if args.hlo:
            with gzip.open(args.hlo, "wt") as f:
                f.write(hlo)
        profile = device_time_by_kind(args.profile, op_kinds(hlo))
        if "total_ms" in profile:
            profile = {**profile, "per_eval_ms": profile["total_ms"] / 3,
                       "by_kind_ms_per_eval": {k: v / 3 for k, v in profile["by_kind_ms"].items()}}
        report["profile"] = profile
    return report


LAUNCH_PARTS = ("chained", "looped", "packed", "callback", "unordered")


def launch_cost(compiled, forward, inputs, calls: int, parts: tuple[str, ...] = LAUNCH_PARTS) -> dict:
    """What starting a program costs the chip: `calls` evaluations dispatched back to back (each
    fed the last one's output, none waited for: the stepwise loop's case, "chained") against the
    same in one program (the fused loop's, "looped"), ms an evaluation; the chained calls again
    with the weights packed into one buffer per dtype (sliced apart inside the program, "packed"),
    in case the cost is the ~2,500 weight buffers each start hands the program; and the one
    program telling the host of each evaluation as it ends ("callback": per-step progress from
    the fused loop), with when the host heard of each, from the call's start."""
    params, sample, *rest = inputs

    def chained(program, weights) -> float:
        def run():
            x = sample
            for _ in range(calls):
                x = program(weights, x, *rest)
            return x
        jax.block_until_ready(run())
        times = []
        for _ in range(3):
            start = time.perf_counter()
            jax.block_until_ready(run())
            times.append(time.perf_counter() - start)
        return statistics.median(times) / calls * 1e3

    report = {"calls": calls, "weight_buffers": len(jax.tree_util.tree_leaves(params))}
    if "chained" in parts:
        report["chained_ms"] = chained(compiled, params)
    for part, ordered in (("callback", True), ("unordered", False)):  # (unordered: XLA may move it)
        if part not in parts:
            continue
        heard: list[float] = []

        def step(p, i, y, *r, ordered=ordered, heard=heard):
            jax.debug.callback(lambda _: heard.append(time.perf_counter()), i, ordered=ordered)
            return forward(p, y, *r)

        told = jax.jit(lambda p, x, *r: jax.lax.fori_loop(0, calls, lambda i, y: step(p, i, y, *r), x))
        start = time.perf_counter()
        told = told.lower(*inputs).compile()
        report[f"{part}_compile_s"] = time.perf_counter() - start
        report[f"{part}_ms"] = timed(told, *inputs, runs=3) / calls * 1e3
        heard.clear()
        start = time.perf_counter()
        jax.block_until_ready(told(*inputs))
        report[f"{part}_heard_ms"] = [round((t - start) * 1e3, 1) for t in heard]
    if "looped" not in parts and "packed" not in parts:
        return report
    looped = jax.jit(lambda p, x, *r: jax.lax.fori_loop(0, calls, lambda i, y: forward(p, y, *r), x))
    start = time.perf_counter()
    looped = looped.lower(*inputs).compile()
    report["looped_compile_s"] = time.perf_counter() - start
    report["looped_ms"] = timed(looped, *inputs, runs=3) / calls * 1e3
    if "packed" not in parts:
        return report

    leaves, tree = jax.tree_util.tree_flatten(params)
    shapes = [(leaf.shape, str(leaf.dtype), leaf.size) for leaf in leaves]
    dtypes = sorted({dtype for _, dtype, _ in shapes})
    # (packed on the host: one transfer a dtype, no 2,500-operand program to compile for it)
    packed = {d: jax.device_put(np.concatenate([np.asarray(leaf).reshape(-1) for leaf in leaves
                                                if str(leaf.dtype) == d])) for d in dtypes}

    def unpacked(buffers, *args):
        offsets, out = dict.fromkeys(dtypes, 0), []
        for shape, d, size in shapes:
            out.append(jax.lax.slice(buffers[d], (offsets[d],), (offsets[d] + size,)).reshape(shape))
            offsets[d] += size
        return forward(jax.tree_util.tree_unflatten(tree, out), *args)

    start = time.perf_counter()
    packed_program = jax.jit(unpacked).lower(packed, sample, *rest).compile()
    report["packed_compile_s"] = time.perf_counter() - start
    report["packed_chained_ms"] = chained(packed_program, packed)
    report["packed_buffers"] = len(packed)
    return report


def psnr(reference: np.ndarray, value: np.ndarray) -> float:
    """Peak signal-to-noise ratio of `value` against `reference`, the reference's range as the peak."""
    mse = float(np.mean((reference.astype(np.float64) - value.astype(np.float64)) ** 2))
    peak = float(reference.max() - reference.min())
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)


# --- attention alone ---------------------------------------------------------------------------

# (name, batch, query length, key length, heads, head dim): SDXL at 1024x1024, one image guided.
ATTENTION_SHAPES = [
    ("self 64x64 (4096 tokens)", 2, 4096, 4096, 10, 64),
    ("self 32x32 (1024 tokens)", 2, 1024, 1024, 20, 64),
    ("self 76x52 (3952 tokens: 1216x832's 64x64 level)", 2, 3952, 3952, 10, 64),
    ("self 36x28 (1008 tokens: 1152x896's 32x32 level)", 2, 1008, 1008, 20, 64),
    ("self 24x24 (576 tokens: 768x768's 32x32 level)", 2, 576, 576, 20, 64),
    ("self 16x16 (256 tokens: 512x512's 32x32 level)", 2, 256, 256, 20, 64),
    ("cross 64x64 -> 77", 2, 4096, 77, 10, 64),
    ("cross 32x32 -> 77", 2, 1024, 77, 20, 64),
    ("VAE mid (16384 tokens, one 512 head)", 1, 16384, 16384, 1, 512),
]


def einsum_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, logits_dtype=jnp.float32) -> jax.Array:
    """Attention as two einsums and a softmax, the logits and softmax in `logits_dtype` (diffusers' Flax
    attention: bfloat16)."""
    q = q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=logits_dtype)
    weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def attention_variants() -> dict:
    variants = {"xla": attn.xla_attention, "auto (as shipped)": attn.tpu_attention,
                "einsum, float32 logits": einsum_attention,
                "einsum, bfloat16 logits and softmax": partial(einsum_attention, logits_dtype=jnp.bfloat16),
                "splash, length padded to 128": partial(attn.splash_attention, pad_to=128)}
    for block_q, block_kv in ((512, 512), (512, 2048), (1024, 1024), (1024, 2048), (2048, 512), (2048, 1024)):
        variants[f"splash q{block_q} kv{block_kv}"] = partial(attn.splash_attention, block_q=block_q,
                                                              block_kv=block_kv)
    return {**variants, **attention_kernels.variants()}  # (the kernels under trial)


def attention_table(args: argparse.Namespace) -> dict:
    rows = []
    for name, batch, lq, lk, heads, dim in ATTENTION_SHAPES:
        keys = jax.random.split(jax.random.key(0), 3)
        q = jax.random.normal(keys[0], (batch, lq, heads, dim), jnp.bfloat16)
        k = jax.random.normal(keys[1], (batch, lk, heads, dim), jnp.bfloat16)
        v = jax.random.normal(keys[2], (batch, lk, heads, dim), jnp.bfloat16)
        exact = np.asarray(attn.xla_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32)))
        flop = 4 * batch * lq * lk * heads * dim
        for variant, fn in attention_variants().items():
            if args.variants and not any(v in variant for v in args.variants.split(",")):
                continue
            if args.only and args.only not in name:
                continue
            if lq != lk and variant.startswith(("splash", "one pass", "pallas flash")):
                continue
            try:
                seconds = per_call(fn, q, k, v)
                error = float(np.max(np.abs(np.asarray(jax.jit(fn)(q, k, v)).astype(np.float32) - exact)))
                rows.append({"shape": name, "variant": variant, "ms": seconds * 1e3,
                             "tflops": flop / seconds / 1e12, "max_error": error})
            except Exception as e:  # a block size the length does not take, a kernel refusing a shape
                rows.append({"shape": name, "variant": variant, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            print(json.dumps(rows[-1]), file=sys.stderr)
    return {"what": "attention", "device_kind": jax.devices()[0].device_kind, "rows": rows}


# --- one block at each level ------------------------------------------------------------------

# (name, what, batch, side, channels, heads, depth): SDXL's UNet at 1024x1024, one image guided.
BLOCKS = [
    ("transformer 64x64 (640 ch, 10 heads, depth 2; 2+3 in the UNet)", "transformer", 2, 64, 640, 10, 2),
    ("transformer 32x32 (1280 ch, 20 heads, depth 10; 2+1+3 in the UNet)", "transformer", 2, 32, 1280, 20, 10),
    ("resnet 128x128 (320 ch)", "resnet", 2, 128, 320, 0, 0),
    ("resnet 64x64 (640 ch)", "resnet", 2, 64, 640, 0, 0),
    ("resnet 32x32 (1280 ch)", "resnet", 2, 32, 1280, 0, 0),
]


def block_table(args: argparse.Namespace) -> dict:
    from sdxl_tpu.bench.random_weights import random_fill
    from sdxl_tpu.models.layers import Precision, ResnetBlock2D
    from sdxl_tpu.models.unet_blocks import TextContext, Transformer2DModel

    precision = Precision.of("bfloat16", attention=args.attention)
    rows = []
    for name, what, batch, side, ch, heads, depth in BLOCKS:
        if args.only and args.only not in name:
            continue
        x = jax.random.normal(jax.random.key(1), (batch, side, side, ch), jnp.bfloat16)
        if what == "transformer":
            build = lambda: Transformer2DModel(ch, heads, depth, 2048, 32, precision,  # noqa: B023
                                               use_linear_projection=True, upcast_attention=False)
            extra = (jax.random.normal(jax.random.key(2), (batch, 231, 2048), jnp.bfloat16),
                     jnp.full((batch,), 77, jnp.int32))
            call = lambda m, x, states, lengths: m(x, TextContext(states, lengths))
        else:
            build = lambda: ResnetBlock2D(ch, ch, 1280, 32, 1e-5, precision)  # noqa: B023
            extra = (jax.random.normal(jax.random.key(2), (batch, 1280), jnp.bfloat16),)
            call = lambda m, x, temb: m(x, temb)
        graph, params = nnx.split(random_fill(nnx.eval_shape(build), seed=3))
        fn = lambda x, params, *extra: call(nnx.merge(graph, params), x, *extra)  # noqa: B023
        seconds = per_call(fn, x, params, *extra, calls=10)
        rows.append({"block": name, "ms": seconds * 1e3, "splash_blocks": args.splash_blocks, "geglu": args.geglu,
                     "gelu": args.gelu})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return {"what": "block", "device_kind": jax.devices()[0].device_kind, "attention": args.attention, "rows": rows}


def geglu_variant(name: str):
    """FeedForwardGEGLU.__call__ computed another way (tuning): "one-matmul" projects hidden and gate as
    one matmul split afterwards (the generator until 2026-12-06), "barrier" materializes hidden *
    gelu(gate) before the down projection (XLA otherwise may fuse it into that matmul as a prologue),
    "one-matmul-barrier" both."""
    from sdxl_tpu.models import unet_blocks

    shipped = unet_blocks.FeedForwardGEGLU.__call__  # (the generator's own, before main() puts the variant there)

    def one_matmul(self, x: jax.Array) -> jax.Array:
        hidden, gate = jnp.split(self.proj(x), 2, axis=-1)
        return hidden * unet_blocks.gelu(gate)  # (the generator's, or --gelu's)

    def call(self, x: jax.Array) -> jax.Array:
        out = (one_matmul if name.startswith("one-matmul") else shipped)(self, x)
        return jax.lax.optimization_barrier(out) if name.endswith("barrier") else out
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("unet", "attention", "block"))
    parser.add_argument("--only", help="block, attention: only the blocks / shapes whose name holds this")
    parser.add_argument("--variants", help="attention: only the variants whose name holds one of these (a,b,...)")
    parser.add_argument("--splash-blocks", help="the splash kernel's block_q,block_kv for every length (tuning)")
    parser.add_argument("--splash-min-length", type=int,
                        help=f"self-attention this long or longer runs splash (default {attn.SPLASH_MIN_LENGTH})")
    parser.add_argument("--architecture", default="sdxl", help="sdxl (default), small or tiny: a quick check anywhere")
    parser.add_argument("--size", default="1024x1024")
    parser.add_argument("--images", type=int, default=1)
    parser.add_argument("--attention", default=attn.default_kernel(), choices=attn.KERNELS)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--profile", help="trace 3 evaluations into this folder and report device time by op kind")
    parser.add_argument("--save", help="keep the UNet's output here (.npy)")
    parser.add_argument("--hlo", help="with --profile: write the optimized HLO here (.txt.gz)")
    parser.add_argument("--against", help="an earlier --save: report the output's PSNR against it")
    parser.add_argument("--geglu", default="shipped",
                        choices=("shipped", "one-matmul", "barrier", "one-matmul-barrier"),
                        help="the feed-forward's GEGLU computed another way (geglu_variant)")
    parser.add_argument("--gelu", default="shipped", choices=("shipped", "xla"),
                        help="the GEGLU's GELU: the generator's own (layers.gelu) or jax.nn.gelu's exact erf")
    parser.add_argument("--launch", type=int, default=0, metavar="N",
                        help="unet: N evaluations chained one program each against N in one program, and "
                             "chained with the weights packed in one buffer per dtype (launch_cost)")
    parser.add_argument("--launch-parts", default=",".join(LAUNCH_PARTS),
                        help="which of launch_cost's measures, comma-separated: " + ", ".join(LAUNCH_PARTS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.gelu == "xla":
        from sdxl_tpu.models import unet_blocks
        unet_blocks.gelu = lambda x: jax.nn.gelu(x, approximate=False)
    if args.geglu != "shipped":
        from sdxl_tpu.models.unet_blocks import FeedForwardGEGLU
        FeedForwardGEGLU.__call__ = geglu_variant(args.geglu)
    if args.splash_min_length:
        attn.SPLASH_MIN_LENGTH = args.splash_min_length
    if args.splash_blocks:
        attn.SPLASH_BLOCKS = lambda length: tuple(int(b) for b in args.splash_blocks.split(","))
    report = {"unet": unet_eval, "attention": attention_table, "block": block_table}[args.what](args)
    print(json.dumps(report) if args.json else json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
