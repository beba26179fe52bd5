"""The application with the house clock and the relay, served on a Unix socket.

Run inside a network namespace (``ip netns exec``), a Unix socket is the one way a test in the
root namespace can reach it. Usage: ``clock_server.py UNIX_PATH HOLDOVER_S NTP_POLL_S [flags]``
where flags are the ``sfu-sidecar serve`` settings flags (``--ptp-interface`` ...).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from aiohttp import web

from sfu_sidecar import logs
from sfu_sidecar.app import Components, build_app
from sfu_sidecar.clock.service import ClockService
from sfu_sidecar.config import flags_for_argparse, settings_from_namespace
from sfu_sidecar.metrics import Metrics
from sfu_sidecar.relay import RelayService


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("unix")
    parser.add_argument("holdover_s", type=float)
    parser.add_argument("ntp_poll_s", type=float)
    for flag, kwargs in flags_for_argparse():
        parser.add_argument(flag, **kwargs)
    args = parser.parse_args(argv)
    settings = settings_from_namespace(args, {}, None)
    logs.configure("info", "text")
    metrics = Metrics()
    clock = ClockService(settings, metrics, holdover_s=args.holdover_s,
                         ntp_poll_s=args.ntp_poll_s)
    # The relay takes its time and RFC 7273 lines from the clock, as in the full application.
    relay = RelayService(settings, metrics, now_ns=clock.now_ns,
                         media_clock=clock.sdp_attributes)
    app = build_app(settings, Components(metrics, clock=clock, relay=relay))
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.UnixSite(runner, args.unix)
    await site.start()
    os.chmod(args.unix, 0o666)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    try:  # the event loop `sfu-sidecar serve` runs on, when installed
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    asyncio.run(main(sys.argv[1:]))
