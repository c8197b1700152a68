"""The playground as people launch it (`python app.py --model tiny`), on 127.0.0.1, for the tests
that drive it over HTTP (test_app.py, test_security.py share one server: it takes a minute)."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUEUE_SIZE = 2
SIZES = "64x64,96x64"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def start_app(workdir: Path, compile_cache: Path, extra_args: tuple[str, ...] = ()):
    """Starts app.py and waits (bounded, 10 minutes) until /readyz answers 200. Yields a dict:
    url, readiness (the /readyz codes seen), log, proc, cache_dir (Gradio's), secret (a marker
    that is in the process environment and in a file outside the cache, `secret_file`)."""
    import pytest

    port = free_port()
    log = workdir / "app.log"
    secret = "sdxl-secret-" + secrets.token_hex(8)
    secret_file = workdir / "outside-the-cache" / "secret.txt"
    secret_file.parent.mkdir(parents=True)
    secret_file.write_text(secret)
    cache_dir = workdir / "gradio"
    env = dict(os.environ, JAX_PLATFORMS="cpu", SDXL_TPU_TINY_DIR=str(workdir / "tiny"), SDXL_TPU_TEST_SECRET=secret,
               SDXL_QUEUE_SIZE=str(QUEUE_SIZE), GRADIO_TEMP_DIR=str(cache_dir))
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "app.py", "--model", "tiny", "--sizes", SIZES, "--dtype",
                                 "float32", "--host", "127.0.0.1", "--port", str(port), "--compile-cache",
                                 str(compile_cache), *extra_args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    readiness = []
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # bounded: ten minutes at most
            assert proc.poll() is None, log.read_text()[-3000:]
            if get(base + "/healthz")[0] == 200:
                code = get(base + "/readyz")[0]
                readiness.append(code)
                if code == 200:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("the app did not become ready in 10 minutes:\n" + log.read_text()[-3000:])
        yield {"url": base, "port": port, "readiness": readiness, "log": log, "proc": proc, "cache_dir": cache_dir,
               "secret": secret, "secret_file": secret_file}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
