"""PTPv2 codec byte for byte, and the slave against simulated masters and clocks."""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sfu_sidecar.clock.ptp import (
    MasterSelected,
    Measurement,
    PtpSlave,
    SendDelayReq,
    better_master,
)
from sfu_sidecar.clock.ptpmsg import (
    Announce,
    ClockQuality,
    DelayReq,
    DelayResp,
    Flag,
    FollowUp,
    Header,
    MessageType,
    PortIdentity,
    PtpError,
    Sync,
    Timestamp,
    format_identity,
    parse,
)

GM_A = bytes.fromhex("001122fffe334455")
GM_B = bytes.fromhex("00aabbfffeccddee")
ME = bytes.fromhex("0200000000000001")
NO_FLAGS = Flag(0)

# A two-step Sync as ptp4l sends it at 8 Hz: version 2, length 44, domain 0, flags TWO_STEP,
# correction 1.5 ns (0x18000 scaled), sourcePortIdentity GM_A-1, sequence 5, control 0,
# logMessageInterval -3, originTimestamp 1700000000 s + 123456789 ns.
SYNC_HEX = (
    "00" "02" "002c" "00" "00" "0200" "0000000000018000" "00000000"
    "001122fffe334455" "0001" "0005" "00" "fd"
    "0000" "6553f100" "075bcd15"
)
# Announce: domain 0, flags PTP_TIMESCALE|UTC_OFFSET_VALID, currentUtcOffset 37, priority1 128,
# clockClass 6, accuracy 0x21, variance 0x4e5d, priority2 128, GM GM_A, stepsRemoved 0,
# timeSource GPS (0x20), logMessageInterval 1.
ANNOUNCE_HEX = (
    "0b" "02" "0040" "00" "00" "000c" "0000000000000000" "00000000"
    "001122fffe334455" "0001" "0007" "05" "01"
    "000000000000" "00000000"
    "0025" "00" "80" "06" "21" "4e5d" "80" "001122fffe334455" "0000" "20"
)
DELAY_RESP_HEX = (
    "09" "02" "0036" "00" "00" "0000" "0000000000000000" "00000000"
    "001122fffe334455" "0001" "0009" "03" "fd"
    "0000" "6553f100" "00000064"
    "0200000000000001" "0001"
)


def _hdr(mtype: MessageType, seq: int, *, flags: Flag = NO_FLAGS, corr: int = 0,
         source: bytes = GM_A, log: int = -3, length: int = 44) -> Header:
    return Header(mtype, 0, flags, corr, PortIdentity(source, 1), seq, log, length)


def test_sync_both_ways() -> None:
    data = bytes.fromhex(SYNC_HEX)
    msg = Sync(_hdr(MessageType.SYNC, 5, flags=Flag.TWO_STEP, corr=0x18000),
               Timestamp(1700000000, 123456789))
    assert parse(data) == msg
    assert msg.serialize() == data
    assert msg.header.correction_ns == 1.5


def test_announce_both_ways() -> None:
    data = bytes.fromhex(ANNOUNCE_HEX)
    msg = Announce(
        _hdr(MessageType.ANNOUNCE, 7, flags=Flag.PTP_TIMESCALE | Flag.UTC_OFFSET_VALID, log=1,
             length=64),
        Timestamp(0, 0), 37, 128, ClockQuality(6, 0x21, 0x4E5D), 128, GM_A, 0, 0x20,
    )
    assert parse(data) == msg
    assert msg.serialize() == data


def test_delay_resp_both_ways() -> None:
    data = bytes.fromhex(DELAY_RESP_HEX)
    msg = DelayResp(_hdr(MessageType.DELAY_RESP, 9, length=54),
                    Timestamp(1700000000, 100), PortIdentity(ME, 1))
    assert parse(data) == msg
    assert msg.serialize() == data


def test_follow_up_and_delay_req_round_trip() -> None:
    for msg in (FollowUp(_hdr(MessageType.FOLLOW_UP, 1, corr=-65536), Timestamp(1, 2)),
                DelayReq(_hdr(MessageType.DELAY_REQ, 65535, log=0x7F), Timestamp(0, 0))):
        assert parse(msg.serialize()) == msg


def test_negative_correction_and_48_bit_seconds() -> None:
    msg = Sync(_hdr(MessageType.SYNC, 0, corr=-(10 << 16)), Timestamp((1 << 48) - 1, 999999999))
    back = parse(msg.serialize())
    assert back == msg
    assert back.header.correction_ns == -10.0


