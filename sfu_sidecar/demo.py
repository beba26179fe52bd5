"""The demo: the service plus a synthetic broadcaster with scripted, synced captions."""

from __future__ import annotations

from sfu_sidecar import app, logs
from sfu_sidecar.config import Settings

log = logs.get("demo")


def run_demo(settings: Settings) -> int:
    log.warning(
        "the synthetic broadcaster is not built yet: serving the viewer page only "
        "(open http://%s:%d/)", settings.host, settings.port,
    )
    return app.run(settings)
