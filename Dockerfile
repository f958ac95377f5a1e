# One image for every crawlq command: the consumer (default), the producer and `crawlq`.
#
#   docker build -t crawlq .                                        # official Python base
#   docker build --build-arg BASE_IMAGE=debian:bookworm-slim -t crawlq .   # plain Debian
#
#   docker run --rm -e REDIS_URL=redis://redis:6379/0 crawlq                      # consumer
#   docker run --rm -e REDIS_URL=... -v "$PWD/data:/data:ro" crawlq crawlq-producer /data/urls.txt
#   docker run --rm -e REDIS_URL=... crawlq crawlq stats
#   docker run --rm -e REDIS_URL=... -e CRAWLQ_SPIDER=/spiders/shop.py \
#       -v "$PWD/spiders:/spiders:ro" crawlq                         # a spider's consumer
#
# BASE_IMAGE must be Debian-based. An image without python3 (plain Debian) gets Debian's
# python3 (3.11 on bookworm) from apt in both stages; crawlq needs Python >= 3.11. Every
# dependency ships manylinux wheels, so neither stage needs a compiler.
ARG BASE_IMAGE=python:3.12-slim

# -- build: a virtualenv at /opt/crawlq with crawlq and its dependencies ------------------
FROM ${BASE_IMAGE} AS build
ARG DEBIAN_FRONTEND=noninteractive
RUN if ! command -v python3 >/dev/null 2>&1; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -c 'import sys; assert sys.version_info >= (3, 11), \
        f"crawlq needs Python >= 3.11, BASE_IMAGE has {sys.version.split()[0]}"'
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/crawlq
WORKDIR /src
# Dependencies first, from pyproject.toml alone: this layer survives code changes.
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; \
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt \
    && /opt/crawlq/bin/pip install --only-binary=:all: -r /tmp/requirements.txt
COPY README.md ./
COPY common ./common
COPY producer ./producer
COPY consumer ./consumer
COPY console ./console
COPY crawlq ./crawlq
# The example spiders, for `--spider /opt/crawlq/examples/demo_spider.py`; a spider of
# your own is mounted (-v "$PWD/spiders:/spiders:ro") and named by its path the same way.
COPY examples /opt/crawlq/examples
# crawlq itself is pure Python, built here with setuptools; its dependencies are in already.
RUN /opt/crawlq/bin/pip install --no-deps . \
    && /opt/crawlq/bin/crawlq --help >/dev/null \
    && /opt/crawlq/bin/crawlq-producer --help >/dev/null \
    && /opt/crawlq/bin/crawlq-consumer --help >/dev/null \
    && /opt/crawlq/bin/python -c 'from crawlq import Spider, Request, Item'

# -- final: the venv on a clean base, no build tools --------------------------------------
FROM ${BASE_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
# Only the interpreter: the venv was created in the build stage.
RUN if ! command -v python3 >/dev/null 2>&1; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --gid 10001 crawlq \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin crawlq \
    && mkdir -p /output \
    && chown 10001:10001 /output
COPY --from=build /opt/crawlq /opt/crawlq
ENV PATH=/opt/crawlq/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CRAWLQ_OUTPUT=/output
WORKDIR /output
USER 10001:10001
# /healthz, /readyz, /metrics (the consumer binds 127.0.0.1 unless CRAWLQ_HTTP_HOST says
# otherwise: set CRAWLQ_HTTP_HOST=0.0.0.0 for probes from outside the container).
EXPOSE 9410
# Exit 0 when Redis answers; with CRAWLQ_CHECK_HTTP_URL set (for example
# http://127.0.0.1:9410/healthz on a consumer) that URL must answer too.
HEALTHCHECK --interval=30s --timeout=10s --start-period=15s --retries=3 \
    CMD ["crawlq", "check"]
# Exec form, no shell in between: SIGTERM goes straight to Python, which drains.
CMD ["crawlq-consumer"]
