"""Settings: one typed object, fed by CLI flags, ``SFU_SIDECAR_*`` variables and a TOML file.

Precedence is flag > environment > file > default. Every setting is declared once, as a field of
:class:`Settings`; the CLI flags, the environment names, the TOML keys and the table in
docs/configuration.md are all derived from that declaration, so they cannot drift apart. Each
kind of value and its parser is in :mod:`sfu_sidecar.settingvalues`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sfu_sidecar.exceptions import ConfigError
from sfu_sidecar.settingvalues import (
    HostPort,
    IceServer,
    PortRange,
    PushTarget,
    RawValue,
    parse_addresses,
    parse_bool,
    parse_choice,
    parse_float,
    parse_host,
    parse_host_ports,
    parse_ice_servers,
    parse_int,
    parse_node_id,
    parse_optional_path,
    parse_optional_port,
    parse_optional_str,
    parse_origin_url,
    parse_origins,
    parse_path,
    parse_port_range,
    parse_push_targets,
    parse_redis_url,
)

ENV_PREFIX = "SFU_SIDECAR_"

def _setting(
    default: Any,
    parse: Callable[[RawValue], Any],
    help: str,
    *,
    metavar: str,
    secret: bool = False,
) -> Any:
    return field(
        default=default,
        metadata={"parse": parse, "help": help, "metavar": metavar, "secret": secret},
    )


@dataclass(frozen=True)
class Settings:
    """Every knob of the service. Build with :func:`load_settings`, never field by field."""

    host: str = _setting("0.0.0.0", parse_host, "address the HTTP server binds", metavar="ADDR")
    port: int = _setting(
        8080, parse_int(1, 65535), "HTTP port (HTTPS when tls_cert is set and https_port is not)",
        metavar="PORT",
    )
    tls_cert: Path | None = _setting(
        None, parse_optional_path,
        "PEM certificate, with its chain, to serve HTTPS with (needs tls_key); a new file is "
        "picked up within 2 s, without a restart", metavar="FILE",
    )
    tls_key: Path | None = _setting(
        None, parse_optional_path, "PEM private key of tls_cert, unencrypted", metavar="FILE",
    )
    https_port: int | None = _setting(
        None, parse_optional_port,
        "with tls_cert: serve HTTPS on this port and plain HTTP on port (unset: HTTPS alone, on "
        "port)", metavar="PORT",
    )
    hsts_max_age_s: int = _setting(
        0, parse_int(0, 63072000),
        "Strict-Transport-Security max-age sent with HTTPS responses (0: no header; browsers "
        "then refuse plain HTTP to this host for that long)", metavar="SECONDS",
    )
    data_dir: Path = _setting(
        Path("data"), parse_path, "folder for durable state (caption store)", metavar="DIR"
    )
    log_level: str = _setting(
        "info", parse_choice("debug", "info", "warning", "error"), "log threshold",
        metavar="LEVEL",
    )
    log_format: str = _setting(
        "text", parse_choice("text", "json"), "log line format: text or json", metavar="FMT"
    )
    publish_token: str | None = _setting(
        None, parse_optional_str, "Bearer token required for WHIP publish and caption ingest",
        metavar="TOKEN", secret=True,
    )
    view_token: str | None = _setting(
        None, parse_optional_str, "Bearer token required for WHEP viewing (open when unset)",
        metavar="TOKEN", secret=True,
    )
    cors_origins: tuple[str, ...] = _setting(
        (), parse_origins,
        "web origins allowed to publish, view and ingest from a browser, comma-separated, "
        "or * for any (when unset only read-only GETs are open cross-origin)",
        metavar="ORIGINS",
    )
    ice_addresses: tuple[str, ...] = _setting(
        (), parse_addresses,
        "IP addresses announced in ICE candidates, comma-separated (NAT, containers, loopback)",
        metavar="IPS",
    )
    ice_port_range: PortRange | None = _setting(
        None, parse_port_range, "UDP port range for ICE, LOW-HIGH (any port when unset)",
        metavar="LOW-HIGH",
    )
    ice_servers: tuple[IceServer, ...] = _setting(
        (), parse_ice_servers,
        "STUN/TURN servers for clients, comma-separated: stun:HOST[:PORT], "
        "turn:USER:PASS@HOST[:PORT][?transport=udp]",
        metavar="URLS", secret=True,
    )
    max_body_bytes: int = _setting(
        262144, parse_int(1024, 64 * 1024 * 1024), "largest accepted request body (SDP, cues)",
        metavar="BYTES",
    )
    open_ingest: bool = _setting(
        False, parse_bool,
        "accept publishing, caption ingest and GPU reports from other hosts without "
        "publish_token (when false and no token is set, only this host may)",
        metavar="BOOL",
    )
    max_viewers: int = _setting(
        150, parse_int(1, 100000),
        "viewer sessions in this process; more are refused with 503", metavar="N",
    )
    max_cpu_percent: float = _setting(
        80.0, parse_float(1.0, 1000.0),
        "new viewers are refused with 503 while this process uses more than this share of "
        "one core (smoothed over 2 s), so those watching keep their full frame rate",
        metavar="PERCENT",
    )
    max_viewers_per_stream: int = _setting(
        150, parse_int(1, 100000),
        "viewer sessions on one stream; more are refused with 429", metavar="N",
    )
    max_sessions_per_client: int = _setting(
        64, parse_int(1, 100000),
        "WHIP and WHEP sessions from one client address (IPv6 by /64); more are refused "
        "with 429", metavar="N",
    )
    max_sdp_bytes: int = _setting(
        65536, parse_int(1024, 16 * 1024 * 1024),
        "largest SDP offer or trickle fragment, in bytes", metavar="BYTES",
    )
    max_sdp_lines: int = _setting(
        2000, parse_int(10, 100000), "most lines in an SDP offer or trickle fragment",
        metavar="N",
    )
    max_cues_per_request: int = _setting(
        500, parse_int(1, 100000),
        "most cues in one caption ingest request or WebSocket message", metavar="N",
    )
    max_cues_per_s: float = _setting(
        100.0, parse_float(0.01, 1e6),
        "cues ingested per second per stream on average (bursts up to max_cues_per_request); "
        "more are refused with 429", metavar="RATE",
    )
    ws_max_message_bytes: int = _setting(
        65536, parse_int(256, 64 * 1024 * 1024),
        "largest WebSocket message (caption ingest; the clock and dashboard sockets take at "
        "most 4096)", metavar="BYTES",
    )
    ws_messages_per_s: float = _setting(
        50.0, parse_float(0.01, 1e6),
        "WebSocket messages per second from one peer (bursts up to twice that); more are "
        "dropped, and a peer that keeps on is closed with 1008", metavar="RATE",
    )
    channel_messages_per_s: float = _setting(
        20.0, parse_float(0.01, 1e6),
        "DataChannel messages per second accepted from one peer (bursts up to twice that); "
        "more are dropped", metavar="RATE",
    )
    publisher_timeout_s: float = _setting(
        10.0, parse_float(1.0, 3600.0),
        "seconds without media before a publisher counts as gone", metavar="SECONDS",
    )
    session_connect_timeout_s: float = _setting(
        30.0, parse_float(1.0, 3600.0),
        "seconds a WHIP or WHEP session may take to connect (ICE and DTLS) before it is dropped",
        metavar="SECONDS",
    )
    ice_consent_timeout_s: float = _setting(
        30.0, parse_float(1.0, 3600.0),
        "seconds without an answer to ICE consent checks before a connected peer counts as "
        "gone (RFC 7675; checked six times per period)", metavar="SECONDS",
    )
    ptp_interface: str | None = _setting(
        None, parse_optional_str, "network interface for the PTPv2 slave (PTP off when unset)",
        metavar="IFACE",
    )
    ptp_domain: int = _setting(0, parse_int(0, 255), "PTP domain number", metavar="N")
    ntp_servers: tuple[HostPort, ...] = _setting(
        (), parse_host_ports(123), "NTP servers, comma-separated HOST[:PORT]", metavar="SERVERS"
    )
    clock_max_slew_ppm: float = _setting(
        500.0, parse_float(1.0, 100000.0),
        "largest slew of house time after the first lock, in ppm", metavar="PPM",
    )
    caption_chunk_s: float = _setting(
        2.0, parse_float(0.5, 60.0), "duration of one WebVTT chunk in seconds", metavar="SECONDS"
    )
    caption_retention_s: float = _setting(
        86400.0, parse_float(60.0, 10 * 365 * 86400.0),
        "how long stored cues are kept, in seconds", metavar="SECONDS",
    )
    caption_playlist_chunks: int = _setting(
        15, parse_int(3, 10000), "chunks listed in the live HLS subtitle playlist",
        metavar="N",
    )
    segment_duration_s: float = _setting(
        1.0, parse_float(0.2, 30.0),
        "target duration of one live media segment in seconds (segments start on keyframes)",
        metavar="SECONDS",
    )
    segment_part_s: float = _setting(
        0.2, parse_float(0.02, 30.0),
        "a segment is muxed in parts of this many seconds, and its open segment is served part "
        "by part as they are made (chunked transfer, for low latency)",
        metavar="SECONDS",
    )
    segment_window: int = _setting(
        10, parse_int(2, 1000), "closed live media segments kept in memory per stream",
        metavar="N",
    )
    segment_idle_s: float = _setting(
        30.0, parse_float(1.0, 3600.0),
        "seconds without a request before a stream's live segmenting stops", metavar="SECONDS",
    )
    speech_detect: bool = _setting(
        True, parse_bool,
        "decode publishers' Opus audio (never re-encoded) to find speech on the capture "
        "timeline and measure each caption's lag to the voice it captions",
        metavar="BOOL",
    )
    caption_align: str = _setting(
        "report", parse_choice("off", "report", "snap"),
        "captions against the voice heard in the stream (with speech_detect): report measures "
        "each final cue's lag to the speech it captions; snap also moves a cue within "
        "caption_align_max_ms of its speech onto it (duration kept, the shift recorded on "
        "the cue; cues posted with fixed: true are never moved); off measures nothing",
        metavar="MODE",
    )
    caption_align_max_ms: int = _setting(
        1000, parse_int(1, 2500),
        "snap moves a cue only this far at most (a farther match is reported, not trusted "
        "enough to move captions by)", metavar="MS",
    )
    redis_url: str | None = _setting(
        None, parse_redis_url,
        "Redis server for the caption store, redis://[:PASSWORD@]HOST[:PORT][/DB] (nodes on one "
        "Redis share captions; the SQLite file in data_dir when unset)",
        metavar="URL", secret=True,
    )
    redis_allow_unsafe_persistence: bool = _setting(
        False, parse_bool,
        "start even when the Redis server would lose acknowledged cues on a crash (appendonly "
        "not yes or appendfsync not always)",
        metavar="BOOL",
    )

    origin_url: str | None = _setting(
        None, parse_origin_url,
        "upstream to pull streams from that have no publisher here (this node is then an "
        "edge): a sidecar's http(s)://HOST[:PORT], or any WHEP server's URL with {stream}",
        metavar="URL",
    )
    origin_token: str | None = _setting(
        None, parse_optional_str, "Bearer token for viewing on the upstream (origin_url)",
        metavar="TOKEN", secret=True,
    )
    advertise_url: str | None = _setting(
        None, parse_origin_url,
        "this node's http(s)://HOST[:PORT] as other nodes reach it; with redis_url its "
        "published streams are listed in the shared stream directory, so any node can pull them",
        metavar="URL",
    )
    directory_url: str | None = _setting(
        None, parse_origin_url,
        "stream directory over HTTP: GET URL/streams/STREAM names the node a stream is "
        "published on (serve --workers sets it for its workers)", metavar="URL",
    )
    proxy_key: str | None = _setting(
        None, parse_optional_str,
        "requests bearing this key in Sidecar-Proxy-Key come from a trusted proxy, and the "
        "client address in Sidecar-Client is used (serve --workers sets it for its workers)",
        metavar="KEY", secret=True,
    )
    node_id: str | None = _setting(
        None, parse_node_id,
        "this node's name in a cascade, sent upstream to refuse loops (random at start when "
        "unset)", metavar="NAME",
    )
    cascade_linger_s: float = _setting(
        10.0, parse_float(0.0, 3600.0),
        "seconds a pull from origin_url keeps running after its last viewer left",
        metavar="SECONDS",
    )
    push_targets: tuple[PushTarget, ...] = _setting(
        (), parse_push_targets,
        "streams to forward to WHIP endpoints from startup, comma-separated STREAM=URL pairs "
        "(each waits for its stream's publisher and reconnects with backoff)",
        metavar="PAIRS",
    )
    push_token: str | None = _setting(
        None, parse_optional_str,
        "Bearer token sent to the WHIP endpoints of push_targets (not to pushes made over the "
        "API, which bring their own)", metavar="TOKEN", secret=True,
    )
    demo_source: str = _setting(
        "speech", parse_choice("speech", "beep"),
        "what the demo publishes: speech (a presenter's sentences spoken by espeak-ng, one "
        "caption per sentence) or beep (a flash and a beep every second, a caption on each "
        "flash: the pattern A/V skew is measured with)", metavar="SOURCE",
    )
    demo_caption_offset_ms: int = _setting(
        -400, parse_int(-5000, 5000),
        "where the speech demo starts and ends each caption against its sentence's true onset "
        "and end, in ms (negative: early, as TTS pipelines often are; 0: true captions)",
        metavar="MS",
    )

    def __post_init__(self) -> None:
        # Settings that only make sense together, checked once whichever source gave them.
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert and tls_key are given together (HTTPS needs both)")
        if self.tls_cert is None and self.https_port is not None:
            raise ConfigError("https_port needs tls_cert and tls_key")
        if self.https_port is not None and self.https_port == self.port:
            raise ConfigError("https_port must differ from port (unset it to serve HTTPS on "
                              "port)")
        if self.tls_cert is None and self.hsts_max_age_s:
            raise ConfigError("hsts_max_age_s needs HTTPS (tls_cert and tls_key)")

    def redacted(self) -> dict[str, str]:
        """Settings as strings for logs and status pages, secrets masked."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata["secret"] and value:
                out[f.name] = "***"
            else:
                out[f.name] = format_value(value)
        return out


