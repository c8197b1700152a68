"""benchmarks/compare_reference.py in its CI-sized form: the reference (diffusers 0.39 Flax SDXL,
in its own virtual environment) and sdxl_tpu side by side on simulated devices."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


def test_compare_reference_tiny(tiny_checkpoint, tmp_path):
    """End to end on two simulated devices (two images a call, sharded; the script's default of
    four costs some 35 s more on two cores and shows nothing more), one step, on a copy of the
    session's tiny checkpoint (the script would write the same; the reference adds .bin files)."""
    runs, devices = 3, 2
    checkpoint = shutil.copytree(tiny_checkpoint, tmp_path / "tiny")
    began = time.perf_counter()
    argv = ["--architecture", "tiny", "--steps", "1", "--runs", str(runs), "--devices", str(devices), "--json",
            "--checkpoint", str(checkpoint)]
    result = subprocess.run([sys.executable, "benchmarks/compare_reference.py", *argv], cwd=ROOT, capture_output=True,
                            text=True, timeout=1500, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    wall = time.perf_counter() - began
    assert result.returncode == 0, result.stderr[-4000:]
    r = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"{wall:.1f} s: {r}")
    ours, ref = r["versions"]["ours"], r["versions"]["reference"]
    # The reference runs its own pinned diffusers and transformers, ahead of ours, on our jax and flax.
    assert ref["diffusers"] == "0.39.0" and ref["transformers"] == "4.57.6"
    assert int(ours["transformers"].split(".")[0]) >= 5
    assert (ref["jax"], ref["flax"]) == (ours["jax"], ours["flax"])
    # What the workers found: the simulated devices asked for, one image on each.
    assert r["devices"] == devices and r["images"] == devices and r["size"] == "64x64"

    lat = r["latency_s"]
    for side in ("ours", "reference"):
        assert len(lat[side]) == runs and min(lat[side]) > 0
        # The first call compiles: it takes far longer than any steady call after it.
        assert r["first_call_s"][side] > 2 * max(lat[side])
    assert r["compile_s"]["reference"] > 0  # (its first call against its second)
    # The figures are seconds of wall time, each spent once: the workers start one after the other
    # (each loads, compiles and makes its first call before the next starts), then alternate their
    # calls, so together they fit in what this test measured around the script.
    spent = sum(r["load_s"][side] + r["first_call_s"][side] + sum(lat[side]) for side in ("ours", "reference"))
    assert 0 < spent < wall, (spent, wall)


def test_report_medians_and_throughput_ratio():
    """The report's arithmetic on latencies whose answer is known: the reference twice as slow is
    a throughput ratio of 2 (ours over the reference's), the medians the middle calls."""
    import argparse

    ready = {"images": 4, "size": "64x64", "devices": 4, "device_kind": "cpu", "versions": {}, "load_s": 1.0,
             "compile_s": 2.0, "first_call_s": 3.0}
    args = argparse.Namespace(architecture="tiny", steps=1, dtype="bfloat16")
    report = _compare_reference_module().make_report(args, ready, {**ready, "load_s": 5.0},
                                                     {"ours": [0.3, 0.1, 0.2], "reference": [0.2, 0.6, 0.4]})
    assert report["median_latency_s"] == {"ours": 0.2, "reference": 0.4}
    assert report["throughput_ratio"] == pytest.approx(2.0)
    assert report["load_s"] == {"ours": 1.0, "reference": 5.0}


def test_halves_measured_apart_make_one_report():
    """--only ours, then --only reference --other: where one process at a time holds the device (a
    TPU), the two sides run apart and the second completes the report; halves of different work
    (another size, the same side twice) are refused, not compared."""
    import argparse

    module = _compare_reference_module()
    args = argparse.Namespace(architecture="sdxl", steps=20, dtype="bfloat16")
    ready = {"images": 1, "size": "1024x1024", "devices": 1, "device_kind": "TPU v5 lite", "versions": {},
             "load_s": 1.0, "compile_s": 2.0, "first_call_s": 3.0}
    ours = json.loads(json.dumps(module.half_report(args, "ours", ready, [2.5, 2.4, 2.6])))  # as written to a file
    report = module.complete_report(args, "reference", {**ready, "load_s": 9.0}, [3.0, 3.6, 3.2], ours)
    assert report["median_latency_s"] == {"ours": 2.5, "reference": 3.2}
    assert report["throughput_ratio"] == pytest.approx(3.2 / 2.5)
    assert report["load_s"] == {"ours": 1.0, "reference": 9.0}
    with pytest.raises(SystemExit, match="size"):
        module.complete_report(args, "reference", {**ready, "size": "1152x896"}, [3.0], ours)
    with pytest.raises(SystemExit, match="same side"):
        module.complete_report(args, "ours", ready, [3.0], ours)
