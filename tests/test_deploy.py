"""The deployment files, checked without a Docker engine.

docker-compose.yml against the Compose Specification schema (vendored in deploy/compose-spec/),
every SFU_SIDECAR_* variable the compose file and the Dockerfile set through the real settings
loader, the ports and volume the compose file maps against the Dockerfile's EXPOSE and VOLUME and
the settings they produce, the Dockerfile's health check and user, how it installs the package
(its own wheel, no folder copied by hand), and the Janus and ptp4l configurations run for real
with the Debian programs the images install.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from sfu_sidecar.config import ENV_PREFIX, env_name, load_settings, setting_fields
from tests.conftest import free_port
from tests.support import janus

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
SCHEMA = ROOT / "deploy" / "compose-spec" / "compose-spec.json"
JANUS_DIR = ROOT / "deploy" / "janus"
PTP_DIR = ROOT / "deploy" / "ptp"

# What an operator would export before `docker compose up` (the file requires these).
SAMPLE_ENV = {
    "PUBLIC_IP": "203.0.113.7",
    "TURN_PASSWORD": "s3cret-turn",
    "SFU_SIDECAR_PUBLISH_TOKEN": "pub-token",
}


# --- small readers ------------------------------------------------------------------------


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # comments may sit between continuation lines
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, f"{path}: ends inside a continuation"
    return out


def dockerfile_stages(path: Path) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage in order, each list starting with its FROM."""
    stages: list[list[tuple[str, str]]] = []
    for word, rest in dockerfile_instructions(path):
        if word == "FROM":
            stages.append([])
        assert stages, f"{path}: {word} before the first FROM"
        stages[-1].append((word, rest))
    return stages


def dockerfile_env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in instructions:
        if word == "ENV":
            for pair in shlex.split(rest):
                key, sep, value = pair.partition("=")
                assert sep, f"ENV {pair}: use KEY=VALUE"
                env[key] = value
    return env


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable substitution: ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        value = env.get(name)
        if op in (":-", "-"):
            if value is None or (op == ":-" and value == ""):
                return arg
        elif op in (":?", "?") and (value is None or (op == ":?" and value == "")):
            raise KeyError(f"{name} is required: {arg}")
        return value if value is not None else ""

    return _VAR.sub(sub, text)


