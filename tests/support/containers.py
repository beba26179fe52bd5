"""Containers with podman: the images the Dockerfiles name, built here when they cannot be pulled.

No Docker engine runs here and no registry can be reached, so the base images are stand-ins
made once per machine and kept (``podman image exists`` first): Debian bookworm from debootstrap
as ``debian:bookworm-slim``, and on it Debian's Python 3.11 in a venv at ``/usr/local`` (where
the official image keeps ``python`` and ``pip``) as ``python:3.11-slim-bookworm``. pip inside a
build reaches the package index only with this machine's CA bundle, which the stand-in carries.

Podman runs as root with chroot isolation for builds and runc with cgroupfs for containers
(crun fails on this machine's hybrid cgroups), host networking (the relay's UDP works through
the container as through a local process) and explicit rlimits (runc cannot raise them).
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEBIAN = "docker.io/library/debian:bookworm-slim"
PYTHON = "docker.io/library/python:3.11-slim-bookworm"
MIRROR = "http://deb.debian.org/debian"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# One build of the base images at a time on the machine (flake-check runs, two lanes).
LOCK = Path("/tmp/sfu-sidecar-images.lock")
RUN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
RUN_LIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]

PYTHON_CONTAINERFILE = f"""\
FROM {DEBIAN}
RUN apt-get update \\
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \\
    && rm -rf /var/lib/apt/lists/* \\
    && python3 -m venv /usr/local
COPY host-ca.crt /etc/ssl/certs/host-ca.crt
ENV PIP_CERT=/etc/ssl/certs/host-ca.crt
"""


def podman(*args: str, timeout: float = 600, check: bool = True,
           runtime: bool = False) -> subprocess.CompletedProcess[str]:
    command = [*(RUN if runtime else ["podman"]), *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc


def exists(image: str) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


def build(context: Path, tag: str, containerfile: Path | None = None,
          timeout: float = 900) -> None:
    """``podman build`` as it works here: chroot isolation, host network, nothing pulled, and
    Docker's format (an OCI image drops ``HEALTHCHECK``)."""
    args = ["build", "--isolation", "chroot", "--network", "host", "--pull=never",
            "--format", "docker", "-t", tag]
    if containerfile is not None:
        args += ["-f", str(containerfile)]
    podman(*args, str(context), timeout=timeout)


def ensure_base_images() -> None:
    """The stand-ins for the base images, made once per machine."""
    LOCK.touch(exist_ok=True)
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not exists(DEBIAN):
            with tempfile.TemporaryDirectory(prefix="debian-rootfs-") as rootfs:
                subprocess.run(["debootstrap", "--variant=minbase", "bookworm", rootfs, MIRROR],
                               check=True, capture_output=True, timeout=900)
                tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
                assert tar.stdout is not None
                try:
                    subprocess.run(["podman", "import", "-", DEBIAN], stdin=tar.stdout,
                                   check=True, capture_output=True, timeout=300)
                finally:
                    tar.stdout.close()  # tar gets SIGPIPE rather than blocking if import failed
                    if tar.wait(60) != 0:
                        raise AssertionError("tar of the bookworm root file system failed")
        if not exists(PYTHON):
            with tempfile.TemporaryDirectory(prefix="python-image-") as tmp:
                folder = Path(tmp)
                (folder / "Containerfile").write_text(PYTHON_CONTAINERFILE)
                (folder / "host-ca.crt").write_bytes(HOST_CA.read_bytes())
                build(folder, PYTHON, folder / "Containerfile")


def inspect(what: str, name: str) -> Any:
    return json.loads(podman(what, "inspect", name).stdout)[0]


@contextmanager
def running(image: str, name: str, *args: str) -> Iterator[str]:
    """A detached container of ``image`` (``args`` go before the image: env, volumes), removed
    on exit with its logs printed if the block failed."""
    podman("rm", "-f", name, check=False)
    podman("run", "-d", "--name", name, "--network", "host", *RUN_LIMITS, *args, image,
           runtime=True)
    try:
        yield name
    except BaseException:
        print("--- container log (end)\n" + podman("logs", name, check=False).stdout[-3000:]
              + podman("logs", name, check=False).stderr[-3000:])
        raise
    finally:
        # -v: with the anonymous volume the image's VOLUME made for it.
        podman("rm", "-f", "-v", "-t", "2", name, check=False, runtime=True)


COTURN = "docker.io/coturn/coturn:4.6"
COTURN_CONTAINERFILE = f"""\
FROM {DEBIAN}
RUN apt-get update \\
    && apt-get install -y --no-install-recommends coturn \\
    && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["turnserver"]
"""
# The images docker-compose.yml names, by the names podman resolves them to locally.
COMPOSE_IMAGES = {
    "sidecar": "localhost/sfu-sidecar:latest",
    "janus": "localhost/sfu-sidecar-janus:latest",
    "ptp4l": "localhost/sfu-sidecar-ptp4l:latest",
}


def ensure_compose_images(root: Path) -> None:
    """The compose file's images: its own built from this checkout (cached layers make a
    rebuild of an unchanged one quick), coturn's stand-in from Debian's package once."""
    ensure_base_images()
    build(root, COMPOSE_IMAGES["sidecar"])
    build(root / "deploy" / "janus", COMPOSE_IMAGES["janus"])
    build(root / "deploy" / "ptp", COMPOSE_IMAGES["ptp4l"])
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not exists(COTURN):
            with tempfile.TemporaryDirectory(prefix="coturn-image-") as tmp:
                folder = Path(tmp)
                (folder / "Containerfile").write_text(COTURN_CONTAINERFILE)
                build(folder, COTURN, folder / "Containerfile")


def engine_conf(folder: Path) -> Path:
    """A containers.conf for podman-compose's podman: runc with cgroupfs and rlimits it can
    set, as :data:`RUN` and :data:`RUN_LIMITS` give a direct ``podman run``."""
    conf = folder / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]\n'
                    '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n')
    return conf
