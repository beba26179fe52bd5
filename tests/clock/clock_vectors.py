"""Generates proto/vectors/clock_exchange.json: ``python -m tests.clock.clock_vectors``.

Every epoch-ns value is a multiple of 512 so a JavaScript number (53-bit mantissa, spacing 256
near 1.8e18) holds it exactly and the JS tests can read the same JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sfu_sidecar.clock import exchange as x

PATH = Path(__file__).resolve().parents[2] / "proto" / "vectors" / "clock_exchange.json"
T = 1_764_489_600_000_000_000  # 2025-11-30T08:00:00Z
AHEAD = 250_000_384  # house ahead of the client by ~250 ms (a multiple of 512)


def build() -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": "Clock join (proto/clock.md): messages as JSON text and msgpack, sample "
        "arithmetic, the least-RTT window choice, invalid messages. Epoch values are multiples "
        "of 512 ns so they are exact as JavaScript numbers.",
        "messages": [], "samples": [], "windows": [], "invalid": [],
    }
    for name, m in (
        ("request", x.ClockReq(T)),
        ("response", x.ClockResp(T, T + AHEAD + 51_200, T + AHEAD + 51_712)),
        ("report", x.ClockReport(AHEAD, 51_200, 102_400)),
        ("report_negative", x.ClockReport(-3_000_000, 700, 1_400)),
    ):
        out["messages"].append({"name": name, "map": m.to_map(), "json": x.encode_json(m),
                                "msgpack_hex": x.encode_msgpack(m).hex()})
    for name, t1, t2, t3, t4 in (
        ("house_ahead_250ms", T, T + AHEAD + 51_200, T + AHEAD + 51_712, T + 102_912),
        ("house_behind_3ms", T, T - 2_949_632, T - 2_949_120, T + 100_352),
        ("asymmetric_path", T, T + 80_384, T + 80_896, T + 100_352),
        ("odd_sum_floors", 1_000, 2_001, 2_002, 1_004),
        ("negative_odd_floors", 1_000, 500, 501, 1_004),
    ):
        s = x.Sample(t1, t2, t3, t4)
        out["samples"].append({"name": name, "t1": t1, "t2": t2, "t3": t3, "t4": t4,
                               "offset_ns": s.offset_ns, "rtt_ns": s.rtt_ns})

    def window(name: str, size: int, rows: list[tuple[int, int, int, int]]) -> None:
        join = x.ClockJoin(size)
        for t1, t2, t3, t4 in rows:
            join.response(x.ClockResp(t1, t2, t3), t4)
        report = join.report()
        out["windows"].append({"name": name, "window": size, "exchanges": [list(r) for r in rows],
                               "accepted": len(join.samples),
                               "report": report.to_map() if report else None})

    rtts = [2_048_000, 204_800, 1_024_000, 5_120_000, 409_600]
    base = []
    for i, d in enumerate(rtts):
        t1 = T + i * 51_200_000
        t2 = t1 + AHEAD + d // 2
        base.append((t1, t2, t2 + 512, t1 + d + 512))
    window("least_rtt_wins", 16, base)
    window("window_slides_past_best", 3, base)
    window("tie_keeps_earliest", 4, [(T, T + 1_024, T + 1_536, T + 2_048),
                                      (T + 4_096, T + 6_144, T + 6_656, T + 6_144)])
    window("impossible_rejected", 16, [(T, T + 10_240, T + 5_120, T + 20_480),
                                       (T, T + 512, T + 1_024, T - 512)])
    window("empty", 4, [])
    out["invalid"] = [
        {"name": "unknown_type", "json": '{"type":"clock_hello","t1":1}'},
        {"name": "missing_field", "json": '{"type":"clock_resp","t1":1,"t2":2}'},
        {"name": "float_timestamp", "json": '{"type":"clock_req","t1":1.5}'},
        {"name": "bool_timestamp", "json": '{"type":"clock_req","t1":true}'},
        {"name": "not_a_map", "json": "[1,2,3]"},
        {"name": "out_of_int64", "json": '{"type":"clock_req","t1":9223372036854775808}'},
    ]
    return out


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    PATH.write_text(render())
