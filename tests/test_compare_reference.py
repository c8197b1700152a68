"""benchmarks/compare_reference.py in its CI-sized form: the reference (diffusers 0.39 Flax SDXL,
in its own virtual environment) and sdxl_tpu side by side on four simulated devices."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _compare_reference_module():
    spec = importlib.util.spec_from_file_location("compare_reference", ROOT / "benchmarks" / "compare_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_environment_links_the_site_packages_jax_comes_from():
    """Inside a virtual environment too: there jax is in the venv's site-packages, not the base
    interpreter's, which is all a venv's system_site_packages would have given the reference."""
    import jax

    jax_site = str(Path(jax.__file__).resolve().parents[1])
    dirs = [str(Path(d).resolve()) for d in _compare_reference_module().outer_site_dirs()]
    assert jax_site in dirs
    if sys.prefix != sys.base_prefix:  # in a venv: its own site-packages are linked
        assert any(d.startswith(str(Path(sys.prefix).resolve())) for d in dirs)


def test_compare_reference_tiny():
    runs = 3
    result = subprocess.run([sys.executable, "benchmarks/compare_reference.py", "--preset", "tiny", "--steps", "1",
                             "--runs", str(runs), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=1500,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr[-4000:]
    r = json.loads(result.stdout.strip().splitlines()[-1])
    print(r)
    ours, ref = r["versions"]["ours"], r["versions"]["reference"]
    # The reference runs its own pinned diffusers and transformers, ahead of ours, on our jax and flax.
    assert ref["diffusers"] == "0.39.0" and ref["transformers"] == "4.57.6"
    assert int(ours["transformers"].split(".")[0]) >= 5
    assert (ref["jax"], ref["flax"]) == (ours["jax"], ours["flax"])
    assert r["devices"] == 4 and r["images"] == 4 and r["size"] == "64x64"

    lat, med = r["latency_s"], r["median_latency_s"]
    for side in ("ours", "reference"):
        assert len(lat[side]) == runs and min(lat[side]) > 0
        assert med[side] == pytest.approx(statistics.median(lat[side]))
        # The first call compiles, then runs: it takes at least the compile time.
        assert 0 < r["compile_s"][side] <= r["first_call_s"][side]
        assert r["load_s"][side] > 0
    assert r["throughput_ratio"] == pytest.approx(med["reference"] / med["ours"])
