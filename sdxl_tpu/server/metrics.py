"""What a server counts, in Prometheus' text format (`GET /metrics`).

One registry per server (not prometheus_client's global one), so two servers in one process
(tests) count apart. Names follow Prometheus' conventions: counters end in `_total`, times are
seconds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily

from ..request.errors import Cancelled, RequestError
from .batcher import QueueFull, ShuttingDown
from .remote import Unavailable
from .settings import metrics_address

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# ok: images returned; user_error: refused input (the message says why); queue_full: turned away
# at the door; draining: turned away while shutting down; cancelled: the caller left (or the drain
# deadline passed) before the images were ready; failed: a server-side error.
OUTCOMES = ("ok", "user_error", "queue_full", "draining", "cancelled", "failed")
# Where requests come in: the page, Gradio's /generate (its API clients and MCP tool calls), the
# back end's own route, and the APIs of A1111 and OpenAI.
ROUTES = ("page", "/generate", "/v1/generate", "/sdapi/v1/txt2img", "/sdapi/v1/img2img", "/v1/images/generations",
          "/v1/images/edits")
STAGES = ("text_encoding", "denoising", "decoding", "saving")
# From 50 ms (a tiny model on a TPU) to 10 minutes (SDXL at 50 steps on a CPU).
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class _Programs:
    """XLA compilations and programs loaded from the store since the process started (warm-up
    included; flat once it is warm: a request that compiled would show here); 0 where nothing
    compiles (a front end, no JAX)."""

    def __init__(self, compiles: Callable[[], int], loaded: Callable[[], int]) -> None:
        self.compiles, self.loaded = compiles, loaded

    def collect(self):
        for name, text, count in (
                ("sdxl_compiles", "XLA compilations since start (warm-up included; not JAX's cache's programs)",
                 self.compiles),
                ("sdxl_programs_loaded", "Compiled programs loaded from the store since start", self.loaded)):
            family = CounterMetricFamily(name, text)
            family.add_metric([], count())
            yield family


class Metrics:
    """`queue_depth()`: requests waiting now; `compiles()`: XLA compilations so far;
    `programs_loaded()`: compiled programs loaded from the store so far."""

    def __init__(self, queue_depth: Callable[[], float] = lambda: 0, compiles: Callable[[], int] = lambda: 0,
                 programs_loaded: Callable[[], int] = lambda: 0) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("sdxl_requests", "Generation requests by route and outcome", ["route", "outcome"],
                                registry=r)
        for route in ROUTES:  # every route's every outcome is exported from the start, at 0
            for outcome in OUTCOMES:
                self.requests.labels(route, outcome)
        self.images = Counter("sdxl_images", "Images generated and returned", registry=r)
        self.calls = Counter("sdxl_pipeline_calls", "Pipeline calls (one call may serve several requests)",
                             registry=r)
        self.queue_depth = Gauge("sdxl_queue_depth", "Requests waiting for the accelerator", registry=r)
        self.queue_depth.set_function(queue_depth)
        self.ready = Gauge("sdxl_ready", "1 while the server takes requests (warm, not draining)", registry=r)
        self.stage_seconds = Histogram("sdxl_stage_seconds", "Seconds per pipeline stage of a call", ["stage"],
                                       buckets=BUCKETS, registry=r)
        for stage in STAGES:
            self.stage_seconds.labels(stage)
        self.request_seconds = Histogram("sdxl_request_seconds", "Seconds from joining the queue to images saved",
                                         buckets=BUCKETS, registry=r)
        r.register(_Programs(compiles, programs_loaded))

    @contextlib.contextmanager
    def counted(self, queued_at: float, route: str) -> Iterator[None]:
        """Counts the request run inside by `route` (ROUTES) and outcome (and, when it succeeds,
        the seconds since `queued_at`, time.monotonic() when it arrived)."""
        outcome = "failed"
        try:
            yield
            outcome = "ok"
            self.request_seconds.observe(time.monotonic() - queued_at)
        except QueueFull:
            outcome = "queue_full"
            raise
        except ShuttingDown:
            outcome = "draining"
            raise
        except Unavailable:  # no back end could serve it: the user is told, but it is no user error
            raise
        except RequestError:
            outcome = "user_error"
            raise
        except (Cancelled, GeneratorExit):  # (GeneratorExit: a page's stream closed by the web server)
            outcome = "cancelled"
            raise
        finally:
            self.count(outcome, route)

    def count(self, outcome: str, route: str) -> None:
        self.requests.labels(route, outcome).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def count_call(self, timings: dict[str, float] | None) -> None:
        """A pipeline call (one may serve several requests) and its stages' seconds (None: it failed)."""
        self.calls.inc()
        if timings is not None:
            for stage in ("text_encoding", "denoising", "decoding"):
                self.stage_seconds.labels(stage).observe(timings[stage])

    def count_images(self, images: int, saving_seconds: float) -> None:
        """Images handed to a caller, and the seconds it took to encode (and write) them."""
        self.stage_seconds.labels("saving").observe(saving_seconds)
        self.images.inc(images)


def serve_metrics_apart(where: str, registry: CollectorRegistry) -> None:
    """--metrics HOST:PORT: /metrics on a listener of its own (e.g. reachable only in the cluster)."""
    if where not in ("public", "off"):
        host, port = metrics_address(where)
        start_http_server(port, addr=host, registry=registry)
