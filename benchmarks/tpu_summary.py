"""One line per result of benchmarks/tpu.sh: `python benchmarks/tpu_summary.py OUT`."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: Path) -> dict | None:
    text = path.read_text().strip() if path.exists() else ""
    try:
        return json.loads(text.splitlines()[-1]) if text else None
    except json.JSONDecodeError:
        return None


def unet_line(name: str, r: dict) -> list[str]:
    lines = [f"{name}: UNet {r['rows']} rows at {r['size']}, {r['attention']} attention"
             + (f" (splash from {r['splash_min_length']} tokens)" if r.get("splash_min_length") else "")
             + (f", LIBTPU_INIT_ARGS={r['libtpu_init_args']!r}" if r.get("libtpu_init_args") else "")
             + f": {r['ms']:.1f} ms an evaluation, {r['tflops']:.0f} TFLOP/s, compile {r['compile_s']:.0f} s"
             + (f", {r['psnr_db_against_before']:.1f} dB against before" if "psnr_db_against_before" in r else "")]
    launch = r.get("launch")
    if launch:  # (the measures launch_cost took, ms an evaluation)
        named = {"chained_ms": f"one program each ({launch['weight_buffers']} weight buffers)",
                 "looped_ms": "one program", "packed_chained_ms": "one program each, the weights in one buffer",
                 "callback_ms": "one program telling the host each step", "unordered_ms": "the same, unordered"}
        lines.append(f"  {launch['calls']} evaluations, ms an evaluation: " + ", ".join(
            f"{what} {launch[key]:.1f}" for key, what in named.items() if key in launch))
    profile = r.get("profile") or {}
    if profile.get("by_kind_ms_per_eval"):
        total = profile["per_eval_ms"]
        lines.append(f"  device time {total:.1f} ms an evaluation: " + ", ".join(
            f"{kind} {ms:.1f} ({100 * ms / total:.0f} %)" for kind, ms in profile["by_kind_ms_per_eval"].items()))
    return lines


def bench_line(name: str, r: dict) -> list[str]:
    lat, f = r["latency_s"], r["flops"]
    return [f"{name}: {r['images']} x {r['size']}, {r['steps']} steps, {r['device_kind']}: latency "
            f"{lat['median']:.3f} s (min {lat['min']:.3f}), {r['s_per_step'] * 1000:.1f} ms/step, "
            f"{r['images_per_s']:.2f} img/s, {f['achieved_tflops']:.0f} TFLOP/s"
            + (f" ({100 * f['utilisation']:.0f} %)" if f.get("utilisation") else "")
            + f", stages {', '.join(f'{k} {v:.3f}' for k, v in r['stage_s'].items())}, cold compile "
            f"{r['cold_compile_s']:.0f} s, device peak "
            f"{(r['memory_bytes'].get('device_peak_bytes_in_use') or 0) / 1e9:.1f} GB"] + [
        f"{name}:   {feature:<16} {x['latency_s']:.3f} s ({100 * x['latency_over_plain']:+.1f} %), "
        f"{x['ms_per_step']:.1f} ms/step ({100 * x['step_over_plain']:+.1f} %)"
        + (f", refiner steps {x['refiner_ms_per_step']:.1f} ms" if "refiner_ms_per_step" in x else "")
        for feature, x in r.get("features", {}).items()]


def main(out: Path) -> None:
    for path in sorted(out.glob("*.json")):
        r = load(path)
        if r is None:
            print(f"{path.stem}: no result")
        elif r.get("what") == "unet":
            print("\n".join(unet_line(path.stem, r)))
        elif r.get("what") == "attention":
            for row in r["rows"]:
                print(f"{path.stem}: {row['shape']:<38} {row['variant']:<28} " + (
                    f"{row['ms']:8.3f} ms {row['tflops']:6.1f} TFLOP/s max error {row['max_error']:.3g}"
                    if "ms" in row else row["error"]))
        elif r.get("what") == "block":
            for row in r["rows"]:
                tiles = f" (splash tiles {row['splash_blocks']})" if row.get("splash_blocks") else ""
                print(f"{path.stem}: {row['block']:<70} {row['ms']:7.3f} ms{tiles}")
        elif r.get("what") == "compare_reference_half":
            ready, lat = r["ready"], sorted(r["latency_s"])
            print(f"{path.stem}: {r['side']}, {ready['images']} x {ready['size']}, {r['steps']} steps: latency "
                  f"{lat[len(lat) // 2]:.3f} s (min {lat[0]:.3f}), load {ready['load_s']:.0f} s, first call "
                  f"{ready['first_call_s']:.0f} s")
        elif "throughput_ratio" in r:  # compare_reference.py's
            med = r["median_latency_s"]
            print(f"{path.stem}: {r['images']} x {r['size']}, {r['steps']} steps, {r['device_kind']}: ours "
                  f"{med['ours']:.3f} s, reference {med['reference']:.3f} s: {r['throughput_ratio']:.2f}x "
                  f"(first call {r['first_call_s']['ours']:.0f} / {r['first_call_s']['reference']:.0f} s)")
        elif "latency_s" in r:
            print("\n".join(bench_line(path.stem, r)))
        elif "programs" in r and "size" in r:  # program_compile.py's
            for row in r["programs"]:
                print(f"{path.stem}: {row['program']:<18} attention {row['attention']:<5} lowered "
                      f"{row['lower_s']:6.1f} s, compiled {row['compile_s']:6.1f} s "
                      f"({r['size']}, {r['images']} a call)")
        elif "rows" in r and r["rows"] and "tiles_a_batch" in r["rows"][0]:  # upscaler.py's
            for row in r["rows"]:
                print(f"{path.stem}: {row['model']:<22} {row['size']}px -> {row['out'][1]}px, {row['tiles_a_batch']} "
                      f"tiles a batch: {row['s_an_image']:.3f} s an image (compile {row['compile_s']:.0f} s)")
        elif "cold" in r or "this start" in r:  # first_image.py's
            from first_image import format_report

            print("\n".join(format_report(f"{path.stem}, {start}", report) for start, report in r.items()))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/out"))
