"""Command line: ``sfu-sidecar serve | demo | clock | captions check``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from sfu_sidecar import __version__, logs
from sfu_sidecar.config import Settings, flags_for_argparse, settings_from_namespace
from sfu_sidecar.exceptions import ConfigError


def _add_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", type=Path, default=None,
        help="TOML file with settings (keys as in the table below; flags and env win)",
    )
    group = parser.add_argument_group("settings (flag > env SFU_SIDECAR_* > --config file)")
    for flag, kwargs in flags_for_argparse():
        group.add_argument(flag, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sfu-sidecar",
        description="Packet-level WebRTC relay that ties frames and captions to one house clock.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser("serve", help="run the service", description="Run the service.")
    _add_settings(serve)

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
        "--count", type=int, default=0, metavar="N", help="stop after N lines (0: run until ^C)"
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


def _settings(args: argparse.Namespace) -> Settings:
    return settings_from_namespace(args, os.environ, args.config)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command in ("serve", "demo"):
            settings = _settings(args)
            logs.configure(settings.log_level, settings.log_format)
            if args.command == "demo":
                from sfu_sidecar.demo import run_demo

                return run_demo(settings)
            from sfu_sidecar.app import run

            return run(settings)
        if args.command == "clock":
            settings = _settings(args)
            logs.configure(settings.log_level, settings.log_format)
            from sfu_sidecar.clock.cli import run_clock

            return run_clock(settings, count=args.count)
        if args.command == "captions" and args.captions_command == "check":
            from sfu_sidecar.captions.cli import check_file

            return check_file(args.file)
    except ConfigError as exc:
        print(f"sfu-sidecar: configuration error: {exc.reason}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    parser.error(f"unknown command {args.command}")
    return 2
