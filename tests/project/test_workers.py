"""The suite's two workers take whole files (conftest's groups): a file's module fixtures and the
session's app start once, not once on each worker; and they take them in conftest's order."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_files_tests_run_on_one_worker():
    """conftest's scheduler gives a file to one worker (until 2026-12-06 xdist's groups did not take,
    and every test went to whichever worker was free)."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2",
            "tests/project/test_layout.py", "-k", "folders or cycles or short or module_map"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, JAX_PLATFORMS="cpu")).stdout
    ran = re.findall(r"^\[(gw\d)\] .*PASSED tests/project/test_layout.py::(\w+)", out, re.M)
    assert len(ran) >= 4, out[-2000:]
    assert len({worker for worker, _ in ran}) == 1, ran


def test_files_run_in_the_order_conftest_gives():
    """A file of one test given first runs first (xdist's default order, the files with the most
    tests first, sent the full-size checks to the suite's end until 2026-12-06: pyproject.toml)."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "1",
            "tests/request/test_fields.py", "tests/project/test_layout.py",
            "-k", "command_line_has_an_option or folders or cycles"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, JAX_PLATFORMS="cpu")).stdout
    ran = re.findall(r"^\[gw0\] .*PASSED (tests/\S+)::", out, re.M)
    assert len(ran) == 4, out[-2000:]
    assert ran[0] == "tests/request/test_fields.py", ran
