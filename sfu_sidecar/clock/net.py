"""UDP sockets for the clock: PTP multicast on one interface with kernel timestamps, and SNTP.

Software timestamps come from the kernel (``SO_TIMESTAMPING``, Documentation/networking/
timestamping.rst): receive time in a control message, transmit time read back from the socket
error queue. Measured on veth this matches ptp4l (median ~0.5 us) where a timestamp taken in
Python after ``recvmsg`` is ~50 us off with a 20-50 ms tail. Where the kernel refuses, receive
times fall back to ``SO_TIMESTAMPNS`` and then to user space; :attr:`PtpSockets.mode` says which.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
from collections.abc import Callable

from sfu_sidecar import logs
from sfu_sidecar.clock import local
from sfu_sidecar.clock.ptpmsg import EVENT_PORT, GENERAL_PORT, PTP_PRIMARY_MULTICAST
from sfu_sidecar.exceptions import ConfigError

log = logs.get("clock.net")

# linux/net_tstamp.h
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_RX_SOFTWARE = 1 << 3
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_OPT_ID = 1 << 7
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)
MSG_ERRQUEUE = 0x2000
SIOCGIFADDR = 0x8915

# struct scm_timestamping { struct timespec ts[3]; }: ts[0] is the software stamp.
_SCM_TS = struct.Struct("=qqqqqq")
_TIMESPEC = struct.Struct("=qq")
_CMSG_SPACE = 256
# The transmit stamp is queued as the packet leaves (at once on veth); like ptp4l's
# tx_timestamp_timeout, give up on one sample after this.
TX_STAMP_TIMEOUT_S = 0.05

MODE_KERNEL = "kernel-software"
MODE_KERNEL_RX = "kernel-rx-only"
MODE_USER = "user-space"


def _ts_from_cmsgs(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancdata:
        if level != socket.SOL_SOCKET:
            continue
        if kind == SO_TIMESTAMPING and len(data) >= _SCM_TS.size:
            sec, nsec = _SCM_TS.unpack_from(data)[:2]
            if sec or nsec:
                return int(sec * 1_000_000_000 + nsec)
        elif kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return int(sec * 1_000_000_000 + nsec)
    return None


def interface_address(ifname: str) -> str:
    """IPv4 address of ``ifname`` (the multicast source and membership interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("256s", ifname.encode()[:15])
        try:
            res = fcntl.ioctl(s.fileno(), SIOCGIFADDR, req)
        except OSError as exc:
            raise ConfigError(f"ptp_interface {ifname}: no IPv4 address ({exc.strerror})") from None
    return socket.inet_ntoa(res[20:24])


def _enable_timestamps(sock: socket.socket) -> str:
    flags = (SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_RX_SOFTWARE
             | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_TSONLY | SOF_TIMESTAMPING_OPT_ID)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, flags)
        return MODE_KERNEL
    except OSError as exc:
        log.warning("SO_TIMESTAMPING refused (%s); trying SO_TIMESTAMPNS", exc.strerror)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return MODE_KERNEL_RX
    except OSError as exc:
        log.warning("SO_TIMESTAMPNS refused (%s); timestamps taken in user space", exc.strerror)
    return MODE_USER


Receiver = Callable[[bytes, int | None, bool], None]


