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
    # Kill tests and the benchmark drive ingest as fast as it goes: no per-stream cue rate.
    settings = Settings(data_dir=args.data_dir, publish_token=args.token, port=args.port,
                        max_cues_per_s=1e6)
    metrics = Metrics()
    app = build_app(settings, Components(metrics, captions=CaptionService(settings, metrics)))
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
