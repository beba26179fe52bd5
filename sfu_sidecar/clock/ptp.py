"""IEEE 1588-2008 (PTPv2): a slave-only ordinary clock, sans I/O (its messages are in
:mod:`sfu_sidecar.clock.ptpmsg`).

:class:`PtpSlave` is the protocol logic of one slave port: best-master choice over Announce
(clause 9.3), one- and two-step Sync (11.2, 11.4), end-to-end Delay_Req/Delay_Resp (11.3),
correctionField, and the TAI -> UTC conversion (7.2.3). It never reads a clock and never
touches a socket: the adapter hands it each datagram with its receive timestamp and a
monotonic ``now``; it hands back events.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from statistics import median

from sfu_sidecar.clock.ptpmsg import (
    DEFAULT_UTC_OFFSET_S,
    NS_PER_S,
    Announce,
    DelayReq,
    DelayResp,
    Flag,
    FollowUp,
    Header,
    Message,
    MessageType,
    PortIdentity,
    PtpError,
    Sync,
    Timestamp,
    parse,
)

# --- best master clock algorithm -------------------------------------------------------------


def dataset_key(a: Announce) -> tuple[int, int, int, int, int, bytes]:
    """The grandmaster comparison of 9.3.4 Figure 27, part 1: lower is better."""
    q = a.quality
    return (a.priority1, q.clock_class, q.clock_accuracy, q.offset_scaled_log_variance,
            a.priority2, a.grandmaster)


def better_master(a: Announce, b: Announce) -> bool:
    """True when ``a`` describes a better master than ``b`` (9.3.4, Figures 27 and 28).

    Different grandmasters compare by their quality vector; the same grandmaster seen through
    two ports prefers fewer steps removed, then the lower sender identity (topology tie break).
    """
    if a.grandmaster != b.grandmaster:
        return dataset_key(a) < dataset_key(b)
    if a.steps_removed != b.steps_removed:
        return a.steps_removed < b.steps_removed
    return a.header.source < b.header.source


# --- the slave -------------------------------------------------------------------------------

# 9.3.2.4.4: a foreign master counts once it sent this many Announces within the window of
# FOREIGN_MASTER_TIME_WINDOW announce intervals.
FOREIGN_MASTER_THRESHOLD = 2
FOREIGN_MASTER_TIME_WINDOW = 4
# 7.7.3.1 default announceReceiptTimeout (in announce intervals).
ANNOUNCE_RECEIPT_TIMEOUT = 3
# Delay_Req interval before the master told us its logMinDelayReqInterval (7.7.2.4 default 0).
DEFAULT_LOG_DELAY_REQ = 0
# Path delay is the median of this many measurements, like ptp4l's delay_filter_length.
DELAY_FILTER_LENGTH = 10
# A Sync waiting for its Follow_Up (or a Delay_Req for its Delay_Resp) is dropped after this.
PENDING_LIMIT = 8


def _interval_ns(log_interval: int) -> int:
    # 7.7.2.1: the interval is 2^logMessageInterval seconds; 0x7F means "not given".
    if log_interval == 0x7F:
        log_interval = 0
    log_interval = max(-7, min(6, log_interval))
    return int(NS_PER_S * 2.0**log_interval)


@dataclass(frozen=True)
class MasterSelected:
    """The port chose a new parent (or lost it: ``announce`` is None)."""

    announce: Announce | None


@dataclass(frozen=True)
class SendDelayReq:
    """Send ``data`` to the event port ``delay_ns`` from now, then report its transmit time
    via ``delay_req_sent``."""

    data: bytes
    sequence_id: int
    delay_ns: int = 0


@dataclass(frozen=True)
class Measurement:
    """One offset measurement (11.2): at local time ``local_ns`` the master's UTC was
    ``local_ns + master_minus_local_ns``. ``path_delay_ns`` is the filtered meanPathDelay."""

    local_ns: int
    master_minus_local_ns: int
    path_delay_ns: int


Event = MasterSelected | SendDelayReq | Measurement


@dataclass
class _Foreign:
    announce: Announce
    seen: deque[int] = field(default_factory=lambda: deque(maxlen=FOREIGN_MASTER_THRESHOLD))
    last_ns: int = 0


@dataclass
class _PendingSync:
    sequence_id: int
    rx_ns: int
    correction: int
    log_interval: int


class PtpSlave:
    """One slave-only port (9.2.2: slaveOnly = TRUE, so it never becomes master).

    ``receive`` takes a datagram, its local receive timestamp (ns on the local clock, UTC) and a
    monotonic ``now_ns`` for timeouts; ``poll(now_ns)`` runs timeouts alone. Both return events.
    """

    def __init__(self, clock_identity: bytes, domain: int = 0, port_number: int = 1,
                 rng: random.Random | None = None) -> None:
        self.identity = PortIdentity(clock_identity, port_number)
        self._rng = rng or random.Random()
        self.domain = domain
        self.parent: Announce | None = None
        self._foreign: dict[PortIdentity, _Foreign] = {}
        self._pending_sync: _PendingSync | None = None
        self._follow_ups: dict[int, FollowUp] = {}
        self._delay_seq = 0
        self._delay_req_tx: dict[int, int] = {}
        self._early_resps: dict[int, DelayResp] = {}
        self._last_delay_req_ns: int | None = None
        self._log_delay_req = DEFAULT_LOG_DELAY_REQ
        self._delays: deque[int] = deque(maxlen=DELAY_FILTER_LENGTH)
        # (master t1 + sync correction, local t2): the last completed Sync, for Delay_Resp.
        self._last_sync: tuple[int, int] | None = None
        self.path_delay_ns: int | None = None
        self.last_offset_ns: int | None = None  # offsetFromMaster, 11.2: slave - master
        self.samples = 0
        self.delay_samples = 0
        self.errors = 0
        self.ignored = 0

    # -- adapter entry points -----------------------------------------------------------------

    def receive(self, data: bytes, rx_ns: int | None, now_ns: int) -> list[Event]:
        """Handle one datagram. ``rx_ns`` may be None for general-port messages."""
        try:
            msg = parse(data)
        except PtpError:
            self.errors += 1
            raise
        if msg.header.domain != self.domain or msg.header.source == self.identity:
            self.ignored += 1
            return []
        events: list[Event] = []
        if isinstance(msg, Announce):
            events += self._on_announce(msg, now_ns)
        elif isinstance(msg, Sync):
            if rx_ns is None:
                raise PtpError("Sync without a receive timestamp")
            events += self._on_sync(msg, rx_ns, now_ns)
        elif isinstance(msg, FollowUp):
            events += self._on_follow_up(msg, now_ns)
        elif isinstance(msg, DelayResp):
            self._on_delay_resp(msg)
        else:
            self.ignored += 1
        events += self.poll(now_ns)
        return events

    def delay_req_sent(self, sequence_id: int, tx_ns: int) -> None:
        """Record t3, the local transmit time of a Delay_Req (11.3.2)."""
        early = self._early_resps.pop(sequence_id, None)
        if early is not None:
            # The answer was read before the transmit stamp came back from the kernel.
            self._delay_measured(early, tx_ns)
            return
        self._delay_req_tx[sequence_id] = tx_ns
        while len(self._delay_req_tx) > PENDING_LIMIT:
            del self._delay_req_tx[min(self._delay_req_tx)]

    def poll(self, now_ns: int) -> list[Event]:
        """Expire foreign masters whose Announces stopped (7.7.3.1) and re-run the choice."""
        for key, foreign in list(self._foreign.items()):
            timeout = ANNOUNCE_RECEIPT_TIMEOUT * _interval_ns(foreign.announce.header.log_interval)
            if now_ns - foreign.last_ns > timeout:
                del self._foreign[key]
        return self._select()

    @property
    def parent_port(self) -> PortIdentity | None:
        return self.parent.header.source if self.parent is not None else None

    def utc_offset_ns(self) -> int:
        """What to subtract from the master's timestamps to get UTC (7.2.3)."""
        p = self.parent
        if p is None or not p.header.flags & Flag.PTP_TIMESCALE:
            return 0  # ARB timescale: taken as given
        if p.header.flags & Flag.UTC_OFFSET_VALID:
            return p.current_utc_offset * NS_PER_S
        return max(p.current_utc_offset, DEFAULT_UTC_OFFSET_S) * NS_PER_S

    # -- message handlers ---------------------------------------------------------------------

    def _on_announce(self, msg: Announce, now_ns: int) -> list[Event]:
        # 9.5.3: an Announce whose stepsRemoved is 255 or more is ignored (loop guard).
        if msg.steps_removed >= 255:
            self.ignored += 1
            return []
        key = msg.header.source
        foreign = self._foreign.get(key)
        if foreign is None:
            foreign = self._foreign[key] = _Foreign(msg)
        foreign.announce = msg
        foreign.seen.append(now_ns)
        foreign.last_ns = now_ns
        if self.parent is not None and key == self.parent.header.source:
            self.parent = msg  # keep the dataset current (UTC offset, flags) without reselecting
        return []

    def _qualified(self, foreign: _Foreign, now_ns: int) -> bool:
        window = FOREIGN_MASTER_TIME_WINDOW * _interval_ns(foreign.announce.header.log_interval)
        return (len(foreign.seen) >= FOREIGN_MASTER_THRESHOLD
                and now_ns - foreign.seen[0] <= window)

    def _select(self) -> list[Event]:
        best: Announce | None = None
        for foreign in self._foreign.values():
            current = self.parent is not None and foreign.announce.header.source == (
                self.parent.header.source
            )
            # The current parent stays qualified while it keeps announcing; a newcomer must
            # pass the threshold first (9.3.2.5).
            if not current and not self._qualified(foreign, foreign.last_ns):
                continue
            if best is None or better_master(foreign.announce, best):
                best = foreign.announce
        old = self.parent_port
        new = best.header.source if best is not None else None
        if old == new:
            if best is not None:
                self.parent = best
            return []
        self.parent = best
        self._reset_path()
        return [MasterSelected(best)]

    def _reset_path(self) -> None:
        self._pending_sync = None
        self._follow_ups.clear()
        self._delay_req_tx.clear()
        self._early_resps.clear()
        self._delays.clear()
        self._last_sync = None
        self.path_delay_ns = None
        self._last_delay_req_ns = None

    def _from_parent(self, msg: Message) -> bool:
        if self.parent is None or msg.header.source != self.parent.header.source:
            self.ignored += 1
            return False
        return True

    def _on_sync(self, msg: Sync, rx_ns: int, now_ns: int) -> list[Event]:
        if not self._from_parent(msg):
            return []
        if msg.header.flags & Flag.TWO_STEP:
            fu = self._follow_ups.pop(msg.header.sequence_id, None)
            if fu is None:
                self._pending_sync = _PendingSync(msg.header.sequence_id, rx_ns,
                                                  msg.header.correction, msg.header.log_interval)
                return []
            # Follow_Up overtook its Sync (reordering): complete now.
            return self._complete_sync(fu.precise_origin, msg.header.correction
                                       + fu.header.correction, rx_ns, now_ns,
                                       msg.header.log_interval)
        # One-step (11.4.3 a): originTimestamp is precise, correction carries residence time.
        return self._complete_sync(msg.origin, msg.header.correction, rx_ns, now_ns,
                                   msg.header.log_interval)

    def _on_follow_up(self, msg: FollowUp, now_ns: int) -> list[Event]:
        if not self._from_parent(msg):
            return []
        pending = self._pending_sync
        if pending is None or pending.sequence_id != msg.header.sequence_id:
            self._follow_ups[msg.header.sequence_id] = msg
            while len(self._follow_ups) > PENDING_LIMIT:
                del self._follow_ups[min(self._follow_ups)]
            return []
        self._pending_sync = None
        # 11.4.3 c/d: t1 = preciseOriginTimestamp, correction = Sync's + Follow_Up's.
        return self._complete_sync(msg.precise_origin, pending.correction
                                   + msg.header.correction, pending.rx_ns, now_ns,
                                   pending.log_interval)

    def _complete_sync(self, origin: Timestamp, correction: int, t2: int, now_ns: int,
                       origin_interval: int) -> list[Event]:
        t1 = origin.to_ns() - self.utc_offset_ns()
        corr_ns = round(correction / 65536)
        self._last_sync = (t1 + corr_ns, t2)
        events: list[Event] = []
        if self._delay_req_due(now_ns):
            events.append(self._make_delay_req(now_ns, origin_interval))
        if self.path_delay_ns is None:
            return events  # 11.2 needs meanPathDelay; wait for the first Delay_Resp
        # 11.2: offsetFromMaster = t2 - t1 - meanPathDelay - correction.
        offset = t2 - t1 - self.path_delay_ns - corr_ns
        self.last_offset_ns = offset
        self.samples += 1
        events.append(Measurement(t2, -offset, self.path_delay_ns))
        return events

    def _delay_req_due(self, now_ns: int) -> bool:
        if self._last_delay_req_ns is None:
            return True
        return now_ns - self._last_delay_req_ns >= _interval_ns(self._log_delay_req)

    def _make_delay_req(self, now_ns: int, sync_log_interval: int) -> SendDelayReq:
        # 9.5.11.2: Delay_Req times are randomised, so the requests of many slaves do not all
        # queue at the master right behind each Sync; here a random point of the next Sync
        # interval after at least logMinDelayReqInterval since the previous request.
        delay = self._rng.randrange(_interval_ns(sync_log_interval))
        self._last_delay_req_ns = now_ns + delay
        self._delay_seq = (self._delay_seq + 1) & 0xFFFF
        header = Header(MessageType.DELAY_REQ, self.domain, Flag(0), 0, self.identity,
                        self._delay_seq, log_interval=0x7F)
        # 11.3.2 a: originTimestamp may be zero; t3 comes from the transmit timestamp.
        return SendDelayReq(DelayReq(header, Timestamp(0, 0)).serialize(), self._delay_seq, delay)

    def _on_delay_resp(self, msg: DelayResp) -> None:
        if not self._from_parent(msg) or msg.requesting != self.identity:
            return
        # 7.7.2.4: the Delay_Resp carries the master's logMinDelayReqInterval.
        if msg.header.log_interval != 0x7F:
            self._log_delay_req = msg.header.log_interval
        t3 = self._delay_req_tx.pop(msg.header.sequence_id, None)
        if t3 is None:
            if msg.header.sequence_id == self._delay_seq:
                self._early_resps = {msg.header.sequence_id: msg}
            return
        self._delay_measured(msg, t3)

    def _delay_measured(self, msg: DelayResp, t3: int) -> None:
        if self._last_sync is None:
            return
        t1c, t2 = self._last_sync
        t4 = msg.receive.to_ns() - self.utc_offset_ns()
        corr_ns = round(msg.header.correction / 65536)
        # 11.3.2: meanPathDelay = ((t2 - t3) + (t4 - t1) - corrSync - corrDelayResp) / 2, with
        # corrSync already folded into t1c.
        delay = ((t2 - t3) + (t4 - corr_ns - t1c)) // 2
        self._delays.append(delay)
        self.delay_samples += 1
        self.path_delay_ns = int(median(self._delays))
