"""Command line: ``sfu-sidecar serve | demo | clock | captions check``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sfu_sidecar import __version__, logs
from sfu_sidecar.config import Settings, flags_for_argparse, settings_from_namespace
from sfu_sidecar.exceptions import ConfigError, StorageUnavailable


def _add_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", type=Path, default=None,
        help="TOML file with settings (keys as in the table below; flags and env win)",
    )
    group = parser.add_argument_group("settings (flag > env SFU_SIDECAR_* > --config file)")
    for flag, kwargs in flags_for_argparse():
        group.add_argument(flag, **kwargs)


def _non_negative(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is below 0")
    return value


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is below 1")
    return value


def without_workers(argv: Sequence[str]) -> list[str]:
    """The serve arguments a worker gets: everything but ``--workers N``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            out.append(arg)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sfu-sidecar",
        description="Packet-level WebRTC relay that ties frames and captions to one house clock.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser("serve", help="run the service", description="Run the service.")
    _add_settings(serve)
    serve.add_argument(
        "--workers", type=_positive, default=None, metavar="N",
        help="run N relay processes behind this one port (one per core; see "
        "docs/deployment.md, 'Workers')",
    )

    demo = sub.add_parser(
        "demo", help="run the service plus a synthetic broadcaster with synced captions",
        description="Run the service with a synthetic broadcaster publishing a flash/beep "
        "pattern and scripted captions, so the viewer page shows synced captions at once.",
    )
    _add_settings(demo)

    clock = sub.add_parser(
        "clock", help="print house clock status live, one line a second (no HTTP server)",
        description="Run the house clock alone and print its status once a second.",
    )
    _add_settings(clock)
    clock.add_argument(
        "--count", type=_non_negative, default=0, metavar="N",
        help="stop after N lines (0: run until ^C)",
    )

    captions = sub.add_parser("captions", help="caption tools")
    captions_sub = captions.add_subparsers(dest="captions_command", metavar="TOOL", required=True)
    check = captions_sub.add_parser(
        "check", help="parse a WebVTT file and print its cues as JSON; exit 1 if invalid",
        description="Parse FILE with the WebVTT parsing algorithm and print "
        '{"cues": [...], "regions": [...]} with VTTCue attribute names. Exit 1 if invalid.',
    )
    check.add_argument("file", type=Path, metavar="FILE")
    return parser


def _settings(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    return settings_from_namespace(args, env, args.config)


@dataclass(frozen=True)
class Invocation:
    """A command line parsed and validated, before anything runs."""

    command: str  # "serve", "demo", "clock" or "captions check"
    args: argparse.Namespace
    settings: Settings | None  # for the commands that take settings
    argv: tuple[str, ...] = ()  # as given, for serve --workers to hand its workers


def prepare(argv: Sequence[str] | None, env: Mapping[str, str] | None = None) -> Invocation:
    """Parse ``argv`` and load every setting; start nothing.

    Bad syntax exits 2 through argparse (usage and reason on stderr); a bad setting raises
    :class:`ConfigError`. Everything a command line can get wrong is found here, so ``main``
    can refuse it before any component starts.
    """
    given = tuple(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(given)
    env = os.environ if env is None else env
    if args.command == "captions":
        return Invocation(f"captions {args.captions_command}", args, None)
    settings = _settings(args, env)
    if args.command in ("serve", "demo") and settings.tls_cert is not None \
            and settings.tls_key is not None:
        # A certificate that will not load, or that browsers would refuse, stops the start here
        # with its reason (exit 2), before any component starts.
        from sfu_sidecar.tls import load_context

        load_context(settings.tls_cert, settings.tls_key, now_s=time.time())
    if getattr(args, "workers", None) is not None:
        from sfu_sidecar.workers import check

        check(settings, args.workers)
    return Invocation(args.command, args, settings, given)


def _execute(invocation: Invocation) -> int:
    args, settings = invocation.args, invocation.settings
    if invocation.command == "captions check":
        from sfu_sidecar.captions.cli import check_file

        return check_file(args.file)
    assert settings is not None
    logs.configure(settings.log_level, settings.log_format)
    if invocation.command == "demo":
        from sfu_sidecar.demo import run_demo

        return run_demo(settings)
    if invocation.command == "clock":
        from sfu_sidecar.clock.cli import run_clock

        return run_clock(settings, count=args.count)
    if args.workers is not None:
        from sfu_sidecar import workers

        serve_args = list(invocation.argv[invocation.argv.index("serve") + 1:])
        return workers.run(settings, args.workers, without_workers(serve_args))
    from sfu_sidecar.app import run  # serve

    return run(settings)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    try:
        invocation = prepare(argv, env)
        return _execute(invocation)
    except ConfigError as exc:
        print(f"sfu-sidecar: configuration error: {exc.reason}", file=sys.stderr)
        return 2
    except StorageUnavailable as exc:
        # Durable storage out of reach at start-up (the Redis server of redis_url): without it
        # there is no state to serve; a supervisor's restart retries.
        print(f"sfu-sidecar: cannot start: {exc.reason}", file=sys.stderr)
        return 1
    except OSError as exc:
        # What the system refuses at start-up (an address in use or not local, a folder that
        # cannot be created): the reason, not a traceback. Logged with it at debug level.
        logs.get("cli").debug("start-up failed", exc_info=True)
        print(f"sfu-sidecar: cannot start: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