def _interpolate_values(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolate_values(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _interpolate_values(value, env) for key, value in node.items()}
    return node


def compose_document(env: dict[str, str]) -> dict[str, Any]:
    """The file as Compose reads it: YAML first, then substitution inside string values."""
    data = _interpolate_values(yaml.safe_load(COMPOSE.read_text()), env)
    assert isinstance(data, dict)
    return data


def port_span(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def published(service: dict[str, Any]) -> list[tuple[tuple[int, int], tuple[int, int], str]]:
    """(host span, container span, protocol) of every short-syntax port mapping."""
    out = []
    for entry in service.get("ports", []):
        spec, _, proto = str(entry).partition("/")
        host, _, container = spec.rpartition(":")
        out.append((port_span(host), port_span(container), proto or "tcp"))
    return out


def exposed(instructions: list[tuple[str, str]]) -> set[tuple[tuple[int, int], str]]:
    out = set()
    for word, rest in instructions:
        if word == "EXPOSE":
            for item in rest.split():
                spec, _, proto = item.partition("/")
                out.add((port_span(spec), proto or "tcp"))
    return out


# --- the compose file ---------------------------------------------------------------------


def test_compose_file_follows_the_compose_specification() -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft201909Validator(schema)
    document = compose_document(SAMPLE_ENV)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    assert set(document["services"]) == {"sidecar", "janus", "coturn", "ptp4l"}
    assert document["services"]["ptp4l"]["profiles"] == ["ptp-lab"]
    # The schema itself catches mistakes: a misspelt key is refused.
    broken = compose_document(SAMPLE_ENV)
    broken["services"]["sidecar"]["enviroment"] = {}
    assert any(True for _ in validator.iter_errors(broken))


def test_compose_file_refuses_to_start_without_the_public_address_and_turn_password() -> None:
    for missing in ("PUBLIC_IP", "TURN_PASSWORD"):
        env = {k: v for k, v in SAMPLE_ENV.items() if k != missing}
        with pytest.raises(KeyError, match=missing):
            compose_document(env)


def _sidecar_settings_env(env: dict[str, str]) -> dict[str, str]:
    """What the sidecar's process sees: the Dockerfile's ENV, then the compose environment."""
    document = compose_document(env)
    merged = dockerfile_env(dockerfile_stages(DOCKERFILE)[-1])
    for key, value in document["services"]["sidecar"]["environment"].items():
        if value is not None:
            merged[key] = str(value)
        elif key in env:  # a name without a value passes the shell's variable through
            merged[key] = env[key]
    return merged


def test_every_sfu_sidecar_variable_set_is_a_real_setting_and_loads() -> None:
    env = _sidecar_settings_env(SAMPLE_ENV)
    known = {env_name(f.name) for f in setting_fields()}
    ours = {k for k in env if k.startswith(ENV_PREFIX)}
    assert ours, "the deployment sets no settings at all"
    assert ours <= known, f"not settings: {sorted(ours - known)}"
    settings = load_settings(env=env)  # the service's own parser, which refuses bad values
    assert settings.host == "0.0.0.0"
    assert settings.data_dir == Path("/data")
    assert settings.ice_addresses == ("203.0.113.7",)
    assert settings.publish_token == "pub-token"
    assert settings.view_token is None  # not set in the shell: not passed, the setting unset
    assert settings.ptp_interface is None
    # TURN credentials reach the clients' ice_servers, with the coturn service's user.
    turn = [s for s in settings.ice_servers if s.url.startswith("turn:")]
    assert [(s.username, s.credential) for s in turn] == [("sidecar", "s3cret-turn")]
    coturn = " ".join(compose_document(SAMPLE_ENV)["services"]["coturn"]["command"])
    assert "--user=sidecar:s3cret-turn" in coturn and "--listening-port=3478" in coturn
    assert all(s.url.endswith(("203.0.113.7:3478", "203.0.113.7:3478?transport=udp"))
               for s in settings.ice_servers)


def test_ports_and_volume_match_the_dockerfile_and_the_settings() -> None:
    instructions = dockerfile_instructions(DOCKERFILE)
    settings = load_settings(env=_sidecar_settings_env(SAMPLE_ENV))
    sidecar = compose_document(SAMPLE_ENV)["services"]["sidecar"]
    mappings = published(sidecar)
    # Published 1:1: ICE candidates announce the container's port numbers.
    assert all(host == container for host, container, _ in mappings)
    assert {(c, p) for _, c, p in mappings} == exposed(instructions)
    tcp = [c for _, c, p in mappings if p == "tcp"]
    udp = [c for _, c, p in mappings if p == "udp"]
    assert tcp == [(settings.port, settings.port)]
    assert settings.ice_port_range is not None
    assert udp == [(settings.ice_port_range.low, settings.ice_port_range.high)]
    # The compose file repeats the Dockerfile's range, so changing one alone fails here.
    assert sidecar["environment"]["SFU_SIDECAR_ICE_PORT_RANGE"] == str(settings.ice_port_range)
    volumes = [args for word, args in instructions if word == "VOLUME"]
    assert [json.loads(v) for v in volumes] == [[str(settings.data_dir)]]
    assert [v.split(":")[1] for v in sidecar["volumes"]] == [str(settings.data_dir)]
    assert sidecar["build"] == "."


def test_other_services_publish_what_their_images_use() -> None:
    services = compose_document(SAMPLE_ENV)["services"]
    janus_conf = (JANUS_DIR / "janus.jcfg").read_text()
    match = re.search(r'rtp_port_range = "(\d+)-(\d+)"', janus_conf)
    assert match is not None
    janus_ports = published(services["janus"])
    assert ((8088, 8088), (8088, 8088), "tcp") in janus_ports
    span = (int(match.group(1)), int(match.group(2)))
    assert (span, span, "udp") in janus_ports
    assert {(c, p) for _, c, p in janus_ports} == exposed(
        dockerfile_instructions(JANUS_DIR / "Dockerfile"))
    # coturn is on the host's network (a peer at its --external-ip it would take for itself):
    # nothing to publish, and its ports must not collide with what the others publish.
    coturn = services["coturn"]
    assert coturn["network_mode"] == "host" and "ports" not in coturn
    command = " ".join(coturn["command"])
    low = int(re.search(r"--min-port=(\d+)", command).group(1))  # type: ignore[union-attr]
    high = int(re.search(r"--max-port=(\d+)", command).group(1))  # type: ignore[union-attr]
    taken = {p for name in ("sidecar", "janus") for (h, _, _) in published(services[name])
             for p in range(h[0], h[1] + 1)}
    assert not taken & ({3478} | set(range(low, high + 1))), sorted(taken)


# --- the Dockerfile -----------------------------------------------------------------------


def test_dockerfile_runs_the_installed_package_as_a_user_with_a_health_check() -> None:
    *builders, final = dockerfile_stages(DOCKERFILE)
    words = [w for w, _ in final]
    base = final[0][1]
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", base), base
    # The package goes in the ordinary way: a builder stage makes the checkout's wheel, the image
    # installs it with its Redis extra (a node that shares captions through redis_url) and its
    # demo extra (the demo's voice).
    assert [b[0][1] for b in builders] == [f"{base} AS builder"]
    builder = builders[0]
    assert any(w == "RUN" and re.search(r"\bpip wheel\b.*--no-deps.* \.$", a)
               for w, a in builder)
    assert [a for w, a in final if w == "COPY"] == ["--from=builder /wheels /tmp/wheels"]
    installs = [a for w, a in final if w == "RUN" and "pip install" in a]
    assert len(installs) == 1, installs
    assert "/tmp/wheels/sfu_sidecar-*-py3-none-any.whl" in installs[0]
    assert 'pip install "${wheel}[redis,demo]"' in installs[0]
    users = [a for w, a in final if w == "USER"]
    assert users and users[-1] not in ("root", "0") and not users[-1].startswith(("root:", "0:"))
    # Nothing runs as root after the switch, so the final image's user is this one.
    assert "RUN" not in words[words.index("USER"):]
    health = [a for w, a in final if w == "HEALTHCHECK"]
    assert len(health) == 1 and "/healthz" in health[0] and "SFU_SIDECAR_PORT" in health[0]
    entry = json.loads(dict(final)["ENTRYPOINT"]) + json.loads(dict(final)["CMD"])
    assert entry == ["sfu-sidecar", "serve"]


def test_dockerfile_copies_only_the_package_and_no_folder_by_hand() -> None:
    """The web client is package data (sfu_sidecar/web), so the wheel carries it: no stage copies
    a folder of its own into the image or into site-packages."""
    instructions = dockerfile_instructions(DOCKERFILE)
    # The build context holds what the builder copies, and nothing of the developer's tree.
    ignore = (ROOT / ".dockerignore").read_text().split("\n")
    ignore = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert ignore[ignore.index("*") + 1:] == [
        "!pyproject.toml", "!README.md", "!sfu_sidecar/", "**/__pycache__"]
    from_context = [shlex.split(a) for w, a in instructions
                    if w in ("COPY", "ADD") and not a.startswith("--from=")]
    assert sorted(src for *sources, _ in from_context for src in sources) == [
        "README.md", "pyproject.toml", "sfu_sidecar"]
    assert all(w != "ADD" for w, _ in instructions)
    for word, args in instructions:
        if word == "RUN":
            assert not re.search(r"\b(cp|mv|install -[dD]|rsync|tar)\b|site-packages|WEB_DIR",
                                 args), f"RUN places files by hand: {args}"
    # The package data it relies on: every file of the web client is declared to setuptools.
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-data"]["sfu_sidecar"]
    package = ROOT / "sfu_sidecar"
    web = [f for f in (package / "web").rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    assert (package / "web" / "index.html") in web
    for f in web:
        rel = f.relative_to(package)
        assert any(rel.match(pattern) for pattern in data), f"{rel} is not package data"


def test_health_check_command_passes_against_the_real_service(server_factory: Any) -> None:
    """The HEALTHCHECK's exec form, run as Docker would run it, against a live server."""
    health = dict(dockerfile_instructions(DOCKERFILE))["HEALTHCHECK"]
    argv = json.loads(health[health.index("CMD") + 3:].strip())
    server = server_factory()
    env = {**os.environ, "SFU_SIDECAR_PORT": str(server.port)}
    ok = subprocess.run([sys.executable, *argv[1:]], env=env, timeout=20)
    assert ok.returncode == 0
    env["SFU_SIDECAR_PORT"] = str(free_port())  # nobody listening: the check fails
    bad = subprocess.run([sys.executable, *argv[1:]], env=env, timeout=20,
                         capture_output=True)
    assert bad.returncode != 0


# --- Janus and ptp4l with the configurations the images carry -----------------------------


@pytest.mark.needs("janus")
def test_janus_configuration_loads_only_the_http_api_videoroom_and_streaming(
    tmp_path: Path,
) -> None:
    # The image's config, with the HTTP port moved to a free one (tests share the machine).
    port = free_port()
    janus.write_config(tmp_path, port, interface=None)
    with janus.running(tmp_path) as proc:
        info = janus.wait_info(port, proc)
    assert sorted(info["plugins"]) == ["janus.plugin.streaming", "janus.plugin.videoroom"]
    assert sorted(info["transports"]) == ["janus.transport.http"]


@pytest.mark.needs("ptp4l")
def test_ptp_lab_grandmaster_configuration_takes_the_grandmaster_role(tmp_path: Path) -> None:
    conf = PTP_DIR / "grandmaster.conf"
    proc = subprocess.Popen(
        ["ptp4l", "-S", "-4", "-m", "-f", str(conf), "-i", "lo",
         "--uds_address", str(tmp_path / "gm.sock")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 20
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "assuming the grand master role" in line:
                break
        assert any("assuming the grand master role" in line for line in lines), "".join(lines)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    # The image's command runs exactly this configuration on its interface.
    cmd = dict(dockerfile_instructions(PTP_DIR / "Dockerfile"))["CMD"]
    assert "-f /etc/linuxptp/grandmaster.conf" in cmd and "-S -4" in cmd



# In the compose stack's lane (tests/test_compose.py): both relay in the compose file's ports.
@pytest.mark.xdist_group("compose-file-host-ports")
@pytest.mark.needs("turnserver")
def test_coturn_with_the_compose_command_line_relays_for_the_sidecars_turn_credentials(
    tmp_path: Path,
) -> None:
    """coturn run with the compose file's own arguments (listening port moved to a free one,
    the public address on loopback) grants a relay allocation to exactly the credentials the
    sidecar hands its clients in ice_servers, on the public address and inside the published
    relay range, and refuses a wrong password."""
    import asyncio

    from aioice import turn
    from aioice.stun import TransactionFailed

    env = {**SAMPLE_ENV, "PUBLIC_IP": "127.0.0.1"}
    port = free_port()
    command = [arg.replace("--listening-port=3478", f"--listening-port={port}")
               for arg in compose_document(env)["services"]["coturn"]["command"]]
    settings = load_settings(env=_sidecar_settings_env(env))
    (server,) = [s for s in settings.ice_servers if s.url.startswith("turn:")]

    async def allocate(password: str | None) -> tuple[str, int]:
        transport, _ = await asyncio.wait_for(turn.create_turn_endpoint(
            asyncio.DatagramProtocol, server_addr=("127.0.0.1", port),
            username=server.username, password=password), 10)
        try:
            relayed: tuple[str, int] = transport.get_extra_info("sockname")
            return relayed
        finally:
            transport.close()

    async def first_allocation(proc: subprocess.Popen[bytes]) -> tuple[str, int]:
        deadline = time.monotonic() + 20
        while True:  # until coturn listens, at most 20 s
            assert proc.poll() is None, (tmp_path / "turnserver.log").read_text()[-2000:]
            try:
                return await allocate(server.credential)
            except (TimeoutError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)

    log = (tmp_path / "turnserver.log").open("wb")
    # -n (in the command): no configuration file; the log goes to the test's folder.
    proc = subprocess.Popen(["turnserver", *command, "--log-file=stdout", "--simple-log"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        relayed = asyncio.run(first_allocation(proc))
        line = " ".join(command)
        low = int(re.search(r"--min-port=(\d+)", line).group(1))  # type: ignore[union-attr]
        high = int(re.search(r"--max-port=(\d+)", line).group(1))  # type: ignore[union-attr]
        assert relayed[0] == "127.0.0.1" and low <= relayed[1] <= high, relayed
        with pytest.raises(TransactionFailed, match="401"):
            asyncio.run(allocate("wrong-" + (server.credential or "")))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
