"""Two lanes for a run split over pytest-xdist workers (``-n 2 --dist loadgroup``).

Every test that drives Chromium goes into one group, which xdist runs on one worker in
collection order: the browser tests queue on a machine-wide lock anyway (one browser at a time
on 2 cores), and in one lane they wait for nothing. Every other test is grouped by its module,
so module-scoped fixtures (a server, a namespace) are set up once, and the modules share the
second worker. A run without xdist is unchanged.

The split puts a browser test beside one other test at a time: the load a test on this machine
must stand anyway (one busy core), which ``scripts/flake-check --hogs 1`` checks.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

BROWSER_GROUP = "chromium"


def drives_chromium(item: pytest.Item) -> bool:
    """Marked ``browser`` (its probe launches Chromium) or using the ``browser`` fixture."""
    return (item.get_closest_marker("browser") is not None
            or "browser" in getattr(item, "fixturenames", ()))


def _split(config: pytest.Config) -> bool:
    # A worker runs with ``dist`` reset to "no"; xdist keeps the choice in ``loadgroup``.
    return bool(config.getoption("dist", "no") == "loadgroup"
                or getattr(config.option, "loadgroup", False))


def pytest_configure(config: pytest.Config) -> None:
    if _split(config) and not hasattr(config, "workerinput"):
        # Groups are handed out in collection order, not largest first: the browser lane is
        # the longest, so it must start at once (it is first in the collection, below).
        config.option.loadscopereorder = False


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(
        config: pytest.Config, items: list[pytest.Item]) -> Generator[None, None, None]:
    # A wrapper: wrappers run before every plain hook, xdist's included, which reads the marks
    # to name each test's group.
    if _split(config):
        _group(items)
    return (yield)


def _group(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        group = BROWSER_GROUP if drives_chromium(item) else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
    # The browser lane first; the order within each lane is kept.
    items[:] = ([item for item in items if drives_chromium(item)]
                + [item for item in items if not drives_chromium(item)])
