"""A parent's children handed from one consumer process to another: the children's host is
blocked while a first consumer does the parent, so a second, fresh process takes them (and
only what the task carries, its label and data, can tell it what they are)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from common.frontier.hosts import Frontier
from common.queue import LeasingQueue


async def until(check: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    """Wait for `check` to come true, at most `within` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def hand_over_children(
        queue: LeasingQueue, children_url: str, logs: Path, parent: str,
        start: Callable[[str], Awaitable[asyncio.subprocess.Process]]) -> None:
    """Run consumer ``w-parent`` (`start` by worker id; its log at `logs`/<worker>.log)
    with `children_url`'s host blocked until the `parent` is done with 2 children pending,
    stop it, then run ``w-child`` to the end with the host open again."""
    procs: list[asyncio.subprocess.Process] = []
    try:
        front = Frontier(queue)
        host = await front.block_host(children_url, 600)
        procs.append(await start("w-parent"))

        async def parent_done() -> bool:
            assert procs[0].returncode is None, (logs / "w-parent.log").read_text()
            stats = await queue.stats()
            return stats.counters.get("done", 0) == 1 and stats.pending == 2
        await until(parent_done, 30, f"the {parent} to be done with 2 children pending")
        procs[0].send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(procs[0].wait(), 20) == 0
        await front.block_host(host, 0)
        procs.append(await start("w-child"))
        assert await asyncio.wait_for(procs[1].wait(), 30) == 0, \
            (logs / "w-child.log").read_text()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
