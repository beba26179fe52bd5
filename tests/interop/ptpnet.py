"""Network namespaces, ptp4l and chronyd for clock tests and the clock benchmark.

Two namespaces joined by a veth pair: the master side runs ``ptp4l -S`` (software timestamps),
the slave side runs the product. Both share the host's one kernel clock, so the master's time is
made to differ by a known N ns with ``--egressLatency N --ingressLatency -N`` (its transmit
stamps read N later, its receive stamps N earlier, so it looks N ahead to every slave).
Everything made here is torn down by :meth:`PtpNet.close`, also when a test fails.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

MASTER_ADDR = "10.99.0.1"
SLAVE_ADDR = "10.99.0.2"


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=10)


class PtpNet:
    """A namespace pair ``<tag>a`` (master) / ``<tag>b`` (product) with veth ``<tag>va``/``vb``."""

    def __init__(self, workdir: Path) -> None:
        self.tag = "sc" + uuid.uuid4().hex[:6]
        self.ns_master = self.tag + "a"
        self.ns_slave = self.tag + "b"
        self.if_master = self.tag + "va"
        self.if_slave = self.tag + "vb"
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self._made: list[str] = []
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        for ns in (self.ns_master, self.ns_slave):
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
        _run("ip", "link", "add", self.if_master, "type", "veth", "peer", "name", self.if_slave)
        _run("ip", "link", "set", self.if_master, "netns", self.ns_master)
        _run("ip", "link", "set", self.if_slave, "netns", self.ns_slave)
        for ns, ifname, addr in ((self.ns_master, self.if_master, MASTER_ADDR),
                                 (self.ns_slave, self.if_slave, SLAVE_ADDR)):
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
            _run("ip", "-n", ns, "link", "set", ifname, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "route", "add", "224.0.0.0/4", "dev", ifname)

    def exec_prefix(self, ns: str) -> list[str]:
        return ["ip", "netns", "exec", ns]

    def spawn(self, ns: str, cmd: list[str], log_name: str,
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.workdir / log_name).open("wb")
        proc = subprocess.Popen([*self.exec_prefix(ns), *cmd], stdout=log,
                                stderr=subprocess.STDOUT, env=env or dict(os.environ))
        self.procs.append(proc)
        return proc

    def start_master(self, offset_ns: int, log_sync_interval: int = -3,
                     priority1: int = 128, name: str = "master",
                     extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        """ptp4l -S as grandmaster on the master side, looking ``offset_ns`` ahead."""
        conf = self.workdir / f"{name}.conf"
        conf.write_text(
            "[global]\n"
            f"priority1 {priority1}\n"
            f"logSyncInterval {log_sync_interval}\n"
            "logAnnounceInterval -2\n"
            "logMinDelayReqInterval -3\n"
            "tx_timestamp_timeout 50\n"
        )
        cmd = ["ptp4l", "-S", "-4", "-m", "-i", self.if_master, "-f", str(conf),
               "--uds_address", str(self.workdir / f"{name}.{self.tag}.sock"),
               "--egressLatency", str(offset_ns), "--ingressLatency", str(-offset_ns), *extra]
        return self.spawn(self.ns_master, cmd, f"{name}.log")

    def start_free_running_slave(self, name: str = "refslave") -> subprocess.Popen[bytes]:
        """A second ptp4l slave beside the product; ``--free_running 1`` so it never steers
        the shared host clock. Free running, ptp4l prints one measured "master offset" per
        frequency-estimation interval (``freq_est_interval 0``: once a second)."""
        conf = self.workdir / f"{name}.conf"
        conf.write_text("[global]\nslaveOnly 1\nfree_running 1\nsummary_interval -7\n"
                        "freq_est_interval 0\n"
                        "logMinDelayReqInterval -3\ntx_timestamp_timeout 50\n")
        cmd = ["ptp4l", "-S", "-4", "-m", "-i", self.if_slave, "-f", str(conf),
               "--free_running", "1",
               "--uds_address", str(self.workdir / f"{name}.{self.tag}.sock")]
        return self.spawn(self.ns_slave, cmd, f"{name}.log")

    @staticmethod
    def stop(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def close(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)
        for ns in self._made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        self._made.clear()


class Chrony:
    """chronyd as an NTP server on 127.0.0.1, never touching the clock (``-x``).

    ``offset_s`` 0: serves the host clock (``local stratum 8``). Otherwise a second chronyd
    follows the first with ``offset`` and serves host time + offset_s. Each gets its own port.
    """

    def __init__(self, workdir: Path, base_port: int, offset_s: float = 0.0,
                 netns: list[str] | None = None) -> None:
        self.workdir = workdir
        self.prefix = netns or []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = base_port
        try:
            self._start(base_port, offset_s)
        except BaseException:
            self.close()
            raise

    def _spawn(self, name: str, body: str) -> None:
        conf = self.workdir / f"{name}.conf"
        conf.write_text(body + f"pidfile {self.workdir / name}.pid\ncmdport 0\n"
                        f"driftfile {self.workdir / name}.drift\n")
        log = (self.workdir / f"{name}.log").open("wb")
        self.procs.append(subprocess.Popen(
            [*self.prefix, "chronyd", "-x", "-d", "-f", str(conf)],
            stdout=log, stderr=subprocess.STDOUT))

    def _start(self, base_port: int, offset_s: float) -> None:
        self._spawn("chrony-ref", f"port {base_port}\nbindaddress 127.0.0.1\n"
                    "allow 127.0.0.1\nlocal stratum 8\n")
        if offset_s:
            self.port = base_port + 1
            self._spawn("chrony-off", f"port {self.port}\nbindaddress 127.0.0.1\n"
                        "allow 127.0.0.1\n"
                        f"server 127.0.0.1 port {base_port} iburst minpoll -4 maxpoll -4 "
                        f"offset {offset_s}\n")
        time.sleep(0.2)
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"chronyd exited early ({p.returncode}); see {self.workdir}")

    def close(self) -> None:
        for proc in reversed(self.procs):
            PtpNet.stop(proc)


class PtpLan:
    """Several namespaces on one bridge (in a hub namespace): masters ``m0``, ``m1``, ... and
    the product's namespace ``p`` with interface :attr:`if_slave`. Masters see each other, as
    on a real LAN, and choose among themselves with the BMCA; each runs ``free_running 1`` so a
    master that becomes a slave never steers the shared host clock."""

    def __init__(self, workdir: Path, masters: int) -> None:
        self.tag = "sl" + uuid.uuid4().hex[:6]
        self.workdir = workdir
        self.hub = self.tag + "h"
        self.ns_slave = self.tag + "p"
        self.if_slave = self.tag + "p0"
        self.master_ns = [f"{self.tag}m{i}" for i in range(masters)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self._made: list[str] = []
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        _run("ip", "netns", "add", self.hub)
        self._made.append(self.hub)
        _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.hub, "link", "set", "br0", "up")
        members = [(self.ns_slave, self.if_slave)] + [(ns, ns[-2:] + "0") for ns in
                                                       self.master_ns]
        for i, (ns, ifname) in enumerate(members):
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
            peer = f"{self.tag}y{i}"
            _run("ip", "link", "add", peer, "type", "veth", "peer", "name", f"{self.tag}x{i}")
            _run("ip", "link", "set", f"{self.tag}x{i}", "netns", ns)
            _run("ip", "-n", ns, "link", "set", f"{self.tag}x{i}", "name", ifname)
            _run("ip", "link", "set", peer, "netns", self.hub)
            _run("ip", "-n", self.hub, "link", "set", peer, "master", "br0")
            _run("ip", "-n", self.hub, "link", "set", peer, "up")
            _run("ip", "-n", ns, "addr", "add", f"10.99.1.{i + 1}/24", "dev", ifname)
            _run("ip", "-n", ns, "link", "set", ifname, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "route", "add", "224.0.0.0/4", "dev", ifname)

    def exec_prefix(self, ns: str) -> list[str]:
        return ["ip", "netns", "exec", ns]

    def start_master(self, index: int, offset_ns: int, priority1: int) -> subprocess.Popen[bytes]:
        ns = self.master_ns[index]
        conf = self.workdir / f"m{index}.conf"
        conf.write_text(
            "[global]\n"
            f"priority1 {priority1}\n"
            "free_running 1\n"
            "logSyncInterval -3\nlogAnnounceInterval -2\nlogMinDelayReqInterval -3\n"
            "tx_timestamp_timeout 50\n"
        )
        log = (self.workdir / f"m{index}.log").open("wb")
        proc = subprocess.Popen(
            [*self.exec_prefix(ns), "ptp4l", "-S", "-4", "-m", "-i", ns[-2:] + "0",
             "-f", str(conf), "--free_running", "1",
             "--uds_address", str(self.workdir / f"m{index}.{self.tag}.sock"),
             "--egressLatency", str(offset_ns), "--ingressLatency", str(-offset_ns)],
            stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):
            PtpNet.stop(proc)
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        self._made.clear()
