from __future__ import annotations

from pathlib import Path

import pytest

from sfu_sidecar.config import (
    HostPort,
    IceServer,
    PortRange,
    Settings,
    env_name,
    load_settings,
    setting_fields,
)
from sfu_sidecar.exceptions import ConfigError


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sidecar.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = load_settings()
    assert s == Settings()
    assert s.port == 8080
    assert s.ice_addresses == ()
    assert s.ice_port_range is None
    assert s.publish_token is None


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    cfg = write_toml(tmp_path, 'port = 7001\nlog_level = "debug"\nhost = "127.0.0.2"\n')
    env = {"SFU_SIDECAR_PORT": "7002", "SFU_SIDECAR_LOG_LEVEL": "warning"}
    s = load_settings({"port": "7003"}, env, cfg)
    assert s.port == 7003  # flag wins
    assert s.log_level == "warning"  # env beats file
    assert s.host == "127.0.0.2"  # file beats default
    assert s.log_format == "text"  # default


def test_file_keys_may_live_under_a_section(tmp_path: Path) -> None:
    cfg = write_toml(tmp_path, "[sfu_sidecar]\nport = 7100\n")
    assert load_settings(config_path=cfg).port == 7100


def test_list_settings_from_env_are_comma_separated() -> None:
    env = {
        "SFU_SIDECAR_ICE_ADDRESSES": "127.0.0.1, ::1",
        "SFU_SIDECAR_NTP_SERVERS": "127.0.0.1:11123,ntp.example,[::1]:123",
    }
    s = load_settings(env=env)
    assert s.ice_addresses == ("127.0.0.1", "::1")
    assert s.ntp_servers == (
        HostPort("127.0.0.1", 11123), HostPort("ntp.example", 123), HostPort("::1", 123),
    )


def test_list_settings_from_toml_arrays(tmp_path: Path) -> None:
    cfg = write_toml(tmp_path, 'ice_addresses = ["10.0.0.5", "2001:db8::1"]\n')
    assert load_settings(config_path=cfg).ice_addresses == ("10.0.0.5", "2001:db8::1")


def test_ice_servers_parse_stun_and_turn_credentials() -> None:
    s = load_settings(
        {
            "ice_servers": "stun:stun.example.org:3478,"
            "turn:alice:s3cret@turn.example.org?transport=udp"
        }
    )
    assert s.ice_servers == (
        IceServer("stun:stun.example.org:3478"),
        IceServer("turn:turn.example.org?transport=udp", "alice", "s3cret"),
    )
    assert s.redacted()["ice_servers"] == "***"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"ice_port_range": "5000-4000"}, "--ice-port-range 5000-4000: low end above high end"),
        ({"ice_port_range": "5000"}, "--ice-port-range 5000: expected LOW-HIGH"),
        ({"port": "70000"}, "--port 70000: must be between 1 and 65535"),
        ({"port": "http"}, "--port http: expected an integer"),
        ({"log_format": "xml"}, "--log-format xml: must be one of text, json"),
        ({"ice_addresses": "127.0.0.1,nothost"}, "'nothost' is not an IP address"),
        ({"ice_servers": "http://x"}, "expected stun:HOST[:PORT]"),
        ({"ice_servers": "turn:turn.example.org"}, "TURN needs USER:PASS@ credentials"),
        ({"ntp_servers": "host:99999"}, "port must be between 1 and 65535"),
        ({"clock_max_slew_ppm": "0"}, "--clock-max-slew-ppm 0: must be between 1 and 100000"),
        ({"cors_origins": "*,https://a.example"}, "'*' already allows every origin"),
        ({"cors_origins": "null"}, "'null': expected an origin such as https://"),
        ({"cors_origins": "https://a.example/app"}, "expected an origin such as"),
        ({"cors_origins": "http://a.example:70000"}, "'http://a.example:70000': bad port"),
        # A library parser's own ValueError is a bad value too, not a crash.
        ({"cors_origins": "http://[::1"}, "--cors-origins http://[::1: Invalid IPv6 URL"),
        ({"data_dir": "a\x00b"}, "a path cannot contain a NUL character"),
        ({"host": "no such host"}, "--host no such host: expected an IP address or a host"),
        ({"host": "http://x"}, "expected an IP address or a host name"),
        ({"open_ingest": "maybe"}, "--open-ingest maybe: expected true or false"),
        ({"max_viewers": "0"}, "--max-viewers 0: must be between 1 and 100000"),
        ({"ws_messages_per_s": "0"}, "must be between 0.01 and 1e+06"),
    ],
)
def test_validation_errors_name_the_setting_and_the_reason(
    flags: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(flags)
    assert message in info.value.reason


def test_env_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"SFU_SIDECAR_PORT=0: must be between 1 and 65535"):
        load_settings(env={"SFU_SIDECAR_PORT": "0"})


