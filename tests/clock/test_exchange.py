"""Clock-join exchange against proto/vectors/clock_exchange.json (shared with the JS tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sfu_sidecar.clock import exchange as x

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "proto" / "vectors" / "clock_exchange.json")
    .read_text()
)


@pytest.mark.parametrize("vec", VECTORS["messages"], ids=lambda v: v["name"])
def test_messages_both_ways(vec: dict[str, Any]) -> None:
    msg = x.from_map(vec["map"])
    assert x.encode_json(msg) == vec["json"]
    assert x.encode_msgpack(msg).hex() == vec["msgpack_hex"]
    assert x.decode_json(vec["json"]) == msg
    assert x.decode_msgpack(bytes.fromhex(vec["msgpack_hex"])) == msg


@pytest.mark.parametrize("vec", VECTORS["samples"], ids=lambda v: v["name"])
def test_sample_arithmetic(vec: dict[str, Any]) -> None:
    s = x.Sample(vec["t1"], vec["t2"], vec["t3"], vec["t4"])
    assert (s.offset_ns, s.rtt_ns) == (vec["offset_ns"], vec["rtt_ns"])


@pytest.mark.parametrize("vec", VECTORS["windows"], ids=lambda v: v["name"])
def test_window_choice(vec: dict[str, Any]) -> None:
    join = x.ClockJoin(vec["window"])
    for t1, t2, t3, t4 in vec["exchanges"]:
        join.response(x.ClockResp(t1, t2, t3), t4)
    assert len(join.samples) == vec["accepted"]
    report = join.report()
    assert (report.to_map() if report else None) == vec["report"]


@pytest.mark.parametrize("vec", VECTORS["invalid"], ids=lambda v: v["name"])
def test_invalid_messages_are_typed_errors(vec: dict[str, Any]) -> None:
    with pytest.raises(x.ExchangeError):
        x.decode_json(vec["json"])


def test_garbage_msgpack_and_json_are_typed_errors() -> None:
    for data in (b"", b"\xc1", b"\x81\xa4type", msgpack.packb({1: 2})):
        with pytest.raises(x.ExchangeError):
            x.decode_msgpack(data)
    with pytest.raises(x.ExchangeError):
        x.decode_json("{")


def test_two_cores_in_memory_converge_on_a_simulated_offset() -> None:
    """Client and server cores wired together: client clock = house - 7 ms, asymmetric queues."""
    house_minus_client = 7_000_000
    join = x.ClockJoin(8)
    client_now = 1_000_000_000
    for i in range(8):
        up, down = 300_000 + 150_000 * (i % 3), 200_000 + 400_000 * (i % 2)
        req = join.request(client_now)
        t2 = client_now + up + house_minus_client
        got = x.decode_json(x.encode_json(req))
        assert isinstance(got, x.ClockReq)
        resp = x.decode_msgpack(x.encode_msgpack(x.respond(got, t2, t2 + 20_000)))
        assert isinstance(resp, x.ClockResp)
        client_now += up + 20_000 + down
        join.response(resp, client_now)
        client_now += 10_000_000
    report = join.report()
    assert report is not None
    assert abs(report.offset_ns - house_minus_client) <= report.error_ns
    assert report.rtt_ns == 500_000  # the least-RTT exchange: 300 us up, 200 us down
    assert report.offset_ns == house_minus_client + 50_000  # half the 100 us asymmetry


def test_vectors_file_is_generated_and_js_exact() -> None:
    from tests.clock.clock_vectors import PATH, build, render

    assert PATH.read_text() == render(), "regenerate: python -m tests.clock.clock_vectors"
    data = build()
    big = [v for s in data["samples"] for k, v in s.items() if k.startswith("t") and v > 2**53]
    big += [v for w in data["windows"] for row in w["exchanges"] for v in row]
    assert big and all(v % 512 == 0 for v in big)
