"""A server process with only the caption component, for kill -9 tests and the benchmark.

``python -m tests.captions.caption_server --port P --data-dir D [--token T]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

from aiohttp import web

from sfu_sidecar.app import Components, build_app
from sfu_sidecar.captions.service import CaptionService
from sfu_sidecar.config import Settings
from sfu_sidecar.metrics import Metrics


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--token", default=None)
    args = parser.parse_args()
    settings = Settings(data_dir=args.data_dir, publish_token=args.token, port=args.port)
    metrics = Metrics()
    app = build_app(settings, Components(metrics, captions=CaptionService(settings, metrics)))
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
