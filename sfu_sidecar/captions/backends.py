"""Which caption store the settings name: one SQLite file per node, or Redis shared by several
nodes (an optional extra, imported only when named)."""

from __future__ import annotations

from collections.abc import Callable

from sfu_sidecar.captions.store import CueStore, SqliteCueStore
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import ConfigError


def store_for(settings: Settings, on_commit: Callable[[int, float], None]) -> CueStore:
    """The store the settings name: Redis when ``redis_url`` is set, else SQLite in data_dir."""
    if settings.redis_url is not None:
        # Imported only here: the redis package is an optional extra.
        try:
            from sfu_sidecar.captions.redis_store import RedisCueStore
        except ImportError as exc:
            raise ConfigError(
                f"redis_url is set but the redis package is missing ({exc}); install "
                "the extra: pip install 'sfu-sidecar[redis]'"
            ) from None

        return RedisCueStore(
            settings.redis_url,
            allow_unsafe_persistence=settings.redis_allow_unsafe_persistence,
            on_commit=on_commit,
        )
    return SqliteCueStore(settings.data_dir, on_commit=on_commit)
