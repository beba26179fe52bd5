"""The kinds of value a setting takes, and their parsers: each takes what a flag, an
``SFU_SIDECAR_*`` variable or a TOML key gave and returns the typed value, or raises
:class:`InvalidValue` with the reason (the loader in ``config.py`` adds where it came from).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sfu_sidecar import streamname
from sfu_sidecar.streamname import is_stream_name

RawValue = str | int | float | bool | list[Any]


class InvalidValue(ValueError):
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


def as_str(raw: RawValue) -> str:
    if isinstance(raw, str):
        return raw.strip()
    if isinstance(raw, bool | int | float):
        return str(raw)
    raise InvalidValue(f"expected a single value, got {type(raw).__name__}")


def split_list(raw: RawValue) -> list[str]:
    if isinstance(raw, list):
        return [as_str(item) for item in raw if as_str(item)]
    return [part.strip() for part in as_str(raw).split(",") if part.strip()]


def parse_int(lo: int, hi: int) -> Callable[[RawValue], int]:
    def parse(raw: RawValue) -> int:
        if isinstance(raw, bool):
            raise InvalidValue("expected an integer")
        text = as_str(raw)
        try:
            value = int(text, 10)
        except ValueError:
            raise InvalidValue("expected an integer") from None
        if not lo <= value <= hi:
            raise InvalidValue(f"must be between {lo} and {hi}")
        return value

    return parse


def parse_float(lo: float, hi: float) -> Callable[[RawValue], float]:
    def parse(raw: RawValue) -> float:
        if isinstance(raw, bool):
            raise InvalidValue("expected a number")
        try:
            value = float(as_str(raw))
        except ValueError:
            raise InvalidValue("expected a number") from None
        if not lo <= value <= hi:
            raise InvalidValue(f"must be between {lo:g} and {hi:g}")
        return value

    return parse


def parse_choice(*choices: str) -> Callable[[RawValue], str]:
    def parse(raw: RawValue) -> str:
        value = as_str(raw).lower()
        if value not in choices:
            raise InvalidValue(f"must be one of {', '.join(choices)}")
        return value

    return parse


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def parse_bool(raw: RawValue) -> bool:
    if isinstance(raw, bool):
        return raw
    value = as_str(raw).lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise InvalidValue("expected true or false")


def parse_optional_str(raw: RawValue) -> str | None:
    value = as_str(raw)
    return value or None


def parse_redis_url(raw: RawValue) -> str | None:
    value = as_str(raw).strip()
    if not value:
        return None
    if not value.startswith(("redis://", "rediss://", "unix://")):
        raise InvalidValue("expected redis://HOST[:PORT][/DB], rediss://... or unix://PATH")
    return value


def parse_origin_url(raw: RawValue) -> str | None:
    value = as_str(raw).strip()
    if not value:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidValue(
            "expected http(s)://HOST[:PORT] of a sidecar, or a WHEP URL with {stream}")
    if parts.query or parts.fragment:
        raise InvalidValue("no query or fragment: the stream's path is made from the URL")
    return value


@dataclass(frozen=True)
class PushTarget:
    """A stream pushed to a WHIP endpoint from startup (setting push_targets)."""

    stream: str
    url: str

    def __str__(self) -> str:
        return f"{self.stream}={self.url}"


def parse_push_targets(raw: RawValue) -> tuple[PushTarget, ...]:
    out = []
    for item in split_list(raw):
        stream, sep, url = item.partition("=")
        stream, url = stream.strip(), url.strip()
        if not sep or not is_stream_name(stream):
            raise InvalidValue(f"{item!r}: expected STREAM=URL, the stream {streamname.RULE}")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InvalidValue(f"{item!r}: the WHIP endpoint must be an http(s) URL")
        target = PushTarget(stream, url)
        if target in out:
            raise InvalidValue(f"{item!r} is given twice")
        out.append(target)
    return tuple(out)


# A node's name (the node_id setting), also as relays name each other in a pull's Via header.
NODE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
NODE_ID_RULE = "1-64 characters of A-Z a-z 0-9 _ . : -"


def parse_node_id(raw: RawValue) -> str | None:
    value = as_str(raw).strip()
    if not value:
        return None
    if not NODE_ID.fullmatch(value):
        raise InvalidValue(NODE_ID_RULE)
    return value


def parse_optional_path(raw: RawValue) -> Path | None:
    return parse_path(raw) if as_str(raw) else None


def parse_optional_port(raw: RawValue) -> int | None:
    return parse_int(1, 65535)(raw) if as_str(raw) else None


def parse_path(raw: RawValue) -> Path:
    value = as_str(raw)
    if not value:
        raise InvalidValue("must not be empty")
    if "\x00" in value:
        raise InvalidValue("a path cannot contain a NUL character")
    return Path(value)


_HOST_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_.])?")


def parse_host(raw: RawValue) -> str:
    """An IP address or a host name to bind; empty binds every interface, as in asyncio."""
    value = as_str(raw)
    if not value:
        return value
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if _HOST_NAME.fullmatch(value) is None:
        raise InvalidValue("expected an IP address or a host name")
    return value


def parse_port_range(raw: RawValue) -> PortRange | None:
    text = as_str(raw)
    if not text:
        return None
    low_text, sep, high_text = text.partition("-")
    if not sep:
        raise InvalidValue("expected LOW-HIGH, e.g. 40000-40100")
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        raise InvalidValue("expected LOW-HIGH, e.g. 40000-40100") from None
    if not (1 <= low <= 65535 and 1 <= high <= 65535):
        raise InvalidValue("ports must be between 1 and 65535")
    if low > high:
        raise InvalidValue("low end above high end")
    return PortRange(low, high)


def parse_addresses(raw: RawValue) -> tuple[str, ...]:
    out = []
    for item in split_list(raw):
        try:
            out.append(str(ipaddress.ip_address(item)))
        except ValueError:
            raise InvalidValue(f"{item!r} is not an IP address") from None
    return tuple(out)


def parse_host_ports(default_port: int) -> Callable[[RawValue], tuple[HostPort, ...]]:
    def parse(raw: RawValue) -> tuple[HostPort, ...]:
        out = []
        for item in split_list(raw):
            host, port = item, default_port
            if item.startswith("["):
                host, _, rest = item[1:].partition("]")
                if rest:
                    if not rest.startswith(":"):
                        raise InvalidValue(f"{item!r}: expected [v6addr]:port")
                    port = parse_int(1, 65535)(rest[1:])
            elif item.count(":") == 1:
                host, port_text = item.split(":")
                try:
                    port = parse_int(1, 65535)(port_text)
                except InvalidValue as exc:
                    raise InvalidValue(f"{item!r}: port {exc}") from None
            if not host:
                raise InvalidValue(f"{item!r}: empty host")
            out.append(HostPort(host, port))
        return tuple(out)

    return parse


def parse_ice_servers(raw: RawValue) -> tuple[IceServer, ...]:
    """``stun:host[:port]`` or ``turn[s]:[user:credential@]host[:port][?transport=udp|tcp]``."""
    out = []
    for item in split_list(raw):
        scheme, sep, rest = item.partition(":")
        scheme = scheme.lower()
        if not sep or scheme not in ("stun", "stuns", "turn", "turns") or not rest:
            raise InvalidValue(
                f"{item!r}: expected stun:HOST[:PORT] or turn:[USER:PASS@]HOST[:PORT]")
        rest = rest.removeprefix("//")
        username = credential = None
        if "@" in rest:
            if scheme.startswith("stun"):
                raise InvalidValue(f"{item!r}: STUN URLs take no credentials")
            userinfo, _, rest = rest.rpartition("@")
            username, colon, credential = userinfo.partition(":")
            if not colon or not username:
                raise InvalidValue(f"{item!r}: credentials must be USER:PASS")
        hostport, _, query = rest.partition("?")
        if query:
            transports = parse_qs(query).get("transport", [])
            if scheme.startswith("stun") or transports not in (["udp"], ["tcp"]):
                raise InvalidValue(f"{item!r}: only ?transport=udp|tcp is allowed, on TURN URLs")
        if not hostport:
            raise InvalidValue(f"{item!r}: empty host")
        url = f"{scheme}:{hostport}" + (f"?{query}" if query else "")
        if scheme.startswith("turn") and username is None:
            raise InvalidValue(f"{item!r}: TURN needs USER:PASS@ credentials")
        out.append(IceServer(url=url, username=username, credential=credential))
    return tuple(out)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def parse_origins(raw: RawValue) -> tuple[str, ...]:
    """``*`` alone, or web origins ``scheme://host[:port]`` as browsers send them in ``Origin``."""
    items = split_list(raw)
    if "*" in items:
        if len(items) > 1:
            raise InvalidValue("'*' already allows every origin; give it alone")
        return ("*",)
    out = []
    for item in items:
        parts = urlsplit(item)
        try:
            port = parts.port
        except ValueError:
            raise InvalidValue(f"{item!r}: bad port") from None
        if (
            parts.scheme not in _DEFAULT_PORTS
            or not parts.hostname
            or parts.username is not None
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
        ):
            raise InvalidValue(f"{item!r}: expected an origin such as https://app.example:8443")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        # Browsers serialize an origin lower-case and without its scheme's default port
        # (RFC 6454 6.2), so compare against that form.
        if port is not None and port != _DEFAULT_PORTS[parts.scheme]:
            host += f":{port}"
        out.append(f"{parts.scheme}://{host}")
    return tuple(dict.fromkeys(out))
