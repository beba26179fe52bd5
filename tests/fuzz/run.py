"""Coverage-guided fuzzing of every target in ``tests.fuzz.targets`` with atheris (libFuzzer).

::

    python -m tests.fuzz.run                      # every target, 100000 inputs each
    python -m tests.fuzz.run --runs 2000 sdp ptp  # some targets, fewer inputs
    python -m tests.fuzz.run --keep               # copy what breaks into tests/fuzz/cases/

Each target runs in its own process (libFuzzer owns the process it fuzzes), starting from the
target's seeds and its kept cases, with the product's modules instrumented for coverage. A
target fails when an input makes it raise anything but the product's refusal, exceed
``--timeout`` seconds, or grow the process past ``--rss-mb``. The table printed at the end is
what the fuzzing figures in docs/security.md come from; ``--json`` writes it for tools.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CASES = HERE / "cases"
MAX_LEN = 8192


@dataclass
class Result:
    target: str
    inputs: int
    findings: int
    seconds: float
    exit_code: int
    detail: str = ""


def fuzz_one(name: str, argv: list[str]) -> None:
    """In the child: instrument, then hand the process to libFuzzer."""
    import atheris  # type: ignore[import-untyped]

    with atheris.instrument_imports(include=["sfu_sidecar"]):
        from tests.fuzz.targets import TARGETS
    target = TARGETS[name]

    def test_one_input(data: bytes) -> None:
        target.run(data)

    atheris.Setup([sys.argv[0], *argv], test_one_input)
    atheris.Fuzz()


def run_target(name: str, runs: int, timeout_s: int, rss_mb: int, seed: int,
               keep: bool) -> Result:
    from tests.fuzz.targets import TARGETS

    with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as tmp:
        corpus, artifacts = Path(tmp, "corpus"), Path(tmp, "artifacts")
        corpus.mkdir()
        artifacts.mkdir()
        for i, data in enumerate(TARGETS[name].seeds()):
            Path(corpus, f"seed-{i}").write_bytes(data)
        kept = CASES / name
        if kept.is_dir():
            for case in kept.iterdir():
                shutil.copy(case, corpus / f"case-{case.name}")
        argv = [f"-runs={runs}", f"-max_len={MAX_LEN}", f"-timeout={timeout_s}",
                f"-rss_limit_mb={rss_mb}", f"-seed={seed}", "-print_final_stats=1",
                f"-artifact_prefix={artifacts}/", str(corpus)]
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "tests.fuzz.run", "--child", name, "--", *argv],
            cwd=ROOT, capture_output=True, text=True, errors="replace",
            timeout=max(600, runs // 20 + 300))
        seconds = time.monotonic() - started
        found = sorted(artifacts.iterdir())
        if keep and found:
            kept.mkdir(parents=True, exist_ok=True)
            for f in found:
                shutil.copy(f, kept / f.name)
        executed = re.search(r"stat::number_of_executed_units:\s*(\d+)", proc.stderr)
        detail = ""
        if proc.returncode != 0 or found:
            detail = (proc.stdout[-3000:] + proc.stderr[-3000:]).strip()
        return Result(name, int(executed.group(1)) if executed else 0, len(found), seconds,
                      proc.returncode, detail)


def table(results: list[Result]) -> str:
    lines = [f"{'target':<16} {'inputs':>9} {'findings':>8} {'seconds':>8} {'inputs/s':>9}"]
    for r in results:
        rate = r.inputs / r.seconds if r.seconds else 0.0
        lines.append(f"{r.target:<16} {r.inputs:>9} {r.findings:>8} {r.seconds:>8.1f} "
                     f"{rate:>9.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        fuzz_one(args[1], args[3:])
        return 0
    from tests.fuzz.targets import TARGETS

    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help=f"default: all of {', '.join(TARGETS)}")
    parser.add_argument("--runs", type=int, default=100_000, help="inputs per target")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take")
    parser.add_argument("--rss-mb", type=int, default=3072, help="memory limit of a target")
    parser.add_argument("--seed", type=int, default=1, help="libFuzzer's random seed")
    parser.add_argument("--keep", action="store_true",
                        help="copy inputs that break a target into tests/fuzz/cases/TARGET/")
    parser.add_argument("--json", type=Path, help="write the results here")
    opts = parser.parse_args(args)
    unknown = [t for t in opts.targets if t not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    if opts.runs < 1:
        parser.error("--runs must be at least 1")
    results = []
    for name in opts.targets or list(TARGETS):
        result = run_target(name, opts.runs, opts.timeout, opts.rss_mb, opts.seed, opts.keep)
        results.append(result)
        print(f"{name}: {result.inputs} inputs, {result.findings} findings, "
              f"exit {result.exit_code}, {result.seconds:.1f} s", file=sys.stderr, flush=True)
        if result.detail:
            print(result.detail, file=sys.stderr)
    print(table(results))
    if opts.json:
        opts.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    failed = [r for r in results if r.exit_code != 0 or r.findings]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
