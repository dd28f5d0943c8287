# Local stand-ins for Flower's official images, for machines that cannot pull from Docker Hub.
# Built only by `fedvit deploy base-images` when the official images cannot be pulled (it says so); never used
# otherwise. What Flower's images provide and the compose file relies on is reproduced: flwr from PyPI in a venv
# at /python/venv, user `app` (UID 49999) owning /app, WORKDIR and HOME /app, and one entrypoint per image
# (flower-superlink / flower-supernode / flower-superexec, one build target each).
# Differences: the OS is Debian 12 (from `mmdebstrap`, `docker import`ed as ROOTFS) and Python is Debian's 3.11,
# whatever the tag's name says; the host's CA bundle is baked in so pip works behind the host's TLS proxy.
ARG ROOTFS=fedvit/debian-rootfs:bookworm
FROM ${ROOTFS} AS base

ARG FLWR_VERSION=1.41.0
COPY host-ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV PATH=/python/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONIOENCODING=UTF-8 \
    LANG=C.UTF-8 \
    LC_ALL=C.UTF-8
RUN useradd --no-create-home --home-dir /app -c "" --uid 49999 app \
    && mkdir -p /app \
    && python3 -m venv /python/venv \
    && /python/venv/bin/pip install --no-cache-dir "flwr==${FLWR_VERSION}" \
    && chown -R app:app /app /python/venv
LABEL org.fedvit.stand-in="Debian 12 + PyPI flwr==${FLWR_VERSION}; built by fedvit deploy base-images"
WORKDIR /app
USER app
ENV HOME=/app

FROM base AS superlink
ENTRYPOINT ["flower-superlink"]

FROM base AS supernode
ENTRYPOINT ["flower-supernode"]

FROM base AS superexec
ENTRYPOINT ["flower-superexec"]
