"""Documentation promises that must stay true: the settings table in docs/configuration.md,
and the test and demo commands README.md prints."""

from __future__ import annotations

import re
from pathlib import Path

from sfu_sidecar.config import settings_table_markdown

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()


def test_settings_table_matches_settings() -> None:
    match = re.search(
        r"<!-- settings-table:start[^>]*-->\n(.*?)<!-- settings-table:end -->", CONFIGURATION,
        re.S,
    )
    assert match, "docs/configuration.md lacks the settings table markers"
    assert match.group(1) == settings_table_markdown(), (
        "the settings table in docs/configuration.md is stale: regenerate it with "
        "python -c 'from sfu_sidecar.config import settings_table_markdown as t; print(t())'"
    )


def test_ci_runs_the_readme_test_command() -> None:
    block = re.search(r"Run the tests.*?```sh\n(.*?)\n```", README, re.S)
    assert block
    test_command = block.group(1).split("&&")[-1].strip()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci


def test_readme_shows_the_demo_command() -> None:
    assert "sfu-sidecar demo" in README
