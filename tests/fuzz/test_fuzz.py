"""Every fuzz target, bounded: its seeds and kept cases replayed, then coverage-guided inputs.

The long mode (``python -m tests.fuzz.run``, 100000 inputs per target) is for local runs; the
figures of its last run are in docs/security.md (Fuzzing). Here each target gets ``FUZZ_RUNS``
inputs (default 2000) in a child process under libFuzzer, and every input that ever broke a
target, kept in ``tests/fuzz/cases/<target>/``, must now pass in this process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fuzz import http_targets
from tests.fuzz.run import CASES, run_target
from tests.fuzz.targets import TARGETS

RUNS = int(os.environ.get("FUZZ_RUNS", "2000"))


@pytest.fixture(scope="module", autouse=True)
def _stop_server() -> Iterator[None]:
    yield
    http_targets.stop()


def kept(name: str) -> list[Path]:
    folder = CASES / name
    return sorted(folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize("name", list(TARGETS))
def test_seeds_and_kept_cases_pass(name: str) -> None:
    target = TARGETS[name]
    seeds = target.seeds()
    assert seeds, "a target starts from at least one valid input"
    for data in seeds:
        target.run(data)
    for case in kept(name):
        target.run(case.read_bytes())


@pytest.mark.parametrize("name", list(TARGETS))
def test_coverage_guided_inputs_find_nothing(name: str) -> None:
    result = run_target(name, RUNS, timeout_s=10, rss_mb=3072, seed=1, keep=False)
    assert result.exit_code == 0 and result.findings == 0, result.detail
    # libFuzzer stops once it has run at least that many (a fresh-clone run of the HTTP
    # target, whose server answers on another thread, once counted 2007 for 2000).
    assert result.inputs >= RUNS, result
