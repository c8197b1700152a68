"""The text `python -m sdxl_tpu bench` prints of its report (run.py makes the report; --json prints it whole)."""

from __future__ import annotations

from typing import Any

def _bytes(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


def _flop(f: float) -> str:
    return f"{f / 1e12:.3f} TFLOP" if f >= 1e11 else f"{f / 1e9:.3f} GFLOP"


def _memory_lines(memory: dict[str, Any]) -> list[str]:
    lines = [f"memory {name:<10} peak ~{_bytes(m['peak_estimate'])} per device (args {_bytes(m['arguments'])}, "
             f"temporaries {_bytes(m['temporaries'])})" for name, m in memory["compiled"].items()]
    if memory.get("device_peak_bytes_in_use"):
        lines.append(f"device peak       {_bytes(memory['device_peak_bytes_in_use'])} in use")
    return lines


def format_report(r: dict[str, Any]) -> str:
    if "latency_s" not in r:  # --compile-only
        return "\n".join([f"compile           {r['compile_s']:.1f} s", *_memory_lines(r["memory_bytes"])])
    lat = r["latency_s"]
    f = r["flops"]
    lines = [
        f"{r['preset'] or r['architecture']} ({r['model'] or 'random weights'}), "
        f"{r['dtype']} params, {r['compute_dtype']} activations, {r['images']} x {r['size']}, {r['steps']} steps, "
        f"{r['devices']} x {r['device_kind']}",
        f"cold compile      {r['cold_compile_s']:.1f} s",
    ]
    if "warm_compile_s" in r:
        lines.append(f"warm compile      {r['warm_compile_s']:.1f} s (second process: stored programs)")
    lines += [
        f"latency per call  median {lat['median']:.3f} s, min {lat['min']:.3f} s, max {lat['max']:.3f} s "
        f"({lat['runs']} runs)",
        f"stages            text {r['stage_s']['text_encoding']:.3f} s, denoise {r['stage_s']['denoising']:.3f} s, "
        f"decode {r['stage_s']['decoding']:.3f} s",
        f"per step          {r['s_per_step'] * 1000:.1f} ms",
        f"throughput        {r['images_per_s']:.2f} images/s",
        f"FLOPs             UNet {_flop(f['unet_per_image_eval_tflop'] * 1e12)} per image-evaluation, VAE decode "
        f"{_flop(f['vae_decode_per_image_tflop'] * 1e12)} per image, {_flop(f['per_call_tflop'] * 1e12)} per call"
        + (f"; {r['controlnets']} ControlNets {_flop(f['controlnets_per_image_eval_tflop'] * 1e12)} per "
           "image-evaluation" if r.get("controlnets") else ""),
        f"achieved          {f['achieved_tflops'] * 1000:.1f} GFLOP/s" if f["achieved_tflops"] < 1 else
        f"achieved          {f['achieved_tflops']:.2f} TFLOP/s"
        + (f", {100 * f['utilisation']:.1f} % of {f['peak_tflops_per_device']:.0f} TFLOP/s x {r['devices']}"
           if f["utilisation"] else " (no peak known for this device)"),
    ]
    for name, figures in r.get("features", {}).items():
        lines.append(f"{name:<17} {figures['latency_s']:.3f} s a call ({100 * figures['latency_over_plain']:+.1f} %), "
                     f"{figures['ms_per_step']:.1f} ms a step ({100 * figures['step_over_plain']:+.1f} %)"
                     + (f"; the refiner's steps {figures['refiner_ms_per_step']:.1f} ms" if name == "refiner" else ""))
    lines += _memory_lines(r["memory_bytes"])
    if "progress_overhead" in r:
        lines.append(f"per-step progress {100 * r['progress_overhead']:+.1f} % latency (one program call per step) "
                     "vs the fused loop measured above")
    if "previews" in r:
        p = r["previews"]
        lines.append(f"live previews     {100 * p['overhead']:+.1f} % latency ({p['per_call']} {p['decoder']} previews "
                     f"of {p['size'][1]}x{p['size'][0]} a call, every {p['every']} steps: median "
                     f"{p['latency_on_s']:.3f} s on, {p['latency_off_s']:.3f} s off, both stepwise)" if p["size"] else
                     "live previews     none at this step count")
    return "\n".join(lines)
