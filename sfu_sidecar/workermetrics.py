"""``/metrics`` of ``serve --workers``: every worker's metrics, labelled ``worker``, with the
supervisor's own.

One scrape of the public port sees the whole machine. Each worker's exposition is read over
loopback, every sample gains the label ``worker="<i>"`` (the same metric of two workers stays
two series), and families of one name are merged. The supervisor adds what only it knows: its
workers (configured, alive, restarts) and, when it serves HTTPS, the certificate's metrics,
which no worker has (the workers speak plain HTTP on loopback). ``/workers/<i>/metrics`` still
reaches one worker as it answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from sfu_sidecar.metrics import NAMESPACE

LABEL = "worker"


class SupervisorMetrics:
    """The supervisor's registry: its workers, and the TLS metrics ``listeners.start`` adds."""

    def __init__(self, count: int) -> None:
        self.registry = CollectorRegistry()
        Gauge("workers", "Worker processes configured (serve --workers)", namespace=NAMESPACE,
              registry=self.registry).set(count)
        self.alive = Gauge("workers_alive", "Worker processes answering their health check",
                           namespace=NAMESPACE, registry=self.registry)
        self.restarts = Gauge("worker_restarts",
                              "Times each worker was started again after it exited",
                              [LABEL], namespace=NAMESPACE, registry=self.registry)

    def observe(self, alive: Sequence[bool], restarts: Sequence[int]) -> None:
        self.alive.set(sum(alive))
        for index, count in enumerate(restarts):
            self.restarts.labels(str(index)).set(count)


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge(expositions: Sequence[tuple[int, str]],
          own: CollectorRegistry) -> tuple[bytes, list[int]]:
    """One text exposition (format 0.0.4) of ``own`` and every ``(worker index, exposition)``,
    each worker's samples labelled with its index; and the workers whose text did not parse,
    which are left out whole rather than in part."""
    merged: dict[str, Metric] = {}
    for family in text_string_to_metric_families(generate_latest(own).decode()):
        merged[family.name] = family
    unreadable = []
    for index, text in expositions:
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError:
            unreadable.append(index)
            continue
        for family in families:
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation,
                                                    family.type, family.unit)
            into.samples.extend(s._replace(labels={**s.labels, LABEL: str(index)})
                                for s in family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(merged.values()))
    return generate_latest(registry), unreadable
