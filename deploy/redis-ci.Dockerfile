# A Redis image for the container test (tests/container/run.sh), where no registry can be
# reached: Debian's redis-server on the local debian:bookworm-slim base. Users run the
# official `redis` image from docker-compose.yml instead.
FROM debian:bookworm-slim
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data \
    && chown redis:redis /data
WORKDIR /data
USER redis
CMD ["redis-server", "--dir", "/data"]
