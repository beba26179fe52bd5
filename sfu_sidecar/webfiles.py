"""Where the pages, scripts and vendored libraries the service serves are found.

They are package data (``sfu_sidecar/web``), located through ``importlib.resources`` so an
installed wheel serves them exactly as a source checkout does. The service reads them as
plain files (aiohttp's ``FileResponse`` sends them with ``sendfile``), so an install that
cannot give a directory on disk (a zipped package) is refused at start-up with the reason.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def web_dir() -> Path:
    root = resources.files("sfu_sidecar").joinpath("web")
    path = Path(str(root))
    if not (path / "index.html").is_file():
        raise RuntimeError(
            f"the web client is missing from the installed package (looked in {path}); "
            "reinstall sfu-sidecar from a wheel or a source checkout")
    return path


WEB_DIR = web_dir()
