"""SIGTERM with work in flight: not ready at once, new calls told the server is going away, the
accepted requests finish, and the process exits 0 although a page's heartbeat stream is open."""

from __future__ import annotations

import http.client
import json
import signal
import time
import urllib.error
import urllib.request
import uuid

import pytest

from served_app import free_port, get, start_app


@pytest.fixture(scope="module")
def draining_app(tmp_path_factory, compile_cache):
    metrics_port = free_port()
    for app in start_app(tmp_path_factory.mktemp("drain"), compile_cache,
                         extra_args=("--metrics", f"127.0.0.1:{metrics_port}")):
        yield {**app, "metrics_url": f"http://127.0.0.1:{metrics_port}/metrics"}


def _metric(url: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    status, text = get(url)
    assert status == 200, text
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == name and s.labels == labels)


def test_sigterm_drains_then_exits_zero(draining_app):
    from gradio_client import Client

    base, proc = draining_app["url"], draining_app["proc"]
    # --metrics HOST:PORT: a listener of its own; the public port does not serve them.
    assert get(base + "/metrics")[0] == 404
    assert _metric(draining_app["metrics_url"], "sdxl_ready") == 1
    # A page's heartbeat stream, held open for the whole test (it kept the process alive before).
    heartbeat = http.client.HTTPConnection("127.0.0.1", draining_app["port"], timeout=60)
    heartbeat.request("GET", f"/gradio_api/heartbeat/{uuid.uuid4().hex}")
    assert heartbeat.getresponse().status == 200

    args = lambda seed, steps: ("a cat", "", "(No style)", seed, False, 5.0, steps, "96x64", "Euler",
                                 "Checkpoint", "JAX")
    jobs = [Client(base + "/", verbose=False, download_files=False).submit(*args(seed, 50), api_name="/generate")
            for seed in (1, 2)]  # one running, one queued behind it
    time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    deadline = sent + 5
    while get(base + "/readyz")[0] != 503:  # bounded: 5 s
        assert time.monotonic() < deadline, "readyz did not turn 503"
        time.sleep(0.02)
    not_ready_after = time.monotonic() - sent
    status, body = get(base + "/readyz")
    assert status == 503 and json.loads(body)["status"] == "draining"
    assert _metric(draining_app["metrics_url"], "sdxl_ready") == 0

    # A new call is told, at once, that the server is going away (503 + Retry-After: a load
    # balancer tries another server).
    join = urllib.request.Request(base + "/gradio_api/queue/join", method="POST",
                                  headers={"Content-Type": "application/json"},
                                  data=json.dumps({"data": list(args(3, 1)), "fn_index": _generate_fn_index(base),
                                                   "session_hash": uuid.uuid4().hex}).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(join, timeout=10)
    assert refused.value.code == 503 and refused.value.headers["Retry-After"]
    assert "shutting down" in json.loads(refused.value.read())["detail"]
    assert _metric(draining_app["metrics_url"], "sdxl_requests_total", outcome="draining") == 1

    # Both accepted requests finish with their images.
    for job, seed in zip(jobs, (1, 2)):
        gallery, info = job.result(120)
        assert len(gallery) == 4 and f"Seeds: {seed}, {seed + 1}" in info
    finished = time.monotonic() - sent
    code = proc.wait(timeout=60)  # bounded; before, it never exited while a heartbeat was open
    exited = time.monotonic() - sent
    print(f"SIGTERM: not ready after {not_ready_after:.2f} s, accepted requests done after {finished:.2f} s, "
          f"exit {code} after {exited:.2f} s")
    assert not_ready_after < 1.0
    assert code == 0 and exited - finished < 15
    log = draining_app["log"].read_text()
    assert "drained" in log and "Traceback" not in log


def _generate_fn_index(base: str) -> int:
    status, text = get(base + "/config")
    assert status == 200
    config = json.loads(text)
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == "generate")
