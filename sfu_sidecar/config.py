"""Settings: one typed object, fed by CLI flags, ``SFU_SIDECAR_*`` variables and a TOML file.

Precedence is flag > environment > file > default. Every setting is declared once, as a field of
:class:`Settings`; the CLI flags, the environment names, the TOML keys and the table in
docs/configuration.md are all derived from that declaration, so they cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sfu_sidecar import streamname
from sfu_sidecar.exceptions import ConfigError
from sfu_sidecar.streamname import is_stream_name

ENV_PREFIX = "SFU_SIDECAR_"

RawValue = str | int | float | bool | list[Any]


class _Invalid(ValueError):
    """A value that does not parse; the loader adds where it came from."""


@dataclass(frozen=True)
class PortRange:
    low: int
    high: int

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"


@dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class IceServer:
    """A STUN or TURN server as given to clients (RFC 7064 / RFC 7065 URIs)."""

    url: str
    username: str | None = None
    credential: str | None = None

    def __str__(self) -> str:
        return self.url


# --- value parsers: raw (str from flags/env, native from TOML) -> typed value ----------------


def _as_str(raw: RawValue) -> str:
    if isinstance(raw, str):
        return raw.strip()
    if isinstance(raw, bool | int | float):
        return str(raw)
    raise _Invalid(f"expected a single value, got {type(raw).__name__}")


def _split_list(raw: RawValue) -> list[str]:
    if isinstance(raw, list):
        return [_as_str(item) for item in raw if _as_str(item)]
    return [part.strip() for part in _as_str(raw).split(",") if part.strip()]


def _parse_int(lo: int, hi: int) -> Callable[[RawValue], int]:
    def parse(raw: RawValue) -> int:
        if isinstance(raw, bool):
            raise _Invalid("expected an integer")
        text = _as_str(raw)
        try:
            value = int(text, 10)
        except ValueError:
            raise _Invalid("expected an integer") from None
        if not lo <= value <= hi:
            raise _Invalid(f"must be between {lo} and {hi}")
        return value

    return parse


def _parse_float(lo: float, hi: float) -> Callable[[RawValue], float]:
    def parse(raw: RawValue) -> float:
        if isinstance(raw, bool):
            raise _Invalid("expected a number")
        try:
            value = float(_as_str(raw))
        except ValueError:
            raise _Invalid("expected a number") from None
        if not lo <= value <= hi:
            raise _Invalid(f"must be between {lo:g} and {hi:g}")
        return value

    return parse


def _parse_choice(*choices: str) -> Callable[[RawValue], str]:
    def parse(raw: RawValue) -> str:
        value = _as_str(raw).lower()
        if value not in choices:
            raise _Invalid(f"must be one of {', '.join(choices)}")
        return value

    return parse


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _parse_bool(raw: RawValue) -> bool:
    if isinstance(raw, bool):
        return raw
    value = _as_str(raw).lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise _Invalid("expected true or false")


def _parse_optional_str(raw: RawValue) -> str | None:
    value = _as_str(raw)
    return value or None


def _parse_redis_url(raw: RawValue) -> str | None:
    value = _as_str(raw).strip()
    if not value:
        return None
    if not value.startswith(("redis://", "rediss://", "unix://")):
        raise _Invalid("expected redis://HOST[:PORT][/DB], rediss://... or unix://PATH")
    return value


def _parse_origin_url(raw: RawValue) -> str | None:
    value = _as_str(raw).strip()
    if not value:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _Invalid("expected http(s)://HOST[:PORT] of a sidecar, or a WHEP URL with {stream}")
    if parts.query or parts.fragment:
        raise _Invalid("no query or fragment: the stream's path is made from the URL")
    return value


@dataclass(frozen=True)
class PushTarget:
    """A stream pushed to a WHIP endpoint from startup (setting push_targets)."""

    stream: str
    url: str

    def __str__(self) -> str:
        return f"{self.stream}={self.url}"


def _parse_push_targets(raw: RawValue) -> tuple[PushTarget, ...]:
    out = []
    for item in _split_list(raw):
        stream, sep, url = item.partition("=")
        stream, url = stream.strip(), url.strip()
        if not sep or not is_stream_name(stream):
            raise _Invalid(f"{item!r}: expected STREAM=URL, the stream {streamname.RULE}")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise _Invalid(f"{item!r}: the WHIP endpoint must be an http(s) URL")
        target = PushTarget(stream, url)
        if target in out:
            raise _Invalid(f"{item!r} is given twice")
        out.append(target)
    return tuple(out)


# A node's name (the node_id setting), also as relays name each other in a pull's Via header.
NODE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
NODE_ID_RULE = "1-64 characters of A-Z a-z 0-9 _ . : -"


def _parse_node_id(raw: RawValue) -> str | None:
    value = _as_str(raw).strip()
    if not value:
        return None
    if not NODE_ID.fullmatch(value):
        raise _Invalid(NODE_ID_RULE)
    return value


def _parse_optional_path(raw: RawValue) -> Path | None:
    return _parse_path(raw) if _as_str(raw) else None


def _parse_optional_port(raw: RawValue) -> int | None:
    return _parse_int(1, 65535)(raw) if _as_str(raw) else None


def _parse_path(raw: RawValue) -> Path:
    value = _as_str(raw)
    if not value:
        raise _Invalid("must not be empty")
    if "\x00" in value:
        raise _Invalid("a path cannot contain a NUL character")
    return Path(value)


_HOST_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_.])?")


def _parse_host(raw: RawValue) -> str:
    """An IP address or a host name to bind; empty binds every interface, as in asyncio."""
    value = _as_str(raw)
    if not value:
        return value
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if _HOST_NAME.fullmatch(value) is None:
        raise _Invalid("expected an IP address or a host name")
    return value


def _parse_port_range(raw: RawValue) -> PortRange | None:
    text = _as_str(raw)
    if not text:
        return None
    low_text, sep, high_text = text.partition("-")
    if not sep:
        raise _Invalid("expected LOW-HIGH, e.g. 40000-40100")
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        raise _Invalid("expected LOW-HIGH, e.g. 40000-40100") from None
    if not (1 <= low <= 65535 and 1 <= high <= 65535):
        raise _Invalid("ports must be between 1 and 65535")
    if low > high:
        raise _Invalid("low end above high end")
    return PortRange(low, high)


def _parse_addresses(raw: RawValue) -> tuple[str, ...]:
    out = []
    for item in _split_list(raw):
        try:
            out.append(str(ipaddress.ip_address(item)))
        except ValueError:
            raise _Invalid(f"{item!r} is not an IP address") from None
    return tuple(out)


def _parse_host_ports(default_port: int) -> Callable[[RawValue], tuple[HostPort, ...]]:
    def parse(raw: RawValue) -> tuple[HostPort, ...]:
        out = []
        for item in _split_list(raw):
            host, port = item, default_port
            if item.startswith("["):
                host, _, rest = item[1:].partition("]")
                if rest:
                    if not rest.startswith(":"):
                        raise _Invalid(f"{item!r}: expected [v6addr]:port")
                    port = _parse_int(1, 65535)(rest[1:])
            elif item.count(":") == 1:
                host, port_text = item.split(":")
                try:
                    port = _parse_int(1, 65535)(port_text)
                except _Invalid as exc:
                    raise _Invalid(f"{item!r}: port {exc}") from None
            if not host:
                raise _Invalid(f"{item!r}: empty host")
            out.append(HostPort(host, port))
        return tuple(out)

    return parse


def _parse_ice_servers(raw: RawValue) -> tuple[IceServer, ...]:
    """``stun:host[:port]`` or ``turn[s]:[user:credential@]host[:port][?transport=udp|tcp]``."""
    out = []
    for item in _split_list(raw):
        scheme, sep, rest = item.partition(":")
        scheme = scheme.lower()
        if not sep or scheme not in ("stun", "stuns", "turn", "turns") or not rest:
            raise _Invalid(f"{item!r}: expected stun:HOST[:PORT] or turn:[USER:PASS@]HOST[:PORT]")
        rest = rest.removeprefix("//")
        username = credential = None
        if "@" in rest:
            if scheme.startswith("stun"):
                raise _Invalid(f"{item!r}: STUN URLs take no credentials")
            userinfo, _, rest = rest.rpartition("@")
            username, colon, credential = userinfo.partition(":")
            if not colon or not username:
                raise _Invalid(f"{item!r}: credentials must be USER:PASS")
        hostport, _, query = rest.partition("?")
        if query:
            transports = parse_qs(query).get("transport", [])
            if scheme.startswith("stun") or transports not in (["udp"], ["tcp"]):
                raise _Invalid(f"{item!r}: only ?transport=udp|tcp is allowed, on TURN URLs")
        if not hostport:
            raise _Invalid(f"{item!r}: empty host")
        url = f"{scheme}:{hostport}" + (f"?{query}" if query else "")
        if scheme.startswith("turn") and username is None:
            raise _Invalid(f"{item!r}: TURN needs USER:PASS@ credentials")
        out.append(IceServer(url=url, username=username, credential=credential))
    return tuple(out)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _parse_origins(raw: RawValue) -> tuple[str, ...]:
    """``*`` alone, or web origins ``scheme://host[:port]`` as browsers send them in ``Origin``."""
    items = _split_list(raw)
    if "*" in items:
        if len(items) > 1:
            raise _Invalid("'*' already allows every origin; give it alone")
        return ("*",)
    out = []
    for item in items:
        parts = urlsplit(item)
        try:
            port = parts.port
        except ValueError:
            raise _Invalid(f"{item!r}: bad port") from None
        if (
            parts.scheme not in _DEFAULT_PORTS
            or not parts.hostname
            or parts.username is not None
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
        ):
            raise _Invalid(f"{item!r}: expected an origin such as https://app.example:8443")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        # Browsers serialize an origin lower-case and without its scheme's default port
        # (RFC 6454 6.2), so compare against that form.
        if port is not None and port != _DEFAULT_PORTS[parts.scheme]:
            host += f":{port}"
        out.append(f"{parts.scheme}://{host}")
    return tuple(dict.fromkeys(out))


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

    host: str = _setting("0.0.0.0", _parse_host, "address the HTTP server binds", metavar="ADDR")
    port: int = _setting(
        8080, _parse_int(1, 65535), "HTTP port (HTTPS when tls_cert is set and https_port is not)",
        metavar="PORT",
    )
    tls_cert: Path | None = _setting(
        None, _parse_optional_path,
        "PEM certificate, with its chain, to serve HTTPS with (needs tls_key); a new file is "
        "picked up within 2 s, without a restart", metavar="FILE",
    )
    tls_key: Path | None = _setting(
        None, _parse_optional_path, "PEM private key of tls_cert, unencrypted", metavar="FILE",
    )
    https_port: int | None = _setting(
        None, _parse_optional_port,
        "with tls_cert: serve HTTPS on this port and plain HTTP on port (unset: HTTPS alone, on "
        "port)", metavar="PORT",
    )
    hsts_max_age_s: int = _setting(
        0, _parse_int(0, 63072000),
        "Strict-Transport-Security max-age sent with HTTPS responses (0: no header; browsers "
        "then refuse plain HTTP to this host for that long)", metavar="SECONDS",
    )
    data_dir: Path = _setting(
        Path("data"), _parse_path, "folder for durable state (caption store)", metavar="DIR"
    )
    log_level: str = _setting(
        "info", _parse_choice("debug", "info", "warning", "error"), "log threshold",
        metavar="LEVEL",
    )
    log_format: str = _setting(
        "text", _parse_choice("text", "json"), "log line format: text or json", metavar="FMT"
    )
    publish_token: str | None = _setting(
        None, _parse_optional_str, "Bearer token required for WHIP publish and caption ingest",
        metavar="TOKEN", secret=True,
    )
    view_token: str | None = _setting(
        None, _parse_optional_str, "Bearer token required for WHEP viewing (open when unset)",
        metavar="TOKEN", secret=True,
    )
    cors_origins: tuple[str, ...] = _setting(
        (), _parse_origins,
        "web origins allowed to publish, view and ingest from a browser, comma-separated, "
        "or * for any (when unset only read-only GETs are open cross-origin)",
        metavar="ORIGINS",
    )
    ice_addresses: tuple[str, ...] = _setting(
        (), _parse_addresses,
        "IP addresses announced in ICE candidates, comma-separated (NAT, containers, loopback)",
        metavar="IPS",
    )
    ice_port_range: PortRange | None = _setting(
        None, _parse_port_range, "UDP port range for ICE, LOW-HIGH (any port when unset)",
        metavar="LOW-HIGH",
    )
    ice_servers: tuple[IceServer, ...] = _setting(
        (), _parse_ice_servers,
        "STUN/TURN servers for clients, comma-separated: stun:HOST[:PORT], "
        "turn:USER:PASS@HOST[:PORT][?transport=udp]",
        metavar="URLS", secret=True,
    )
    max_body_bytes: int = _setting(
        262144, _parse_int(1024, 64 * 1024 * 1024), "largest accepted request body (SDP, cues)",
        metavar="BYTES",
    )
    open_ingest: bool = _setting(
        False, _parse_bool,
        "accept publishing, caption ingest and GPU reports from other hosts without "
        "publish_token (when false and no token is set, only this host may)",
        metavar="BOOL",
    )
    max_viewers: int = _setting(
        150, _parse_int(1, 100000),
        "viewer sessions in this process; more are refused with 503", metavar="N",
    )
    max_cpu_percent: float = _setting(
        80.0, _parse_float(1.0, 1000.0),
        "new viewers are refused with 503 while this process uses more than this share of "
        "one core (smoothed over 2 s), so those watching keep their full frame rate",
        metavar="PERCENT",
    )
    max_viewers_per_stream: int = _setting(
        150, _parse_int(1, 100000),
        "viewer sessions on one stream; more are refused with 429", metavar="N",
    )
    max_sessions_per_client: int = _setting(
        64, _parse_int(1, 100000),
        "WHIP and WHEP sessions from one client address (IPv6 by /64); more are refused "
        "with 429", metavar="N",
    )
    max_sdp_bytes: int = _setting(
        65536, _parse_int(1024, 16 * 1024 * 1024),
        "largest SDP offer or trickle fragment, in bytes", metavar="BYTES",
    )
    max_sdp_lines: int = _setting(
        2000, _parse_int(10, 100000), "most lines in an SDP offer or trickle fragment",
        metavar="N",
    )
    max_cues_per_request: int = _setting(
        500, _parse_int(1, 100000),
        "most cues in one caption ingest request or WebSocket message", metavar="N",
    )
    max_cues_per_s: float = _setting(
        100.0, _parse_float(0.01, 1e6),
        "cues ingested per second per stream on average (bursts up to max_cues_per_request); "
        "more are refused with 429", metavar="RATE",
    )
    ws_max_message_bytes: int = _setting(
        65536, _parse_int(256, 64 * 1024 * 1024),
        "largest WebSocket message (caption ingest; the clock and dashboard sockets take at "
        "most 4096)", metavar="BYTES",
    )
    ws_messages_per_s: float = _setting(
        50.0, _parse_float(0.01, 1e6),
        "WebSocket messages per second from one peer (bursts up to twice that); more are "
        "dropped, and a peer that keeps on is closed with 1008", metavar="RATE",
    )
    channel_messages_per_s: float = _setting(
        20.0, _parse_float(0.01, 1e6),
        "DataChannel messages per second accepted from one peer (bursts up to twice that); "
        "more are dropped", metavar="RATE",
    )
    publisher_timeout_s: float = _setting(
        10.0, _parse_float(1.0, 3600.0),
        "seconds without media before a publisher counts as gone", metavar="SECONDS",
    )
    session_connect_timeout_s: float = _setting(
        30.0, _parse_float(1.0, 3600.0),
        "seconds a WHIP or WHEP session may take to connect (ICE and DTLS) before it is dropped",
        metavar="SECONDS",
    )
    ice_consent_timeout_s: float = _setting(
        30.0, _parse_float(1.0, 3600.0),
        "seconds without an answer to ICE consent checks before a connected peer counts as "
        "gone (RFC 7675; checked six times per period)", metavar="SECONDS",
    )
    ptp_interface: str | None = _setting(
        None, _parse_optional_str, "network interface for the PTPv2 slave (PTP off when unset)",
        metavar="IFACE",
    )
    ptp_domain: int = _setting(0, _parse_int(0, 255), "PTP domain number", metavar="N")
    ntp_servers: tuple[HostPort, ...] = _setting(
        (), _parse_host_ports(123), "NTP servers, comma-separated HOST[:PORT]", metavar="SERVERS"
    )
    clock_max_slew_ppm: float = _setting(
        500.0, _parse_float(1.0, 100000.0),
        "largest slew of house time after the first lock, in ppm", metavar="PPM",
    )
    caption_chunk_s: float = _setting(
        2.0, _parse_float(0.5, 60.0), "duration of one WebVTT chunk in seconds", metavar="SECONDS"
    )
    caption_retention_s: float = _setting(
        86400.0, _parse_float(60.0, 10 * 365 * 86400.0),
        "how long stored cues are kept, in seconds", metavar="SECONDS",
    )
    caption_playlist_chunks: int = _setting(
        15, _parse_int(3, 10000), "chunks listed in the live HLS subtitle playlist",
        metavar="N",
    )
    segment_duration_s: float = _setting(
        1.0, _parse_float(0.2, 30.0),
        "target duration of one live media segment in seconds (segments start on keyframes)",
        metavar="SECONDS",
    )
    segment_part_s: float = _setting(
        0.2, _parse_float(0.02, 30.0),
        "a segment is muxed in parts of this many seconds, and its open segment is served part "
        "by part as they are made (chunked transfer, for low latency)",
        metavar="SECONDS",
    )
    segment_window: int = _setting(
        10, _parse_int(2, 1000), "closed live media segments kept in memory per stream",
        metavar="N",
    )
    segment_idle_s: float = _setting(
        30.0, _parse_float(1.0, 3600.0),
        "seconds without a request before a stream's live segmenting stops", metavar="SECONDS",
    )
    speech_detect: bool = _setting(
        True, _parse_bool,
        "decode publishers' Opus audio (never re-encoded) to find speech on the capture "
        "timeline and measure each caption's lag to the voice it captions",
        metavar="BOOL",
    )
    caption_align: str = _setting(
        "report", _parse_choice("off", "report", "snap"),
        "captions against the voice heard in the stream (with speech_detect): report measures "
        "each final cue's lag to the speech it captions; snap also moves a cue within "
        "caption_align_max_ms of its speech onto it (duration kept, the shift recorded on "
        "the cue; cues posted with fixed: true are never moved); off measures nothing",
        metavar="MODE",
    )
    caption_align_max_ms: int = _setting(
        1000, _parse_int(1, 2500),
        "snap moves a cue only this far at most (a farther match is reported, not trusted "
        "enough to move captions by)", metavar="MS",
    )
    redis_url: str | None = _setting(
        None, _parse_redis_url,
        "Redis server for the caption store, redis://[:PASSWORD@]HOST[:PORT][/DB] (nodes on one "
        "Redis share captions; the SQLite file in data_dir when unset)",
        metavar="URL", secret=True,
    )
    redis_allow_unsafe_persistence: bool = _setting(
        False, _parse_bool,
        "start even when the Redis server would lose acknowledged cues on a crash (appendonly "
        "not yes or appendfsync not always)",
        metavar="BOOL",
    )

    origin_url: str | None = _setting(
        None, _parse_origin_url,
        "upstream to pull streams from that have no publisher here (this node is then an "
        "edge): a sidecar's http(s)://HOST[:PORT], or any WHEP server's URL with {stream}",
        metavar="URL",
    )
    origin_token: str | None = _setting(
        None, _parse_optional_str, "Bearer token for viewing on the upstream (origin_url)",
        metavar="TOKEN", secret=True,
    )
    advertise_url: str | None = _setting(
        None, _parse_origin_url,
        "this node's http(s)://HOST[:PORT] as other nodes reach it; with redis_url its "
        "published streams are listed in the shared stream directory, so any node can pull them",
        metavar="URL",
    )
    directory_url: str | None = _setting(
        None, _parse_origin_url,
        "stream directory over HTTP: GET URL/streams/STREAM names the node a stream is "
        "published on (serve --workers sets it for its workers)", metavar="URL",
    )
    proxy_key: str | None = _setting(
        None, _parse_optional_str,
        "requests bearing this key in Sidecar-Proxy-Key come from a trusted proxy, and the "
        "client address in Sidecar-Client is used (serve --workers sets it for its workers)",
        metavar="KEY", secret=True,
    )
    node_id: str | None = _setting(
        None, _parse_node_id,
        "this node's name in a cascade, sent upstream to refuse loops (random at start when "
        "unset)", metavar="NAME",
    )
    cascade_linger_s: float = _setting(
        10.0, _parse_float(0.0, 3600.0),
        "seconds a pull from origin_url keeps running after its last viewer left",
        metavar="SECONDS",
    )
    push_targets: tuple[PushTarget, ...] = _setting(
        (), _parse_push_targets,
        "streams to forward to WHIP endpoints from startup, comma-separated STREAM=URL pairs "
        "(each waits for its stream's publisher and reconnects with backoff)",
        metavar="PAIRS",
    )
    push_token: str | None = _setting(
        None, _parse_optional_str,
        "Bearer token sent to the WHIP endpoints of push_targets (not to pushes made over the "
        "API, which bring their own)", metavar="TOKEN", secret=True,
    )
    demo_source: str = _setting(
        "speech", _parse_choice("speech", "beep"),
        "what the demo publishes: speech (a presenter's sentences spoken by espeak-ng, one "
        "caption per sentence) or beep (a flash and a beep every second, a caption on each "
        "flash: the pattern A/V skew is measured with)", metavar="SOURCE",
    )
    demo_caption_offset_ms: int = _setting(
        -400, _parse_int(-5000, 5000),
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
            # _Invalid, and the ValueError a library parser (urlsplit, ipaddress, int) raises
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
