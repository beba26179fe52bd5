"""Every command line, environment and config file the CLI can be given ends in a clean start
or in exit code 1/2 with a one-line reason on stderr, never in a traceback.

Commands that take settings are checked through ``prepare`` (parsing and validation without
starting anything); when ``prepare`` refuses, ``main`` is run too, since it then stops before
any component starts. ``captions check`` runs in full. ``FUZZ_EXAMPLES`` sets the examples per
property (default 40) for a longer local run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sfu_sidecar.cli import main, prepare
from sfu_sidecar.config import ENV_PREFIX, env_name, flag_name, setting_fields
from sfu_sidecar.exceptions import ConfigError
from tests.conftest import sidecar_command

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SETTING_COMMANDS = ("serve", "demo", "clock")


@contextlib.contextmanager
def captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def run_main(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, str, str]:
    """``main`` in process: (exit code, stdout, stderr); argparse's exit counts as a code."""
    with captured() as (out, err):
        try:
            code = main(list(argv), env)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def assert_clean_refusal(code: int, err: str) -> None:
    assert code in (1, 2), (code, err)
    assert err.strip(), "a refusal must say why on stderr"
    assert "Traceback" not in err, err


def check_command_line(argv: list[str], env: dict[str, str]) -> None:
    """prepare() either accepts or refuses in the documented ways; a refusal through main()
    is exit 2 with a message."""
    with captured() as (_, err):
        try:
            prepare(argv, env)
        except SystemExit as exc:
            if exc.code == 0:  # --help / --version
                return
            assert exc.code == 2 and "error:" in err.getvalue(), (exc.code, err.getvalue())
        except ConfigError as exc:
            assert exc.reason
        else:
            return  # valid: main would start the command, which this test never does
    code, _, main_err = run_main(argv, env)
    assert code == 2
    assert_clean_refusal(code, main_err)


# --- values --------------------------------------------------------------------------------

JUNK = st.one_of(
    st.sampled_from([
        "", " ", "0", "-1", "1e309", "-1e309", "inf", "-inf", "nan", "NaN", "-0", "0x10",
        "1_000", "9" * 5000, "1" * 400, "65536", "4294967296", "1.5", "١٢٣", "\x00", "a\x00b",
        "..", "/", "-", "--", "5000-4000", "1-2-3", "[::1", "http://[::1", "http://x:99999",
        "stun:", "turn:u@h", "turn:u:p@h?transport=sctp", "*,http://a", "::", "é", "a b",
        "x" * 300, "127.0.0.1", "localhost", "eth0", "debug", "json", "https://app.example",
    ]),
    st.text(max_size=40),
    st.from_regex(r"-?[0-9]{1,30}(\.[0-9]{1,30})?(e-?[0-9]{1,4})?", fullmatch=True),
)
FLAGS = [flag_name(f.name) for f in setting_fields()]


@st.composite
def command_lines(draw: st.DrawFn, command: str) -> list[str]:
    argv = [command]
    for _ in range(draw(st.integers(0, 5))):
        flag = draw(st.sampled_from([*FLAGS, "--count", "--config", "--nope", "-x", "stray"]))
        if flag == "stray":
            argv.append(draw(JUNK))
        elif draw(st.booleans()):
            argv.append(f"{flag}={draw(JUNK)}")
        else:
            argv.extend([flag, draw(JUNK)])
    return argv


ENVS = st.dictionaries(
    st.sampled_from([env_name(f.name) for f in setting_fields()] + [ENV_PREFIX + "NOPE"]),
    JUNK.filter(lambda v: "\x00" not in v),  # the OS cannot hold a NUL in the environment
    max_size=3,
)


@pytest.mark.parametrize("command", SETTING_COMMANDS)
@FUZZ
@given(data=st.data())
def test_flags_and_environment(command: str, data: st.DataObject) -> None:
    check_command_line(data.draw(command_lines(command)), data.draw(ENVS))


# Found by this test: urlsplit raises ValueError on "http://[::1" (cors_origins), which
# escaped the settings loader; a data_dir with a NUL and a host that is no host name passed
# validation and failed with a traceback once used.
@pytest.mark.parametrize(
    ("argv", "env", "reason"),
    [
        (["serve", "--cors-origins", "http://[::1"], {}, "--cors-origins http://[::1"),
        (["serve"], {"SFU_SIDECAR_CORS_ORIGINS": "https://[x"}, "SFU_SIDECAR_CORS_ORIGINS"),
        (["serve", "--data-dir", "a\x00b"], {}, "NUL"),
        (["serve", "--host", "no such host"], {}, "an IP address or a host name"),
        (["serve", "--port", "9" * 5000], {}, "expected an integer"),
        (["serve", "--caption-chunk-s", "nan"], {}, "between"),
        (["serve", "--clock-max-slew-ppm", "1e309"], {}, "between"),
    ],
)
def test_found_bad_values_exit_2_with_a_reason(
    argv: list[str], env: dict[str, str], reason: str
) -> None:
    code, _, err = run_main(argv, env)
    assert code == 2
    assert_clean_refusal(code, err)
    assert reason in err


def test_negative_count_is_refused_by_the_parser() -> None:
    code, _, err = run_main(["clock", "--count", "-3"], {})
    assert code == 2 and "--count" in err and "below 0" in err


# --- config files ----------------------------------------------------------------------------

