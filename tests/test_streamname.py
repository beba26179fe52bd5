"""The stream-name rule every route, setting and store shares."""

from __future__ import annotations

import pytest

from sfu_sidecar.streamname import is_stream_name


@pytest.mark.parametrize("name", ["a", "demo", "Room_1.en~x-2", "x" * 128])
def test_names_in_the_rule(name: str) -> None:
    assert is_stream_name(name)


@pytest.mark.parametrize("name", ["", "x" * 129, "a/b", "a b", "caf\u00e9", "a%20", "a\n", 7, None])
def test_names_outside_it(name: object) -> None:
    assert not is_stream_name(name)

