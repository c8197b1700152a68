"""What a server counts, in Prometheus' text format (`GET /metrics`).

One registry per server (not prometheus_client's global one), so two servers in one process
(tests) count apart. Names follow Prometheus' conventions: counters end in `_total`, times are
seconds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from ..spec.errors import Cancelled, RequestError
from .batcher import QueueFull, ShuttingDown
from .remote import Unavailable

if TYPE_CHECKING:
    from .core import Server

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# ok: images returned; user_error: refused input (the message says why); queue_full: turned away
# at the door; draining: turned away while shutting down; cancelled: the caller left (or the drain
# deadline passed) before the images were ready; failed: a server-side error.
OUTCOMES = ("ok", "user_error", "queue_full", "draining", "cancelled", "failed")
STAGES = ("text_encoding", "denoising", "decoding", "saving")
# From 50 ms (a tiny model on a TPU) to 10 minutes (SDXL at 50 steps on a CPU).
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class _Compiles:
    """XLA compilations since the server started (warm-up included; flat once it is warm: a
    request that compiled would show here); 0 where nothing compiles (a front end, no JAX)."""

    def __init__(self) -> None:
        self.counter = None

    def listen(self) -> None:
        from ..generate.compilation import CompileCounter

        if self.counter is None:
            self.counter = CompileCounter().__enter__()  # listens for the life of the process

    def collect(self):
        family = CounterMetricFamily("sdxl_compiles", "XLA backend compilations since start (warm-up included)")
        family.add_metric([], self.counter.compiles if self.counter is not None else 0)
        yield family


class Metrics:
    def __init__(self, queue_depth: Callable[[], float] = lambda: 0) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("sdxl_requests", "Generation requests by outcome", ["outcome"], registry=r)
        for outcome in OUTCOMES:  # every outcome is exported from the start, at 0
            self.requests.labels(outcome)
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
        self.compiles = _Compiles()
        r.register(self.compiles)

    @contextlib.contextmanager
    def counted(self, queued_at: float) -> Iterator[None]:
        """Counts the request run inside by outcome (and, when it succeeds, the seconds since
        `queued_at`, time.monotonic() when it arrived)."""
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
            self.count(outcome)

    def count(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def serve_metrics_apart(server: Server) -> None:
    """--metrics HOST:PORT: /metrics on a listener of its own (e.g. reachable only in the cluster)."""
    if server.settings.metrics not in ("public", "off"):
        from prometheus_client import start_http_server

        from .settings import metrics_address

        host, port = metrics_address(server.settings.metrics)
        start_http_server(port, addr=host, registry=server.metrics.registry)
