"""The playground's memory as clients name new sessions: `python app.py` on 127.0.0.1, then light
calls (the token count) each from a new `session_hash`, as a client that never reuses one sends
them; the app's resident memory after each block of calls. Gradio keeps a session's state until
the page's bound (playground.SESSIONS_KEPT) pushes it out: the memory should stop growing there.

    python benchmarks/sessions.py --model tiny --sessions 4000 --every 1000
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "helpers")]

from served_app import free_port, get, start_server  # noqa: E402


def token_count_call(port: int, fn_index: int, session: str) -> None:
    """One token count through Gradio's queue, in `session`: join, then its stream to the completion."""
    body = json.dumps({"data": ["a cat", "(No style)"], "fn_index": fn_index, "session_hash": session}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/gradio_api/queue/join", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"queue/join answered {response.status}")
        conn.request("GET", f"/gradio_api/queue/data?session_hash={session}")
        for line in conn.getresponse():
            if b'"process_completed"' in line:
                return
        raise SystemExit("the event stream ended without a completion")
    finally:
        conn.close()


def resident_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--sizes", default="64x64")
    parser.add_argument("--sessions", type=int, default=4000)
    parser.add_argument("--every", type=int, default=1000, help="report after each this many sessions")
    parser.add_argument("--compile-cache", default=None, help="JAX's cache (default: a new one in --work)")
    parser.add_argument("--work", default=None, help="a folder for the app's files (default: a temporary one)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="sdxl-sessions-"))
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = dict(os.environ, GRADIO_TEMP_DIR=str(work / "gradio"), SDXL_TPU_TINY_DIR=str(work / "tiny"))
    argv = [sys.executable, "app.py", "--model", args.model, "--sizes", args.sizes, "--host", "127.0.0.1",
            "--port", str(port), "--compile-cache", args.compile_cache or str(work / "jax-cache")]
    for proc, url, _ in start_server(argv, env, work / "app.log", port):
        config = json.loads(get(url + "/config")[1])
        fn_index = next(i for i, d in enumerate(config["dependencies"]) if d.get("api_name") == "token_count")
        rows = [{"sessions": 0, "resident_mib": round(resident_mib(proc.pid))}]
        print(json.dumps(rows[-1]), flush=True)
        start = time.perf_counter()
        for n in range(1, args.sessions + 1):
            token_count_call(port, fn_index, uuid.uuid4().hex)
            if n % args.every == 0 or n == args.sessions:
                rows.append({"sessions": n, "resident_mib": round(resident_mib(proc.pid)),
                             "seconds": round(time.perf_counter() - start, 1)})
                print(json.dumps(rows[-1]), flush=True)
                start = time.perf_counter()


if __name__ == "__main__":
    main()
