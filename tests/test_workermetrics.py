"""The supervisor's ``/metrics``: every worker's exposition labelled ``worker`` and merged with
the supervisor's own, checked by promtool (Prometheus's own linter) and read back."""

from __future__ import annotations

import subprocess

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sfu_sidecar.workermetrics import SupervisorMetrics, merge


def worker_exposition(requests: float, latency_s: float) -> str:
    registry = CollectorRegistry()
    Counter("sfu_sidecar_http_requests", "HTTP requests", ["route"],
            registry=registry).labels("/whep").inc(requests)
    Histogram("sfu_sidecar_lag_seconds", "lag", registry=registry,
              buckets=(0.1, 1.0)).observe(latency_s)
    return generate_latest(registry).decode()


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text.decode()) for s in f.samples}


def test_each_workers_series_keeps_its_own_value_under_its_label() -> None:
    own = SupervisorMetrics(3)
    own.observe([True, True, False], [0, 2, 5])
    body, unreadable = merge([(0, worker_exposition(4, 0.05)),
                              (1, worker_exposition(7, 0.5))], own.registry)
    got = samples(body)
    assert unreadable == []
    assert got[("sfu_sidecar_http_requests_total", (("route", "/whep"), ("worker", "0")))] == 4
    assert got[("sfu_sidecar_http_requests_total", (("route", "/whep"), ("worker", "1")))] == 7
    assert got[("sfu_sidecar_lag_seconds_bucket", (("le", "0.1"), ("worker", "0")))] == 1
    assert got[("sfu_sidecar_lag_seconds_bucket", (("le", "0.1"), ("worker", "1")))] == 0
    # The supervisor's own series carry no worker label unless they are about one worker.
    assert got[("sfu_sidecar_workers", ())] == 3
    assert got[("sfu_sidecar_workers_alive", ())] == 2
    assert got[("sfu_sidecar_worker_restarts", (("worker", "2"),))] == 5
    # One HELP and TYPE per family, however many workers report it.
    assert body.decode().count("# TYPE sfu_sidecar_http_requests_total counter") == 1


def test_a_worker_whose_text_does_not_parse_is_left_out_whole() -> None:
    own = SupervisorMetrics(2)
    body, unreadable = merge([(0, worker_exposition(4, 0.05)),
                              (1, "sfu_sidecar_http_requests_total{route=\"/whep\" 9\n")],
                             own.registry)
    assert unreadable == [1]
    assert not [k for k in samples(body) if ("worker", "1") in k[1]]
    assert samples(body)[("sfu_sidecar_http_requests_total",
                          (("route", "/whep"), ("worker", "0")))] == 4


@pytest.mark.needs("promtool")
def test_promtool_accepts_the_merged_exposition() -> None:
    own = SupervisorMetrics(2)
    body, _ = merge([(0, worker_exposition(1, 0.05)), (1, worker_exposition(2, 2.0))],
                    own.registry)
    proc = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True,
                          timeout=30)
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc
