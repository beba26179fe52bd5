"""Kernel software timestamps on a real loopback socket, and their control-message parsing."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from sfu_sidecar.clock import net
from sfu_sidecar.exceptions import ConfigError


def test_cmsg_parsing() -> None:
    ts = struct.pack("=qqqqqq", 1_700_000_000, 123, 0, 0, 0, 0)
    assert net._ts_from_cmsgs([(socket.SOL_SOCKET, net.SO_TIMESTAMPING, ts)]) == (
        1_700_000_000_000_000_123)
    tsns = struct.pack("=qq", 5, 6)
    assert net._ts_from_cmsgs([(socket.SOL_SOCKET, net.SO_TIMESTAMPNS, tsns)]) == 5_000_000_006
    zero = struct.pack("=qqqqqq", 0, 0, 0, 0, 7, 8)  # only a hardware stamp: not ours
    assert net._ts_from_cmsgs([(socket.SOL_SOCKET, net.SO_TIMESTAMPING, zero)]) is None
    assert net._ts_from_cmsgs([(socket.IPPROTO_IP, 8, b"\0" * 12)]) is None


@pytest.mark.integration
def test_kernel_stamps_on_loopback() -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        assert net._enable_timestamps(rx) == net.MODE_KERNEL
        assert net._enable_timestamps(tx) == net.MODE_KERNEL
        rx.settimeout(2)
        # The kernel turns receive stamping on lazily (a deferred static key) when the first
        # socket asks: a packet sent right then may arrive unstamped. Retry a few, bounded.
        stamp = None
        for _ in range(50):
            while net.PtpSockets._drain_errqueue(tx) is not None:
                pass  # drop transmit stamps of earlier attempts
            before = time.clock_gettime_ns(time.CLOCK_REALTIME)
            tx.sendto(b"x", rx.getsockname())
            _data, anc, _flags, _addr = rx.recvmsg(64, 256)
            after = time.clock_gettime_ns(time.CLOCK_REALTIME)
            stamp = net._ts_from_cmsgs(anc)
            if stamp is not None:
                break
            time.sleep(0.01)
        assert stamp is not None and before <= stamp <= after
        # The transmit stamp comes back on the sender's error queue (MSG_ERRQUEUE).
        tx_stamp = None
        # The stamp is queued by the kernel after the send returns; allow a loaded machine 2 s.
        for _ in range(2000):
            tx_stamp = net.PtpSockets._drain_errqueue(tx)
            if tx_stamp is not None:
                break
            time.sleep(0.001)
        assert tx_stamp is not None and before <= tx_stamp <= stamp
    finally:
        rx.close()
        tx.close()


@pytest.mark.integration
def test_unknown_interface_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nosuch0"):
        net.interface_address("nosuch0")


@pytest.mark.integration
def test_refused_timestamping_falls_back_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.close()  # every setsockopt now fails (EBADF): the kernel refuses both stamp options
    with caplog.at_level("WARNING", logger="sfu_sidecar.clock.net"):
        assert net._enable_timestamps(s) == net.MODE_USER
    text = caplog.text
    assert "SO_TIMESTAMPING refused" in text and "user space" in text