# TOML literals of every type, in and out of each setting's range.
TOML_VALUES = st.one_of(
    st.integers().map(str),
    st.integers(min_value=10**30).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(max_size=20).map(json.dumps),
    st.sampled_from(["inf", "-inf", "nan", "true", "false", "1979-05-27T07:32:00Z", "07:32:00",
                     "[]", "{}", "[1, [2, [3]]]", "{a = 1}", '["a", 1]', '"' + "9" * 5000 + '"',
                     '"127.0.0.1, ::1"', '["stun:h", "turn:u:p@h"]']),
)
RAW_TOML = st.sampled_from([
    b"port = " + b"9" * 5000,  # past int()'s digit limit inside tomllib
    b"a = " + b"[" * 5000 + b"]" * 5000,  # past the recursion limit inside tomllib
    b'port = "\xff\xfe"',  # not UTF-8
    b"port = ",
    b"[sfu_sidecar]\n[sfu_sidecar]\n",
    b"sfu_sidecar = 5",
    b"\x00",
])


@st.composite
def toml_files(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(RAW_TOML)
    keys = [f.name for f in setting_fields()] + ["nope"]
    lines = [f"{k} = {draw(TOML_VALUES)}" for k in draw(st.lists(st.sampled_from(keys),
                                                                 max_size=4, unique=True))]
    body = "\n".join(lines) + "\n"
    return (("[sfu_sidecar]\n" if draw(st.booleans()) else "") + body).encode()


@pytest.mark.parametrize("command", SETTING_COMMANDS)
@FUZZ
@given(content=toml_files())
@example(content=b"port = " + b"9" * 5000)
@example(content=b"a = " + b"[" * 5000 + b"]" * 5000)
@example(content=b'port = "\xff\xfe"')
def test_config_files(command: str, content: bytes, tmp_path: Path) -> None:
    path = tmp_path / "sfu.toml"
    path.write_bytes(content)
    check_command_line([command, "--config", str(path)], {})


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"port = " + b"9" * 5000, "not valid TOML"),
     (b"a = " + b"[" * 5000 + b"]" * 5000, "nested too deeply"),
     (b'port = "\xff\xfe"', "not UTF-8")],
)
def test_found_config_files_exit_2_with_a_reason(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    path = tmp_path / "sfu.toml"
    path.write_bytes(content)
    code, _, err = run_main(["serve", "--config", str(path)], {})
    assert code == 2 and reason in err
    assert_clean_refusal(code, err)


def test_config_paths_that_are_not_files(tmp_path: Path) -> None:
    for path in (str(tmp_path), str(tmp_path / "none.toml"), "a\x00b"):
        code, _, err = run_main(["serve", "--config", path], {})
        assert code == 2
        assert_clean_refusal(code, err)


# --- captions check ---------------------------------------------------------------------------

NUMBER_TEXT = st.one_of(
    st.sampled_from(["1" * 400, "9" * 5000, "0" * 5000 + "1", str(2**1024 - 2**970), "1e400",
                     "-0", ".5", "5.", "-", "", "4294967296"]),
    st.from_regex(r"-?[0-9]{1,40}(\.[0-9]{1,40})?", fullmatch=True),
)


@st.composite
def vtt_files(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=200))
    n = NUMBER_TEXT
    blocks = [f"REGION\nid:r lines:{draw(n)} width:{draw(n)}% regionanchor:{draw(n)}%,{draw(n)}%"]
    for _ in range(draw(st.integers(1, 3))):
        timing = f"{draw(n).lstrip('-')}:{draw(n)}:{draw(n)}.{draw(n)} --> 00:{draw(n)}.000"
        settings_ = f"line:{draw(n)} position:{draw(n)}% size:{draw(n)}% line:{draw(n)}%"
        blocks.append(f"{draw(st.text(max_size=5))}\n{timing} {settings_}\n{draw(st.text())}")
    return ("WEBVTT\n\n" + "\n\n".join(blocks)).encode("utf-8", "surrogatepass")


def strict_json(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


@FUZZ
@given(content=vtt_files())
@example(content=b"WEBVTT\n\n00:00.000 --> 00:01.000 line:" + b"1" * 400 + b"\nx\n")
@example(content=b"WEBVTT\n\n" + b"9" * 5000 + b":00:00.000 --> 00:01.000\nx\n")
def test_captions_check_files(content: bytes, tmp_path: Path) -> None:
    path = tmp_path / "f.vtt"
    path.write_bytes(content)
    code, out, err = run_main(["captions", "check", str(path)], {})
    if code == 0:
        doc = json.loads(out, parse_constant=strict_json)
        assert set(doc) == {"cues", "regions"}
        assert err == ""
    else:
        assert code == 1 and out == ""
        assert_clean_refusal(code, err)


@FUZZ
@given(argv=st.lists(JUNK, max_size=3))
def test_captions_command_lines(argv: list[str], tmp_path: Path) -> None:
    with contextlib.chdir(tmp_path):
        code, _, err = run_main(["captions", *argv], {})
        if code != 0:
            assert_clean_refusal(code, err)
        code, _, err = run_main(["captions", "check", *argv], {})
        if code != 0:
            assert_clean_refusal(code, err)


# --- what only running finds: the real binary ------------------------------------------------


@pytest.mark.system
def test_serve_on_a_port_in_use_exits_1_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [*sidecar_command(), "serve", "--host", "127.0.0.1", "--port", str(port),
             "--data-dir", str(tmp_path / "data")],
            capture_output=True, text=True, timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)},
        )
    assert out.returncode == 1
    assert "cannot start" in out.stderr and "address already in use" in out.stderr
    assert "Traceback" not in out.stderr
