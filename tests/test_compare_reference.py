"""benchmarks/compare_reference.py in its CI-sized form: the reference (diffusers 0.39 Flax SDXL,
in its own virtual environment) and sdxl_tpu side by side on four simulated devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_compare_reference_tiny():
    result = subprocess.run([sys.executable, "benchmarks/compare_reference.py", "--preset", "tiny", "--steps", "1",
                             "--runs", "1", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=1500,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr[-4000:]
    r = json.loads(result.stdout.strip().splitlines()[-1])
    print(r)
    assert r["versions"]["reference"]["diffusers"] == "0.39.0"
    assert r["devices"] == 4 and r["images"] == 4 and r["size"] == "64x64"
    assert r["compile_s"]["ours"] > 0 and r["compile_s"]["reference"] > 0
    assert len(r["latency_s"]["ours"]) == len(r["latency_s"]["reference"]) == 1
    assert r["throughput_ratio"] > 0