def format_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def setting_fields() -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(Settings)


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def read_config_file(path: Path) -> dict[str, RawValue]:
    if "\x00" in str(path):
        raise ConfigError("--config: a file name cannot contain a NUL character")
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path}: not valid TOML: not UTF-8 text") from None
    except (ValueError, RecursionError) as exc:
        # TOMLDecodeError, and what tomllib lets through from below it: int()'s digit limit
        # on a huge integer, the interpreter's recursion limit on arrays nested thousands deep.
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ConfigError(f"--config {path}: not valid TOML: {reason}") from None
    # Accept keys either at top level or under [sfu_sidecar], so one file can hold other tools.
    section = data.get("sfu_sidecar", data)
    if not isinstance(section, dict):
        raise ConfigError(f"--config {path}: [sfu_sidecar] must be a table")
    known = {f.name for f in setting_fields()}
    unknown = sorted(set(section) - known - {"sfu_sidecar"})
    if unknown:
        raise ConfigError(f"--config {path}: unknown key(s): {', '.join(unknown)}")
    return {k: v for k, v in section.items() if k in known}


def load_settings(
    flags: Mapping[str, str | None] | None = None,
    env: Mapping[str, str] | None = None,
    config_path: Path | None = None,
) -> Settings:
    """Merge the three sources by precedence and validate every value once.

    ``flags`` maps field names to the raw strings given on the command line (None = not given).
    """
    flags = flags or {}
    env = env or {}
    file_values = read_config_file(config_path) if config_path is not None else {}
    values: dict[str, Any] = {}
    for f in setting_fields():
        raw: RawValue | None
        flag_raw = flags.get(f.name)
        if flag_raw is not None:
            raw, origin = flag_raw, f"{flag_name(f.name)} {flag_raw}"
        elif env_name(f.name) in env:
            raw = env[env_name(f.name)]
            origin = f"{env_name(f.name)}={raw}"
        elif f.name in file_values:
            raw = file_values[f.name]
            origin = f"{config_path}: {f.name} = {raw!r}"
        else:
            continue
        try:
            values[f.name] = f.metadata["parse"](raw)
        except ValueError as exc:
            # InvalidValue, and the ValueError a library parser (urlsplit, ipaddress, int) raises
            # for text it refuses: either way the value is bad, never the program.
            raise ConfigError(f"{origin}: {exc}") from None
    return Settings(**values)


