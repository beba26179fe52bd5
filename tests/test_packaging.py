"""The package as a user gets it: built, checked, installed from its wheel, and run.

A copy of the checkout (the checkout itself is left as it was: no ``build/``, no egg-info) is
built with ``python -m build`` into an sdist and a wheel, both pass ``twine check``, the wheel
holds every file of the package (the web client under ``sfu_sidecar/web`` included) and the sdist
the package and its metadata only. The wheel is then installed with pip, not editable, into a
fresh virtual environment outside the source tree; pip installs no build tool with it. From a
working directory outside the tree, the installed ``sfu-sidecar`` says the wheel's version, and
its ``demo`` serves every page, every script a page loads (followed through the module imports)
and every other file of the web client byte for byte as the source tree holds it, with
``/healthz`` reporting the same version. The demo stops cleanly on SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, free_port

# Top-level entries of the checkout that are no part of the source: environments, caches,
# build output, node modules, the data folder.
NOT_SOURCE = {".venv", "node_modules", ".git", ".cache", "build", "dist", "data",
              ".mypy_cache", ".ruff_cache", ".pytest_cache"}
# Distributions that build a package; none of them is a dependency of the installed one.
BUILD_TOOLS = {"setuptools", "wheel", "build", "pyproject-hooks", "twine", "flit-core",
               "hatchling", "poetry-core", "pip"}
# What an sdist may hold at its top: the package, its metadata and what setuptools adds.
SDIST_TOP = {"PKG-INFO", "setup.cfg", "pyproject.toml", "README.md", "MANIFEST.in",
             "sfu_sidecar", "sfu_sidecar.egg-info"}
PAGES = {"/": "index.html", "/publish": "publish.html", "/dashboard": "dashboard.html"}
_SCRIPT_SRC = re.compile(r"""<script\b[^>]*\bsrc=["']([^"']+)["']""")
_IMPORT = re.compile(r"""(?:\bfrom|\bimport)\s*\(?\s*["']([^"'\s]+\.m?js)["']""")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _env() -> dict[str, str]:
    """This process's environment less what would point a child at the checkout's venv or set
    the service's settings (pip's own configuration, the package index, stays)."""
    drop = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE"}
    return {k: v for k, v in os.environ.items()
            if k not in drop and not k.startswith("SFU_SIDECAR_")}


def _run(argv: list[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                         env=_env(), **kwargs)
    assert out.returncode == 0, f"{argv} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    return out


def _package_files(src: Path) -> set[str]:
    """Every file of the package in ``src`` as a wheel names it (``sfu_sidecar/...``)."""
    return {f.relative_to(src).as_posix() for f in (src / "sfu_sidecar").rglob("*")
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"}


def _copy_source(dest: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        top = NOT_SOURCE if Path(folder) == ROOT else set()
        return {n for n in names
                if n in top or n == "__pycache__" or n.endswith((".egg-info", ".pyc"))}

    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read()


def _referenced(base: str, path: str, body: bytes) -> set[str]:
    """Same-origin paths of the scripts a page loads or the modules a script imports."""
    pattern = _SCRIPT_SRC if path in PAGES else _IMPORT
    refs = set()
    for ref in pattern.findall(body.decode()):
        url = urllib.parse.urlsplit(urllib.parse.urljoin(base + path, ref))
        if f"{url.scheme}://{url.netloc}" == base:
            refs.add(url.path)
    return refs


def _wait_healthy(proc: subprocess.Popen[bytes], base: str, log: Path,
                  timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"demo exited {proc.returncode}:\n{log.read_text()}"
        try:
            status, body = _get(base + "/healthz")
            if status == 200:
                health: dict[str, Any] = json.loads(body)
                return health
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"demo did not answer /healthz in {timeout} s:\n{log.read_text()}")


@pytest.mark.timeout(600)
@pytest.mark.system
def test_wheel_installs_into_a_fresh_venv_and_serves_the_web_client(
    tmp_path: Path, record_property: Any,
) -> None:
    assert not tmp_path.is_relative_to(ROOT)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    timings: dict[str, float] = {}

    # --- build the sdist and the wheel from a copy of the checkout ---------------------------
    started = time.monotonic()
    src, dist = tmp_path / "src", tmp_path / "dist"
    _copy_source(src)
    _run([sys.executable, "-m", "build", "--outdir", dist, src], cwd=tmp_path)
    timings["build_s"] = time.monotonic() - started
    wheel = dist / f"sfu_sidecar-{version}-py3-none-any.whl"
    sdist = dist / f"sfu_sidecar-{version}.tar.gz"
    assert sorted(dist.iterdir()) == sorted([wheel, sdist])
    _run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist])

    package = _package_files(src)
    web = {f for f in package if f.startswith("sfu_sidecar/web/")}
    assert {"sfu_sidecar/py.typed", "sfu_sidecar/web/index.html", "sfu_sidecar/web/publish.html",
            "sfu_sidecar/web/dashboard.html"} <= package
    assert any(f.startswith("sfu_sidecar/web/js/") for f in web)
    with zipfile.ZipFile(wheel) as zf:
        in_wheel = set(zf.namelist())
    assert not package - in_wheel, f"missing from the wheel: {sorted(package - in_wheel)}"
    assert {f for f in in_wheel if not f.startswith(f"sfu_sidecar-{version}.dist-info/")} \
        == package, "the wheel holds files that are not the package's"
    with tarfile.open(sdist) as tf:
        in_sdist = {m.name.split("/", 1)[1] for m in tf.getmembers()
                    if "/" in m.name and m.isfile()}
    assert not package - in_sdist, f"missing from the sdist: {sorted(package - in_sdist)}"
    assert {f.split("/", 1)[0] for f in in_sdist} <= SDIST_TOP, sorted(in_sdist)

    # --- install the wheel, not editable, into a fresh venv outside the tree ------------------
    started = time.monotonic()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])
    py, exe = venv / "bin" / "python", venv / "bin" / "sfu-sidecar"

    def installed() -> dict[str, str]:
        rows = json.loads(_run([py, "-m", "pip", "list", "--format=json"]).stdout)
        return {_norm(r["name"]): r["version"] for r in rows}

    before = installed()
    report = tmp_path / "pip-report.json"
    _run([py, "-m", "pip", "install", "--report", report, wheel], cwd=tmp_path)
    timings["install_s"] = time.monotonic() - started
    items = json.loads(report.read_text())["install"]
    pulled = {_norm(i["metadata"]["name"]): i for i in items}
    ours = pulled["sfu-sidecar"]
    assert ours["metadata"]["version"] == version
    assert ours["download_info"]["url"] == wheel.as_uri()
    assert not ours["download_info"].get("dir_info", {}).get("editable", False)
    assert not BUILD_TOOLS & set(pulled), f"pip installed build tools: {BUILD_TOOLS & set(pulled)}"
    after = installed()
    assert {n for n in after if after[n] != before.get(n)} == set(pulled)

    # The installed package, found from outside the tree (-I: no cwd or user site on the path).
    cwd = tmp_path / "run"
    cwd.mkdir()
    where = _run([py, "-I", "-c", "import sfu_sidecar, sfu_sidecar.webfiles as w; "
                  "print(sfu_sidecar.__file__); print(w.WEB_DIR)"], cwd=cwd).stdout.split()
    site = Path(_run([py, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     cwd=cwd).stdout.strip())
    assert [Path(p) for p in where] == [site / "sfu_sidecar" / "__init__.py",
                                        site / "sfu_sidecar" / "web"]
    assert _run([exe, "--version"], cwd=cwd).stdout == f"sfu-sidecar {version}\n"

    # --- run the installed demo and fetch the web client --------------------------------------
    started = time.monotonic()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(exe), "demo", "--host", "127.0.0.1", "--port", str(port),
             "--data-dir", str(tmp_path / "data"), "--ice-addresses", "127.0.0.1"],
            cwd=cwd, env=_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        health = _wait_healthy(proc, base, log)
        assert health["status"] == "ok" and health["version"] == version
        queue, fetched = list(PAGES), set()
        while queue:
            path = queue.pop()
            if path in fetched:
                continue
            fetched.add(path)
            status, body = _get(base + path)
            name = PAGES.get(path) or path.lstrip("/")
            assert status == 200, path
            assert body == (src / "sfu_sidecar" / "web" / name).read_bytes(), path
            queue.extend(_referenced(base, path, body) - fetched)
        scripts = fetched - set(PAGES)
        assert {"/js/viewer.js", "/js/publish.js", "/js/dashboard.js"} <= scripts
        # The rest of the web client (modules no page loads, licences) is served as well.
        for f in sorted(web):
            path = "/" + f.removeprefix("sfu_sidecar/web/")
            if f.endswith(".html") or path in fetched:
                continue
            status, body = _get(base + path)
            assert status == 200 and body == (src / f).read_bytes(), path
        timings["serve_s"] = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
    assert code == 0, f"demo exited {code} on SIGTERM (None: ignored it):\n{log.read_text()}"

    for key, seconds in timings.items():
        record_property(key, round(seconds, 1))
    record_property("wheel_bytes", wheel.stat().st_size)
    print(f"wheel {wheel.name}: {wheel.stat().st_size} bytes; "
          + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
