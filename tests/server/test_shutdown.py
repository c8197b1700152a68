"""SIGTERM while sizes really compile: a new pod stopped during its start-up exits 0 after its drain,
for the app and the back end alike, whether the first size is still compiling (not ready yet: an
empty compilation cache) or the others compile in the background (ready: a cache that holds the
first size alone, as the session's does, so only the others compile). Before the fix, Python's
finalization unwound the compiling thread out of XLA: `terminate called after throwing an instance
of ...`, `FATAL: exception not rethrown`, exit by SIGABRT (6 of 6 tries)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from served_app import ROOT, free_port, get, wait_for

SIZES = "64x64,192x192,256x256"  # (tiny: each compiles for seconds on a CPU, cold)
COMMANDS = {"app": [sys.executable, "app.py"], "serve": [sys.executable, "-m", "sdxl_tpu", "serve"]}


def readyz(base: str) -> tuple[int, dict]:
    status, text = get(base + "/readyz")
    return status, (json.loads(text) if status in (200, 503) and text else {})


def start(command: str, cache: Path, log: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [*COMMANDS[command], "--model", "tiny", "--sizes", SIZES, "--dtype", "float32", "--host", "127.0.0.1",
            "--port", str(port), "--compile-cache", str(cache)]
    with open(log, "w") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT), f"http://127.0.0.1:{port}"


def test_sigterm_while_sizes_compile_exits_zero_after_draining(tmp_path, compile_cache):
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env.update(SDXL_TPU_TINY_DIR=str(tmp_path / "tiny"), GRADIO_TEMP_DIR=str(tmp_path / "gradio"))
    for moment in ("loading", "ready"):
        procs = {}
        try:
            for command in COMMANDS:  # (both at once: each compiles on a core of its own)
                cache = tmp_path / f"cache-{command}-{moment}"
                if moment == "ready":  # (the first size, from the session's cache, if it has it: quick to ready)
                    shutil.copytree(compile_cache, cache)
                log = tmp_path / f"{command}-{moment}.log"
                procs[command] = (*start(command, cache, log, env), log)
            for proc, base, log in procs.values():
                alive = lambda url, code, p=proc: get(url)[0] == code or p.poll() is not None
                if moment == "loading":  # listening, the first size still compiling: not ready
                    wait_for(lambda: alive(base + "/healthz", 200), 120, "no /healthz")  # noqa: B023
                    assert readyz(base)[0] == 503, log.read_text()[-2000:]
                else:  # ready with the first size; the others compile in the background
                    wait_for(lambda: alive(base + "/readyz", 200), 300, "never ready")  # noqa: B023
                    assert readyz(base)[1].get("compiling"), log.read_text()[-2000:]
                proc.send_signal(signal.SIGTERM)
            codes = {command: proc.wait(120) for command, (proc, _, _) in procs.items()}
        finally:
            for proc, _, _ in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
        for command, (_, _, log) in procs.items():
            text = log.read_text()
            assert codes[command] == 0, f"{command} at {moment}: exit {codes[command]}\n{text[-3000:]}"
            assert "draining: finishing the requests already accepted" in text and "drained" in text, text[-3000:]
            assert "stopped" in text.splitlines()[-2:] or "that work is dropped" in text, text[-3000:]
            assert "terminate called" not in text and "FATAL" not in text and "Traceback" not in text, text[-3000:]