def settings_table_markdown() -> str:
    """The configuration table of docs/configuration.md, derived from :class:`Settings`."""
    rows = [
        "| setting (TOML key) | flag | environment | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for f in setting_fields():
        default = format_value(f.default) or "(unset)"
        rows.append(
            f"| `{f.name}` | `{flag_name(f.name)} {f.metadata['metavar']}` | "
            f"`{env_name(f.name)}` | `{default}` | {f.metadata['help']} |"
        )
    return "\n".join(rows) + "\n"


def settings_from_namespace(
    namespace: Any, env: Mapping[str, str], config_path: Path | None
) -> Settings:
    flags = {f.name: getattr(namespace, f.name, None) for f in setting_fields()}
    return load_settings(flags, env, config_path)


def flags_for_argparse() -> Sequence[tuple[str, dict[str, Any]]]:
    """(flag, argparse kwargs) for every setting; values stay raw strings until load_settings."""
    out = []
    for f in setting_fields():
        default = format_value(f.default) or "unset"
        out.append(
            (
                flag_name(f.name),
                {
                    "dest": f.name,
                    "metavar": f.metadata["metavar"],
                    "default": None,
                    "help": f"{f.metadata['help']} [env {env_name(f.name)}; default {default}]",
                },
            )
        )
    return out
