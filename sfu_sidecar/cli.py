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
    except ConfigError as exc:
        print(f"sfu-sidecar: configuration error: {exc.reason}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    parser.error(f"unknown command {args.command}")
    return 2
