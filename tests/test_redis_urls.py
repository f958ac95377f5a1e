"""Redis URLs: the forms taken (common/redis/url.py), and a wrong one is one line on stderr
and exit 2 in every command that takes one, before anything connects, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import ConfigError
from common.exitcodes import EXIT_REDIS
from common.redis.connection import connect, open_redis
from common.redis.server import free_port
from common.redis.url import check_redis_url, parse_sentinel

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("url", "said"), [
    ("redis+sentinel://127.0.0.1:26379", "names no master"),
    ("redis+sentinel://127.0.0.1:26379/", "names no master"),
    ("redis+sentinel://127.0.0.1:26379,127.0.0.1:x/m", "port 'x' of Sentinel"),
    ("redis+sentinel://127.0.0.1/m", "is not host:port"),
    ("redis+sentinel://127.0.0.1:26379/m/zero", "is not /<master name>[/<db>]"),
    ("redis+sentinel:///m", "names no Sentinel"),
    ("sentinel://127.0.0.1:26379/m", "scheme 'sentinel'"),
    ("127.0.0.1:6379", "no scheme"),
    ("redis://127.0.0.1:99999/0", "port '99999'"),
    ("redis://127.0.0.1:6379/x", "database 'x'"),
    ("redis://127.0.0.1:6379/0?sockettimeout=2", "unknown option 'sockettimeout'"),
    ("redis://127.0.0.1:6379/0?socket_timeout=soon", "socket_timeout"),
    ("redis://127.0.0.1:1,127.0.0.1:2/0", "need redis+sentinel://"),
    ("redis://", "names no host"),
])
def test_a_wrong_url_is_one_config_error(url: str, said: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check_redis_url(url)
    assert said in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(ConfigError):
        connect(url)


@pytest.mark.parametrize("url", [
    "redis://localhost:6379/0", "redis://u:p@[::1]:6379/2", "rediss://h:6380/0?ssl_cert_reqs=none",
    "unix:///tmp/redis.sock", "redis+sentinel://a:26379,b:26380/main/3?socket_timeout=2",
    "rediss+sentinel://u:p@a:26379/main?sentinel_password=s&ssl_cert_reqs=none",
])
def test_the_forms_taken(url: str) -> None:
    check_redis_url(url)


def test_a_sentinel_url_taken_apart() -> None:
    url = parse_sentinel("rediss+sentinel://crawler:s%40cret@s1:26379,[::1]:26380/main/3"
                         "?socket_timeout=2&sentinel_password=pw&ssl_cert_reqs=none")
    assert url.sentinels == (("s1", 26379), ("::1", 26380))
    assert url.master == "main"
    assert url.kwargs == {"username": "crawler", "password": "s@cret", "db": 3,
                          "socket_timeout": 2.0, "ssl": True, "ssl_cert_reqs": "none"}
    assert url.sentinel_kwargs == {"password": "pw", "ssl": True, "ssl_cert_reqs": "none"}


async def test_open_redis_refuses_a_wrong_url_before_connecting() -> None:
    with pytest.raises(ConfigError, match="names no master"):
        await open_redis("redis+sentinel://127.0.0.1:1/")


COMMANDS = {
    "producer": [sys.executable, "-m", "producer", "--dry-run"],
    "consumer": [sys.executable, "-m", "consumer", "--http-port", "-1"],
    "crawlq": [sys.executable, "-c", "import sys; from console.cli import main; "
               "sys.exit(main())", "stats"],
    "dashboard": [sys.executable, "-c", "import sys; from console.cli import main; "
                  "sys.exit(main())", "dashboard"],
}


@pytest.mark.integration
@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(("how", "url"), [
    ("flag", "redis+sentinel://127.0.0.1:26379"),
    ("env", "rediss://u:secret@127.0.0.1:70000/0"),
])
def test_every_command_exits_2_with_one_line(command: str, how: str, url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRAWLQ_", "REDIS_"))}
    env["PYTHONPATH"] = str(ROOT)
    argv = list(COMMANDS[command])
    if how == "flag":
        argv += ["--redis-url", url]
    else:
        env["REDIS_URL"] = url
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert ("names no master" if how == "flag" else "port '70000'") in lines[0]
    assert "secret" not in done.stderr


async def test_waiting_for_replicas_is_refused_with_a_cluster_before_connecting() -> None:
    with pytest.raises(ConfigError, match="not with a Redis Cluster"):
        await open_redis("redis://127.0.0.1:1/0", cluster=True, wait_replicas=1)


@pytest.mark.integration
@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--redis-wait-replicas", "-1", "must be at least 0"),
    ("--redis-wait-timeout", "0", "must be at least 0.001"),
])
def test_a_wrong_wait_setting_exits_2_with_one_line(flag: str, value: str, said: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRAWLQ_", "REDIS_"))}
    done = subprocess.run([*COMMANDS["consumer"], flag, value], env=env | {
        "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr


@pytest.mark.integration
def test_sentinels_that_dont_answer_are_one_line_and_exit_3() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRAWLQ_", "REDIS_"))}
    url = f"redis+sentinel://crawler:s3cr3t@127.0.0.1:{free_port()}/main"
    done = subprocess.run([sys.executable, "-m", "producer", "--redis-url", url, "-",
                           "--redis-wait", "1s"],
                          env=env | {"PYTHONPATH": str(ROOT)}, input="", capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == EXIT_REDIS, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach Redis" in lines[0], done.stderr
    assert "answered with a primary named 'main'" in lines[0] and "s3cr3t" not in done.stderr