class PtpSockets:
    """Event (319) and general (320) sockets joined to 224.0.1.129 on one interface.

    ``on_datagram(data, rx_ns, is_event)`` is called from the event loop for every datagram.
    """

    def __init__(self, interface: str, on_datagram: Receiver) -> None:
        self.interface = interface
        self.on_datagram = on_datagram
        self.address = interface_address(interface)
        self.ifindex = socket.if_nametoindex(interface)
        self.mode = MODE_USER
        self._event: socket.socket | None = None
        self._general: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tx_waiter: asyncio.Future[int] | None = None
        self.tx_stamp_misses = 0  # sends whose kernel stamp never came (user-space time used)

    def _open(self, port: int) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # Receive only what arrives on our interface; needs CAP_NET_RAW, else the multicast
            # membership below still limits what we see to this group.
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, self.interface.encode())
            s.bind(("0.0.0.0", port))
            mreqn = struct.pack("=4s4si", socket.inet_aton(PTP_PRIMARY_MULTICAST),
                                socket.inet_aton(self.address), self.ifindex)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreqn)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, mreqn)
            # Annex D.3 recommends TTL 1 for the primary multicast address.
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
            s.setblocking(False)
        except OSError:
            s.close()
            raise
        return s

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            self._event = self._open(EVENT_PORT)
            self._general = self._open(GENERAL_PORT)
        except OSError as exc:
            self.close()
            raise ConfigError(f"ptp_interface {self.interface}: {exc.strerror}") from None
        self.mode = _enable_timestamps(self._event)
        log.info("PTP on %s (%s), timestamps: %s", self.interface, self.address, self.mode)
        self._loop.add_reader(self._event.fileno(), self._readable, self._event, True)
        self._loop.add_reader(self._general.fileno(), self._readable, self._general, False)

    def _readable(self, sock: socket.socket, is_event: bool) -> None:
        if is_event:
            # A queued transmit stamp raises EPOLLERR, which wakes this reader; draining it here
            # keeps the loop from spinning on it and hands it to the waiting send_event.
            stamp = self._drain_errqueue(sock)
            if stamp is not None and self._tx_waiter is not None and not self._tx_waiter.done():
                self._tx_waiter.set_result(stamp)
        # Bounded drain: at most a burst of 16 datagrams per wakeup keeps the loop fair.
        for _ in range(16):
            try:
                data, anc, _flags, _addr = sock.recvmsg(2048, _CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("PTP receive failed: %s", exc.strerror)
                return
            rx = _ts_from_cmsgs(anc) if is_event else None
            if rx is None and is_event:
                rx = local.realtime_ns()
            self.on_datagram(data, rx, is_event)

    @staticmethod
    def _drain_errqueue(sock: socket.socket) -> int | None:
        stamp = None
        for _ in range(8):
            try:
                _data, anc, _flags, _addr = sock.recvmsg(2048, _CMSG_SPACE, MSG_ERRQUEUE)
            except OSError:
                break
            ts = _ts_from_cmsgs(anc)
            if ts is not None:
                stamp = ts
        return stamp

    async def send_event(self, data: bytes) -> int | None:
        """Send on the event port; return the transmit time (kernel stamp where available),
        or None when the sockets are closed, the send failed or another send is in flight."""
        sock = self._event
        if sock is None or self._loop is None or self._tx_waiter is not None:
            return None  # closed, or the previous stamp is still awaited: never mix them up
        self._drain_errqueue(sock)  # a stale stamp must not be taken for this packet's
        waiter: asyncio.Future[int] = self._loop.create_future()
        self._tx_waiter = waiter
        try:
            before = local.realtime_ns()
            # The kernel stamps the packet, queues the stamp and runs every poll callback on the
            # socket before the packet goes on. An epoll registration (the reader) made that
            # window ~0.5-1 us longer than ptp4l's, read as extra path delay; measured with
            # bench/clock_accuracy.py. Out of the epoll set while sending, the bias is gone.
            self._loop.remove_reader(sock.fileno())
            try:
                sock.sendto(data, (PTP_PRIMARY_MULTICAST, EVENT_PORT))
            except OSError as exc:
                log.warning("Delay_Req not sent: %s", exc.strerror)
                return None
            finally:
                self._loop.add_reader(sock.fileno(), self._readable, sock, True)
            if self.mode != MODE_KERNEL:
                return before
            # On veth the stamp is queued during sendto; elsewhere it follows at the driver's
            # transmit completion, which wakes the reader above.
            stamp = self._drain_errqueue(sock)
            if stamp is not None:
                return stamp
            try:
                return await asyncio.wait_for(waiter, TX_STAMP_TIMEOUT_S)
            except TimeoutError:
                self.tx_stamp_misses += 1
                log.debug("no transmit timestamp within %.0f ms; using the send time",
                          TX_STAMP_TIMEOUT_S * 1000)
                return before
        finally:
            self._tx_waiter = None

    def close(self) -> None:
        for s in (self._event, self._general):
            if s is None:
                continue
            if self._loop is not None:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(s.fileno())
            s.close()
        self._event = self._general = None