def test_file_errors_name_the_file_and_key(tmp_path: Path) -> None:
    cfg = write_toml(tmp_path, 'ice_port_range = "9-1"\n')
    with pytest.raises(ConfigError, match=r"sidecar.toml: ice_port_range = '9-1': low end above"):
        load_settings(config_path=cfg)


def test_unknown_file_key_is_rejected(tmp_path: Path) -> None:
    cfg = write_toml(tmp_path, "prot = 80\n")
    with pytest.raises(ConfigError, match="unknown key\\(s\\): prot"):
        load_settings(config_path=cfg)


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(config_path=write_toml(tmp_path, "port = = 1"))
    with pytest.raises(ConfigError, match="no such file"):
        load_settings(config_path=tmp_path / "absent.toml")


def test_toml_that_tomllib_fails_on_below_its_own_errors(tmp_path: Path) -> None:
    cases = [
        (b"port = " + b"9" * 5000, "not valid TOML: Exceeds the limit"),  # int() digit limit
        (b"a = " + b"[" * 5000 + b"]" * 5000, "not valid TOML: nested too deeply"),
        (b'port = "\xff"', "not valid TOML: not UTF-8 text"),
    ]
    for content, message in cases:
        path = tmp_path / "bad.toml"
        path.write_bytes(content)
        with pytest.raises(ConfigError, match=message):
            load_settings(config_path=path)
    with pytest.raises(ConfigError, match="cannot contain a NUL"):
        load_settings(config_path=Path("a\x00b.toml"))
    with pytest.raises(ConfigError, match="Is a directory"):
        load_settings(config_path=tmp_path)


@pytest.mark.parametrize(
    ("host", "expected"),
    [("0.0.0.0", "0.0.0.0"), ("::", "::"), ("0:0::1", "::1"), ("localhost", "localhost"),
     ("relay-1.example.org", "relay-1.example.org"), ("", "")],
)
def test_host_is_an_address_or_a_name(host: str, expected: str) -> None:
    assert load_settings({"host": host}).host == expected


def test_port_range_value() -> None:
    assert load_settings({"ice_port_range": "40000-40100"}).ice_port_range == PortRange(
        40000, 40100
    )


def test_every_setting_has_help_and_an_env_name() -> None:
    names = [f.name for f in setting_fields()]
    assert len(names) == len(set(names))
    for f in setting_fields():
        assert f.metadata["help"], f.name
        assert env_name(f.name) == "SFU_SIDECAR_" + f.name.upper()


def test_cors_origins_are_kept_in_the_form_browsers_send() -> None:
    s = load_settings({"cors_origins": "HTTPS://App.Example:443, http://127.0.0.1:8081/,http://[::1]"})
    assert s.cors_origins == ("https://app.example", "http://127.0.0.1:8081", "http://[::1]")
    assert load_settings(env={"SFU_SIDECAR_CORS_ORIGINS": " * "}).cors_origins == ("*",)
    assert load_settings().cors_origins == ()


def test_cors_origins_from_a_toml_array(tmp_path: Path) -> None:
    cfg = write_toml(tmp_path, 'cors_origins = ["https://a.example", "http://localhost:3000"]\n')
    assert load_settings(config_path=cfg).cors_origins == (
        "https://a.example", "http://localhost:3000",
    )


def test_limits_have_defaults_and_take_values_from_every_source(tmp_path: Path) -> None:
    s = load_settings()
    assert (s.open_ingest, s.max_viewers, s.max_viewers_per_stream) == (False, 150, 150)
    assert (s.max_sessions_per_client, s.max_sdp_bytes, s.max_sdp_lines) == (64, 65536, 2000)
    assert (s.max_cues_per_request, s.max_cues_per_s) == (500, 100.0)
    assert (s.ws_max_message_bytes, s.ws_messages_per_s, s.channel_messages_per_s) == (
        65536, 50.0, 20.0)
    cfg = write_toml(tmp_path, "open_ingest = true\nmax_cues_per_s = 2.5\n")
    s = load_settings({"max_viewers": "10"}, {"SFU_SIDECAR_OPEN_INGEST": "no"}, cfg)
    assert (s.open_ingest, s.max_viewers, s.max_cues_per_s) == (False, 10, 2.5)
    assert load_settings(config_path=cfg).open_ingest is True
    assert load_settings({"open_ingest": "YES"}).redacted()["open_ingest"] == "true"
