# crawlq's image for consumers that render (crawlq-consumer --browser, docs/rendering.md):
# the same crawlq, with Debian's Chromium, Playwright's driver (its wheel carries no
# browser, and none is ever downloaded; its node needs libatomic1) and tini as PID 1,
# which reaps what a killed consumer's browser leaves.
#
#   docker build -f deploy/browser.Dockerfile -t crawlq-browser .
#   docker run --rm --init -e REDIS_URL=redis://redis:6379/0 --shm-size 1g crawlq-browser
#
# BASE_IMAGE must be Debian-based with Chromium in its archive (bookworm: chromium 13x+).
ARG BASE_IMAGE=python:3.12-slim

# -- build: a virtualenv at /opt/crawlq with crawlq, its dependencies and the browser extra
FROM ${BASE_IMAGE} AS build
ARG DEBIAN_FRONTEND=noninteractive
RUN if ! command -v python3 >/dev/null 2>&1; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/crawlq
WORKDIR /src
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; t = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
print("\n".join(t["dependencies"] + t["optional-dependencies"]["browser"]))' \
        > /tmp/requirements.txt \
    && /opt/crawlq/bin/pip install --only-binary=:all: -r /tmp/requirements.txt
COPY README.md ./
COPY common ./common
COPY producer ./producer
COPY consumer ./consumer
COPY console ./console
COPY crawlq ./crawlq
COPY examples /opt/crawlq/examples
RUN /opt/crawlq/bin/pip install --no-deps . \
    && /opt/crawlq/bin/crawlq-consumer --help >/dev/null \
    && /opt/crawlq/bin/python -c 'import playwright.async_api, psutil'

# -- final: the venv, Chromium and tini on a clean base ------------------------------------
FROM ${BASE_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends chromium tini fonts-liberation libatomic1 \
    && if ! command -v python3 >/dev/null 2>&1; then \
        apt-get install -y --no-install-recommends python3; \
    fi \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 crawlq \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin crawlq \
    && mkdir -p /output \
    && chown 10001:10001 /output
COPY --from=build /opt/crawlq /opt/crawlq
# CRAWLQ_BROWSER=auto: this image's consumers render (the chromium on the PATH). Chromium
# writes its profile under /tmp (a fresh one per browser): /tmp must be writable.
ENV PATH=/opt/crawlq/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CRAWLQ_OUTPUT=/output \
    CRAWLQ_BROWSER=auto \
    HOME=/tmp
WORKDIR /output
USER 10001:10001
EXPOSE 9410
HEALTHCHECK --interval=30s --timeout=10s --start-period=15s --retries=3 \
    CMD ["crawlq", "check"]
# tini is PID 1: it passes SIGTERM on to the consumer (which drains) and reaps the
# processes a killed consumer's browser leaves behind.
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["crawlq-consumer"]
