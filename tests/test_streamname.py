"""The stream-name rule every route, setting and store shares."""

from __future__ import annotations

import pytest

from sfu_sidecar.streamname import ROUTE_VARIABLE, RULE, is_stream_name


@pytest.mark.parametrize("name", ["a", "demo", "Room_1.en~x-2", "x" * 128])
def test_names_in_the_rule(name: str) -> None:
    assert is_stream_name(name)


@pytest.mark.parametrize("name", ["", "x" * 129, "a/b", "a b", "caf\u00e9", "a%20", "a\n", 7, None])
def test_names_outside_it(name: object) -> None:
    assert not is_stream_name(name)


def test_the_route_variable_and_the_message_say_the_same_rule() -> None:
    assert ROUTE_VARIABLE == "{stream:[A-Za-z0-9_.~-]{1,128}}"
    assert RULE == "1-128 characters of A-Z a-z 0-9 _ . ~ -"
