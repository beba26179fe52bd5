"""Every test belongs to exactly one tier, so a developer can run the fast ones while working:

- ``unit``: pure code. No sockets, subprocesses, browsers or sleeps: a guard makes each of them
  raise inside a unit test, so a test put in this tier by mistake fails at once and says why.
- ``integration``: the service in this process, aiortc peers and HTTP clients over loopback,
  an event loop that may sleep.
- ``system``: subprocesses, browsers, network namespaces, third-party servers.

A test's tier, first rule that applies:
1. a ``unit``/``integration``/``system`` mark on the test, its class or its module (more than
   one is an error);
2. a requirement mark (``browser``, ``netns``, ``needs``) -> system;
3. its folder: ``tests/e2e``, ``tests/interop``, ``tests/faults``, ``tests/fuzz`` -> system;
4. a fixture it uses, by the tables below -> that fixture's tier (the highest of them);
5. a coroutine test -> integration; a plain test whose fixtures are all pytest's own -> unit.

A test that none of these places (it uses a fixture the tables do not know) fails collection
with the fixture's name: add it to a table, or mark the test.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

TIERS = ("unit", "integration", "system")
REQUIREMENT_MARKS = ("browser", "netns", "needs")
SYSTEM_FOLDERS = ("e2e", "interop", "faults", "fuzz")

# pytest's and its plugins' fixtures that touch nothing outside the process.
PURE_FIXTURES = frozenset({
    "request", "tmp_path", "tmp_path_factory", "tmpdir", "tmpdir_factory", "caplog", "capsys",
    "capfd", "capsysbinary", "monkeypatch", "recwarn", "record_property", "pytestconfig",
    "event_loop_policy", "doctest_namespace", "_unit_guard",
})
# Project fixtures by tier: what each one starts.
INTEGRATION_FIXTURES = frozenset({
    "live",  # the app on a loopback port (tests/test_http_inputs.py)
    "relay", "relay_factory", "app_base",  # relay service and app in process (tests/relay)
    "make_client", "app", "app_client", "client_and_journal", "ticking_app", "relay_base",
    "env",  # caption service with its HTTP app (tests/captions)
    "cluster", "nodes",  # several in-process relays joined over loopback
    "wired", "base",
    "offers",  # real aiortc offers (ICE gathers on the host's interfaces)
})
SYSTEM_FIXTURES = frozenset({
    "server_factory", "server", "supervisor",  # sfu-sidecar as a subprocess
    "browser", "probe",  # headless Chromium
    "chrony_factory", "clock_server_factory", "ntp_house", "ptpnet", "ptplan",  # chronyd, ptp4l
    "gst_vp9",  # GStreamer
    "namespace", "media",  # mounts and network namespaces
    "_stop_server",
})
_RANK = {tier: i for i, tier in enumerate(TIERS)}


class TierError(Exception):
    """A test whose tier cannot be told, or that does what its tier forbids."""


def _folder_tier(path: Path, root: Path) -> str | None:
    try:
        parts = path.relative_to(root / "tests").parts
    except ValueError:
        return None
    return "system" if parts and parts[0] in SYSTEM_FOLDERS else None


def tier_of(item: pytest.Item, root: Path) -> str:
    explicit = {m.name for m in item.iter_markers() if m.name in TIERS}
    if len(explicit) > 1:
        raise TierError(f"{item.nodeid}: marked with more than one tier: {sorted(explicit)}")
    if explicit:
        return explicit.pop()
    if any(item.get_closest_marker(m) is not None for m in REQUIREMENT_MARKS):
        return "system"
    folder = _folder_tier(Path(str(item.path)), root)
    if folder is not None:
        return folder
    info = getattr(item, "_fixtureinfo", None)
    fixtures = set(info.name2fixturedefs) if info is not None else set()
    tier = "unit"
    unknown = []
    for name in fixtures - PURE_FIXTURES:
        defs = info.name2fixturedefs[name] if info is not None else ()
        # Parametrize arguments show up as fixtures defined by pytest itself.
        if defs and getattr(defs[-1].func, "__module__", "") == "_pytest.python":
            continue
        if name in SYSTEM_FIXTURES:
            found = "system"
        elif name in INTEGRATION_FIXTURES:
            found = "integration"
        else:
            unknown.append(name)
            continue
        tier = max(tier, found, key=_RANK.__getitem__)
    if unknown:
        raise TierError(
            f"{item.nodeid}: no tier for fixture(s) {sorted(unknown)}: add them to a table in "
            "tests/support/tiers.py or mark the test unit, integration or system")
    function = getattr(item, "function", None)
    if tier == "unit" and function is not None and inspect.iscoroutinefunction(function):
        tier = "integration"
    return tier


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    assign(items, config.rootpath)


def assign(items: list[pytest.Item], root: Path) -> None:
    """Mark every item with its tier; raise naming every item that has none."""
    errors = []
    for item in items:
        try:
            tier = tier_of(item, root)
        except TierError as err:
            errors.append(str(err))
            continue
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
    if errors:
        raise pytest.UsageError("tests without a tier:\n  " + "\n  ".join(errors))


def _forbidden(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise TierError(f"a unit test {what}: mark it integration or system "
                        "(tests/support/tiers.py)")
    return refuse


class _NoSocket(socket.socket):
    def __init__(self, family: int = -1, *args: Any, **kwargs: Any) -> None:
        # A socketpair (in-memory, e.g. an event loop's self-pipe) is no network use.
        if family == socket.AF_UNIX:
            super().__init__(family, *args, **kwargs)
            return
        _forbidden("opened a socket")()


@pytest.fixture(autouse=True)
def _unit_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Inside a unit test, sockets, subprocesses and sleeps raise instead of happening."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    monkeypatch.setattr(socket, "socket", _NoSocket)
    monkeypatch.setattr(socket, "create_connection", _forbidden("opened a connection"))
    monkeypatch.setattr(subprocess.Popen, "__init__", _forbidden("started a process"))
    monkeypatch.setattr(time, "sleep", _forbidden("slept"))
    monkeypatch.setattr(asyncio, "sleep", _forbidden("slept"))
    yield
