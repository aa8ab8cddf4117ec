"""Prometheus metrics shared by the services: names, buckets, registries, exposition.

Every name is under the ``nightjar:`` prefix, after vLLM's ``vllm:`` ones
(``nightjar:time_to_first_token_seconds`` …), labelled by ``model`` and ``worker`` where
they apply. Beside them, vLLM's own families under their own names and labels
(``vllm:…`` with ``model_name`` and ``engine``; the API server's ``http_requests_total``), so
vLLM's Grafana dashboards work unchanged: a ``MetricSet`` whose ``prefix`` is ``vllm:`` (or
empty) names them (worker/vllm_metrics.py, gateway/metrics.py). Each service instance keeps
its metrics in its own ``CollectorRegistry``
(``MetricSet``), so tests may build many services in one process; the *process view*
(``render_process`` / ``serve``) merges every live registry of the process, which is how
``nightjar up`` shows the gateway's, the worker's and the planner's metrics on the
gateway's ``/metrics``. A standalone worker or planner serves the same view on
``--metrics-port``.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

PREFIX = "nightjar:"
VLLM_PREFIX = "vllm:"
CONTENT_TYPE = CONTENT_TYPE_LATEST

disable_created_metrics()  # no *_created series: they double every counter and histogram

# Buckets after vLLM's, extended downwards: a small model on a CPU answers in milliseconds.
TTFT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
    20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
STEP_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
MOVE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_LIVE: list[weakref.ref[CollectorRegistry]] = []
_LIVE_LOCK = threading.Lock()


def metric_name(name: str, prefix: str = PREFIX) -> str:
    return name if name.startswith(prefix) else prefix + name


# vLLM's request-length buckets: 1, 2, 5, 10, 20, 50, … up to the longest context.
def buckets_1_2_5(limit: int) -> tuple[float, ...]:
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return tuple(float(x) for x in out)
            out.append(m * scale)
        scale *= 10


class MetricSet:
    """One service instance's metrics in a registry of its own, part of the process view;
    every name it makes is under ``prefix``."""

    prefix = PREFIX

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.http_server: WSGIServer | None = None  # serving /metrics, once serve_http started it
        with _LIVE_LOCK:
            _LIVE[:] = [r for r in _LIVE if r() is not None]
            _LIVE.append(weakref.ref(self.registry))

    def counter(self, name: str, doc: str, labels: Iterable[str] = ()) -> Counter:
        return Counter(metric_name(name, self.prefix), doc, list(labels), registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Iterable[str] = ()) -> Gauge:
        return Gauge(metric_name(name, self.prefix), doc, list(labels), registry=self.registry)

    def histogram(
        self, name: str, doc: str, labels: Iterable[str] = (), buckets: tuple[float, ...] = E2E_BUCKETS
    ) -> Histogram:
        return Histogram(
            metric_name(name, self.prefix), doc, list(labels), registry=self.registry, buckets=buckets
        )

    def serve_http(
        self, port: int | None, host: str = "127.0.0.1", health: Health | None = None
    ) -> WSGIServer | None:
        """``serve`` the process view (and ``health`` under /health) when a port is given
        (None: no HTTP server)."""
        if port is None:
            return None
        server, _ = serve(port, host, health)
        self.http_server = server
        log.info("metrics at http://%s:%d/metrics", host, server.server_port)
        return server

    def render(self) -> bytes:
        """This instance's metrics alone, in the text format."""
        return generate_latest(self.registry)


def live_registries() -> list[CollectorRegistry]:
    with _LIVE_LOCK:
        alive = [r() for r in _LIVE]
    return [r for r in alive if r is not None]


class ProcessCollector(Collector):
    """Every live registry of the process as one: families of one name merged (a sample
    of the same name and labels from a newer registry replaces an older one)."""

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        samples: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], object]] = {}
        for registry in live_registries():
            for fam in registry.collect():
                if fam.name not in families:
                    families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                    samples[fam.name] = {}
                for s in fam.samples:
                    samples[fam.name][(s.name, tuple(sorted(s.labels.items())))] = s
        for name, fam in families.items():
            fam.samples = list(samples[name].values())  # type: ignore[arg-type]
            yield fam


PROCESS_REGISTRY = CollectorRegistry(auto_describe=False)
PROCESS_REGISTRY.register(ProcessCollector())


def render_process() -> bytes:
    """The process view (every service of this process) in Prometheus' text format."""
    return generate_latest(PROCESS_REGISTRY)


# A service's health: request path (/health, /health/live, /health/ready) -> (HTTP status,
# JSON body). Called from the HTTP server's thread: it must only read the service's state.
Health = Callable[[str], tuple[int, dict[str, Any]]]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape or a probe every few seconds is not worth a log line


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def _app(health: Health | None) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(PROCESS_REGISTRY)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO", ""))
        if not path.startswith("/health"):
            return metrics(environ, start_response)
        if health is None or path not in ("/health", "/health/live", "/health/ready"):
            status, body = 404, {"error": "not found"}
        else:
            try:
                status, body = health(path)
            except Exception as exc:  # a probe must get an answer, never a dropped connection
                status, body = 503, {"status": "error", "error": repr(exc)}
        raw = json.dumps(body).encode()
        reason = {200: "OK", 404: "Not Found"}.get(status, "Service Unavailable")
        start_response(
            f"{status} {reason}", [("Content-Type", "application/json"), ("Content-Length", str(len(raw)))]
        )
        return [raw]

    return app


def serve(
    port: int, host: str = "127.0.0.1", health: Health | None = None
) -> tuple[WSGIServer, threading.Thread]:
    """Serve the process view on ``http://host:port/metrics`` (and, with ``health``, the
    service's /health, /health/live and /health/ready: Kubernetes' probes) from a daemon
    thread (port 0: any free port, see ``server.server_port``); ``server.shutdown()`` stops it."""

    class Server(_ThreadingServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    httpd = make_server(host, port, _app(health), Server, handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True, name="metrics-http")
    thread.start()
    return httpd, thread


def bucket_label(upper: int) -> str:
    """A γ table bucket's upper batch size as a label (``+Inf`` for the open last one)."""
    from shared.control import ALL_BATCHES

    return "+Inf" if upper >= ALL_BATCHES else str(upper)