@pytest.mark.parametrize("hexdata", [SYNC_HEX, ANNOUNCE_HEX, DELAY_RESP_HEX])
def test_every_truncation_is_a_typed_error(hexdata: str) -> None:
    data = bytes.fromhex(hexdata)
    for cut in range(len(data)):
        with pytest.raises(PtpError):
            parse(data[:cut])


def test_trailing_tlv_is_ignored() -> None:
    data = bytes.fromhex(ANNOUNCE_HEX) + bytes.fromhex("0008000800000000000000000000")
    assert isinstance(parse(data), Announce)


def test_bad_version_type_and_nanoseconds() -> None:
    data = bytearray(bytes.fromhex(SYNC_HEX))
    data[1] = 1
    with pytest.raises(PtpError, match="versionPTP"):
        parse(bytes(data))
    data = bytearray(bytes.fromhex(SYNC_HEX))
    data[0] = 0x0D  # Management: not for a slave
    with pytest.raises(PtpError, match="messageType"):
        parse(bytes(data))
    data = bytearray(bytes.fromhex(SYNC_HEX))
    data[40:44] = (10**9).to_bytes(4, "big")
    with pytest.raises(PtpError, match="nanoseconds"):
        parse(bytes(data))


def test_random_bytes_never_crash() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(80)))
        with contextlib.suppress(PtpError):
            parse(data)


def test_identity_format_matches_rfc7273_style() -> None:
    assert format_identity(GM_A) == "00-11-22-FF-FE-33-44-55"


def _announce(gm: bytes, *, p1: int = 128, cls: int = 248, steps: int = 0, seq: int = 0,
              source: bytes | None = None, flags: Flag = NO_FLAGS, utc: int = 37) -> Announce:
    return Announce(_hdr(MessageType.ANNOUNCE, seq, source=source or gm, log=-2, flags=flags,
                         length=64),
                    Timestamp(0, 0), utc, p1, ClockQuality(cls, 0xFE, 0xFFFF), 128, gm, steps)


def test_bmca_order() -> None:
    a = _announce(GM_A)
    assert better_master(_announce(GM_B, p1=100), a)  # priority1 first
    assert better_master(_announce(GM_B, cls=6), a)  # then clockClass
    assert better_master(a, _announce(GM_B))  # identity breaks the tie
    # Same grandmaster through two boundary clocks: fewer steps removed wins.
    assert better_master(_announce(GM_A, steps=1, source=GM_B),
                         _announce(GM_A, steps=2, source=ME))


# --- simulation ------------------------------------------------------------------------------

NS = 1_000_000_000
SYNC_INTERVAL = NS // 8
ANNOUNCE_INTERVAL = NS // 4


@dataclass
class SimMaster:
    """A master on true time + ``offset_ns``; paths to/from the slave of given delays."""

    gm: bytes
    offset_ns: int
    two_step: bool = True
    p1: int = 128
    tai: bool = False
    residence_ns: int = 0  # correctionField a transparent clock would add
    seq: int = 0
    delay_ms_ns: int = 50_000
    delay_sm_ns: int = 50_000
    alive: bool = True
    delay_reqs: dict[int, int] = field(default_factory=dict)

    def time(self, true_ns: int) -> int:
        return true_ns + self.offset_ns + (37 * NS if self.tai else 0)

    def announce(self) -> bytes:
        flags = Flag.PTP_TIMESCALE | Flag.UTC_OFFSET_VALID if self.tai else Flag(0)
        return _announce(self.gm, p1=self.p1, seq=self.seq, flags=flags).serialize()

    def sync(self, true_ns: int) -> list[bytes]:
        self.seq = (self.seq + 1) & 0xFFFF
        ts = Timestamp.from_ns(self.time(true_ns))
        corr = self.residence_ns << 16
        if not self.two_step:
            return [Sync(_hdr(MessageType.SYNC, self.seq, source=self.gm, corr=corr),
                         ts).serialize()]
        return [
            Sync(_hdr(MessageType.SYNC, self.seq, source=self.gm, flags=Flag.TWO_STEP,
                      corr=corr), Timestamp(0, 0)).serialize(),
            FollowUp(_hdr(MessageType.FOLLOW_UP, self.seq, source=self.gm),
                     ts).serialize(),
        ]

    def delay_resp(self, req_seq: int, arrive_true_ns: int, requester: PortIdentity) -> bytes:
        return DelayResp(_hdr(MessageType.DELAY_RESP, req_seq, source=self.gm, log=-3,
                              length=54),
                         Timestamp.from_ns(self.time(arrive_true_ns)), requester).serialize()


@dataclass
class Run:
    slave: PtpSlave
    measurements: list[Measurement] = field(default_factory=list)
    selected: list[bytes | None] = field(default_factory=list)


