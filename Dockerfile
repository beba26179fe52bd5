# sfu-sidecar: the service alone. Every setting is an SFU_SIDECAR_* environment variable
# (README, Configuration); the ones set here suit a container and can be overridden at run time.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY sfu_sidecar ./sfu_sidecar
COPY web ./web
# With the redis extra, so SFU_SIDECAR_REDIS_URL works in the image (several nodes, one Redis).
RUN pip install ".[redis]" \
    # The viewer page and dashboard are served from a web/ folder beside the package; a
    # non-editable install leaves it behind, so put it where the installed package looks
    # (python -I: the installed package, not the source tree in this folder).
    && cp -r web "$(python -I -c 'from sfu_sidecar.app import WEB_DIR; print(WEB_DIR)')" \
    && rm -rf /src

RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin sidecar \
    && mkdir /data && chown sidecar:sidecar /data
WORKDIR /data

# Container defaults: listen on every interface, keep the caption store on the volume, and
# confine WebRTC and RTP tap sockets to a range small enough to publish (EXPOSE below). Set
# SFU_SIDECAR_ICE_ADDRESSES to the address clients reach (the host's public IP) unless the
# container runs with host networking.
ENV SFU_SIDECAR_HOST=0.0.0.0 \
    SFU_SIDECAR_PORT=8080 \
    SFU_SIDECAR_DATA_DIR=/data \
    SFU_SIDECAR_ICE_PORT_RANGE=40000-40099 \
    SFU_SIDECAR_LOG_FORMAT=json

VOLUME ["/data"]
EXPOSE 8080/tcp 40000-40099/udp

USER sidecar

HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('SFU_SIDECAR_PORT', '8080'), timeout=2)"]

ENTRYPOINT ["sfu-sidecar"]
CMD ["serve"]
