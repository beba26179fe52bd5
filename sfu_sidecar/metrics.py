"""Prometheus metrics: one registry per application, so several apps can live in one process."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

NAMESPACE = "sfu_sidecar"


class Metrics:
    """The application's registry plus the metrics the HTTP layer owns.

    Components add their own metrics against :attr:`registry` at construction.
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.http_requests = Counter(
            "http_requests", "HTTP requests by route and status",
            ["route", "status"], namespace=NAMESPACE, registry=self.registry,
        )
        self.http_duration = Histogram(
            "http_request_duration_seconds", "HTTP request handling time",
            ["route"], namespace=NAMESPACE, registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.requests_limited = Counter(
            "requests_limited", "Requests refused by a configured limit, by the limit's setting",
            ["limit"], namespace=NAMESPACE, registry=self.registry,
        )
        self.messages_dropped = Counter(
            "messages_dropped",
            "WebSocket and DataChannel messages dropped over their peer's rate, by channel",
            ["channel"], namespace=NAMESPACE, registry=self.registry,
        )
        self.uptime = Gauge(
            "uptime_seconds", "Seconds since the service started",
            namespace=NAMESPACE, registry=self.registry,
        )
        # Sessions, sockets and components each run tasks; a count that only grows is a leak
        # that neither fds nor memory show early.
        self.asyncio_tasks = Gauge(
            "asyncio_tasks", "asyncio tasks not yet done in the service's event loop",
            namespace=NAMESPACE, registry=self.registry,
        )

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, list(labels), namespace=NAMESPACE, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, list(labels), namespace=NAMESPACE, registry=self.registry)

    def histogram(
        self, name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()
    ) -> Histogram:
        return Histogram(name, doc, list(labels), namespace=NAMESPACE, registry=self.registry,
                         buckets=buckets)

    def render(self) -> bytes:
        return generate_latest(self.registry)