def simulate(masters: list[SimMaster], seconds: float, *, local_offset_ns: int = 0,
             local_ppb: float = 0.0, drop: float = 0.0, reorder: bool = False,
             seed: int = 1, slave: PtpSlave | None = None, start_ns: int = 1_700_000_000 * NS,
             ) -> Run:
    """Run masters and one slave on a true timeline; the slave's local clock is
    ``true + local_offset + true_elapsed * local_ppb``. Only the slave's view is observable."""
    rng = random.Random(seed)
    run = Run(slave or PtpSlave(ME, rng=random.Random(seed)))

    def local(true_ns: int) -> int:
        return true_ns + local_offset_ns + round((true_ns - start_ns) * local_ppb / 1e9)

    def deliver(data: bytes, true_ns: int) -> None:
        for ev in run.slave.receive(data, local(true_ns), local(true_ns)):
            if isinstance(ev, Measurement):
                run.measurements.append(ev)
            elif isinstance(ev, MasterSelected):
                run.selected.append(ev.announce.grandmaster if ev.announce else None)
            elif isinstance(ev, SendDelayReq):
                assert 0 <= ev.delay_ns < SYNC_INTERVAL  # a random point in the Sync interval
                tx_true = true_ns + 10_000 + ev.delay_ns
                run.slave.delay_req_sent(ev.sequence_id, local(tx_true))
                for m in masters:
                    if m.alive and run.slave.parent and m.gm == run.slave.parent.grandmaster:
                        arrive = tx_true + m.delay_sm_ns
                        resp = m.delay_resp(ev.sequence_id, arrive, run.slave.identity)
                        if rng.random() >= drop:
                            deliver(resp, arrive + 1000)

    t = start_ns
    end = start_ns + int(seconds * NS)
    while t < end:
        for m in masters:
            if not m.alive:
                continue
            if (t - start_ns) % ANNOUNCE_INTERVAL == 0:
                deliver(m.announce(), t + m.delay_ms_ns)
            msgs = m.sync(t)
            arrive = t + m.delay_ms_ns
            stamped = [(d, arrive + i * 20_000) for i, d in enumerate(msgs)
                       if rng.random() >= drop]
            if reorder and len(stamped) == 2 and rng.random() < 0.5:
                # The Follow_Up overtakes its Sync; the Sync keeps its own arrival stamp.
                (sync, t_sync), (fu, _) = stamped
                stamped = [(fu, t_sync - 1_000), (sync, t_sync)]
            for d, at in stamped:
                deliver(d, at)
        t += SYNC_INTERVAL
    return run


def _offsets(run: Run) -> list[int]:
    return [m.master_minus_local_ns for m in run.measurements]


def test_two_step_offset_and_delay() -> None:
    run = simulate([SimMaster(GM_A, offset_ns=5_000_000)], 5, local_offset_ns=-1_000)
    assert run.selected == [GM_A]
    offs = _offsets(run)
    assert len(offs) > 20
    # master - local = 5 ms + 1 us exactly: symmetric paths, no drift.
    assert all(o == 5_001_000 for o in offs[3:])
    assert run.slave.path_delay_ns == 50_000


def test_one_step_with_correction_field() -> None:
    # One-step Sync: the origin is precise; a transparent clock's residence time of 700 ns is in
    # correctionField and must be taken out of both the offset and the delay (11.2, 11.3).
    m = SimMaster(GM_A, offset_ns=-2_000_000, two_step=False, residence_ns=700)
    m.delay_ms_ns += 700
    run = simulate([m], 3)
    assert all(o == -2_000_000 for o in _offsets(run)[3:])


def test_path_asymmetry_shows_as_half_the_difference() -> None:
    # 11.3 assumes symmetric paths; 20 us of asymmetry costs 10 us of offset. Documented limit.
    m = SimMaster(GM_A, offset_ns=0, delay_ms_ns=60_000, delay_sm_ns=40_000)
    run = simulate([m], 3)
    assert all(o == -10_000 for o in _offsets(run)[3:])
    assert run.slave.path_delay_ns == 50_000


def test_frequency_error_shows_as_a_ramp() -> None:
    run = simulate([SimMaster(GM_A, offset_ns=0)], 10, local_ppb=20_000.0)
    first, last = run.measurements[2], run.measurements[-1]
    slope = ((last.master_minus_local_ns - first.master_minus_local_ns)
             / (last.local_ns - first.local_ns))
    assert slope == pytest.approx(-20e-6, rel=0.02)


def test_tai_master_is_converted_to_utc() -> None:
    run = simulate([SimMaster(GM_A, offset_ns=1234, tai=True)], 3)
    assert all(o == 1234 for o in _offsets(run)[3:])


