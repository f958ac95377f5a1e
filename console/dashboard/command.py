"""``crawlq dashboard``: serve the web dashboard until SIGINT / SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from aiohttp import web

from common.config import Option
from common.redis.connection import RedisClient
from console.dashboard.app import make_app
from console.dashboard.security import check_bind

log = logging.getLogger("dashboard")

DASHBOARD_OPTIONS = (
    Option("--http-host", "CRAWLQ_DASHBOARD_HOST", "127.0.0.1",
           "listen on this address; anything but loopback needs --token"),
    Option("--http-port", "CRAWLQ_DASHBOARD_PORT", 9420, "listen on this port", type=int),
    Option("--token", "CRAWLQ_DASHBOARD_TOKEN", None,
           "allow actions (pause, resume, host settings and blocks, dead-letter requeue "
           "and purge, policy changes) to requests that carry this token; without it the "
           "dashboard is read-only", secret=True),
)


async def cmd_dashboard(args: argparse.Namespace, client: RedisClient) -> int:
    """Serve the dashboard over `client` until a signal; 0 when stopped."""
    token = args.token or None
    check_bind(args.http_host, token)
    await client.ping()  # fail now, with the CLI's Redis message, rather than per page
    runner = web.AppRunner(make_app(client, token=token, bind_host=args.http_host),
                           access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, args.http_host, args.http_port)
        await site.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        host = f"[{args.http_host}]" if ":" in args.http_host else args.http_host
        log.info("dashboard_started", extra={
            "url": f"http://{host}:{args.http_port}/",
            "actions": "on (token set)" if token else "off (read-only)"})
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0