def test_lost_and_reordered_messages() -> None:
    run = simulate([SimMaster(GM_A, offset_ns=777_000)], 20, drop=0.2, reorder=True, seed=3)
    offs = _offsets(run)
    assert len(offs) > 40
    assert all(o == 777_000 for o in offs)


def test_needs_two_announces_then_follows_better_master_and_falls_back() -> None:
    a = SimMaster(GM_A, offset_ns=1_000)
    b = SimMaster(GM_B, offset_ns=2_000, p1=100)
    b.alive = False
    slave = PtpSlave(ME)
    run = simulate([a, b], 2, slave=slave)
    assert run.selected == [GM_A]
    b.alive = True
    run2 = simulate([a, b], 2, slave=slave, start_ns=1_700_000_002 * NS)
    assert run2.selected == [GM_B]
    assert _offsets(run2)[-1] == 2_000
    b.alive = False
    run3 = simulate([a, b], 2, slave=slave, start_ns=1_700_000_004 * NS)
    # announceReceiptTimeout = 3 announce intervals (0.75 s): back to A.
    assert run3.selected == [GM_A]
    assert _offsets(run3)[-1] == 1_000


def test_silence_loses_the_master() -> None:
    slave = PtpSlave(ME)
    simulate([SimMaster(GM_A, offset_ns=0)], 2, slave=slave)
    later = 1_700_000_002 * NS + NS
    assert slave.poll(later) == [MasterSelected(None)]
    assert slave.parent is None


def test_other_domain_and_non_parent_ignored() -> None:
    slave = PtpSlave(ME, domain=4)
    run = simulate([SimMaster(GM_A, offset_ns=0)], 1, slave=slave)
    assert run.selected == [] and run.measurements == []
    assert slave.ignored > 0


# --- properties ------------------------------------------------------------------------------

_identities = st.binary(min_size=8, max_size=8)
_timestamps = st.builds(Timestamp, st.integers(0, (1 << 48) - 1), st.integers(0, NS - 1))
_headers = st.builds(
    Header,
    message_type=st.just(MessageType.SYNC),
    domain=st.integers(0, 255),
    flags=st.integers(0, 0xFFFF).map(Flag),
    correction=st.integers(-(1 << 63), (1 << 63) - 1),
    source=st.builds(PortIdentity, _identities, st.integers(0, 0xFFFF)),
    sequence_id=st.integers(0, 0xFFFF),
    log_interval=st.integers(-128, 127),
)


@given(_headers, _timestamps)
def test_any_sync_round_trips(header: Header, ts: Timestamp) -> None:
    msg = Sync(Header(**{**header.__dict__, "message_length": 44}), ts)
    assert parse(msg.serialize()) == msg


@given(_headers, _timestamps, st.integers(-(1 << 15), (1 << 15) - 1), st.integers(0, 255),
       st.integers(0, 255), _identities, st.integers(0, 0xFFFF))
def test_any_announce_round_trips(header: Header, ts: Timestamp, utc: int, p1: int, p2: int,
                                  gm: bytes, steps: int) -> None:
    h = Header(**{**header.__dict__, "message_type": MessageType.ANNOUNCE, "message_length": 64})
    msg = Announce(h, ts, utc, p1, ClockQuality(6, 0x21, 0x4E5D), p2, gm, steps, 0x20)
    assert parse(msg.serialize()) == msg


@given(st.binary(max_size=120))
def test_any_bytes_parse_or_raise_typed(data: bytes) -> None:
    with contextlib.suppress(PtpError):
        parse(data)


def test_delay_resp_before_the_transmit_stamp_still_counts() -> None:
    """The adapter may read the Delay_Resp before the kernel's transmit stamp is handed over."""
    slave = PtpSlave(ME, rng=random.Random(1))
    master = SimMaster(GM_A, offset_ns=9_000)
    t = 1_700_000_000 * NS
    for i in range(3):
        slave.receive(master.announce(), t + i * ANNOUNCE_INTERVAL, t + i * ANNOUNCE_INTERVAL)
    t += NS
    events: list[object] = []
    for data in master.sync(t):
        events += slave.receive(data, t + 50_000, t + 50_000)
    req = next(e for e in events if isinstance(e, SendDelayReq))
    tx = t + 100_000
    resp = master.delay_resp(req.sequence_id, tx + 50_000, slave.identity)
    slave.receive(resp, None, tx + 60_000)  # answer first...
    assert slave.delay_samples == 0
    slave.delay_req_sent(req.sequence_id, tx)  # ...stamp second
    assert slave.delay_samples == 1 and slave.path_delay_ns == 50_000
