"""Running crawlq's processes on this machine (``crawlq demo``, ``crawlq run``): children
started and always stopped, a progress line while consumers work, their logs' tails.

The console never imports the producer or the consumer: it runs them as processes, as
an operator would.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from common import codec
from common.config import CLI_REDIS_WAIT_S
from common.exitcodes import EXIT_REDIS
from common.queue import CrawlQueue, Stats
from common.redis.errors import REDIS_ERRORS, redis_error_message
from common.redis.server import RedisServer
from common.redis.startup import RedisGaveUpError, StartupWait
from common.urls.redact import redact_url
from console.local.logs import failure_line
from console.views.losses import OWN

__all__ = ["Children", "SigtermCancels", "dir_summary", "progress_line", "redis_failed",
           "redis_wait", "say", "stop_started", "tail", "watch"]

PROGRESS_EVERY_S = 0.5
PLAIN_PROGRESS_EVERY_S = 5.0
STOP_GRACE_S = 5.0


class Children:
    """The subprocesses a command started; ``stop()`` ends every one still running
    (SIGTERM, then SIGKILL after STOP_GRACE_S)."""

    def __init__(self) -> None:
        self.procs: dict[str, asyncio.subprocess.Process] = {}

    async def start(self, name: str, argv: Sequence[str], env: dict[str, str], log: Path,
                    stdout: int | None = None) -> asyncio.subprocess.Process:
        with log.open("wb") as sink:  # the child keeps its own copy of the descriptor
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=stdout if stdout is not None else sink, stderr=sink)
        self.procs[name] = proc
        return proc

    async def stop(self) -> None:
        running = [p for p in self.procs.values() if p.returncode is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in running:
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()


class SigtermCancels:
    """While open, SIGTERM (kill, docker stop) cancels the task that opened it, so the
    command ends through its ``finally`` and stops what it started, as on Ctrl-C.

    Python 3.11's asyncio.wait_for (redis-py's socket writes) drops a cancel that lands as
    the call it waits for completes: it cancels again every 0.2 s until `taken` (the
    command's ``except CancelledError`` says so) or `close`.
    """

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.main = asyncio.current_task()
        self.taken = False
        if self.main is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self.loop.add_signal_handler(signal.SIGTERM, self._cancel)

    def _cancel(self) -> None:
        if self.main is not None and not self.main.done() and not self.taken:
            self.main.cancel()
            self.loop.call_later(0.2, self._cancel)

    def interrupted(self, stopping: str) -> None:
        """The command's ``except CancelledError``: the cancel is taken; says what stops."""
        self.taken = True
        say(f"\ninterrupted: stopping {stopping}")

    def close(self) -> None:
        """SIGTERM is the default's again (the command is stopping anyway)."""
        self.taken = True
        with contextlib.suppress(NotImplementedError, RuntimeError):
            self.loop.remove_signal_handler(signal.SIGTERM)


async def stop_started(sigterm: SigtermCancels, children: Children,
                       server: RedisServer | None) -> None:
    """A command's last step, however it ends: SIGTERM the default again, its children
    stopped, then its embedded redis-server (`server`, if it started one)."""
    sigterm.close()
    await children.stop()
    if server is not None:
        await asyncio.to_thread(server.stop)


def redis_wait(redis_url: str, wait_s: float) -> StartupWait:
    """The wait of `crawlq run` / `crawlq demo` for their Redis at each start-up step
    (connect, the crawl's policy, the crawl): --redis-wait, or CLI_REDIS_WAIT_S; one line
    when it starts waiting."""
    said = False

    def waiting(step: str, exc: BaseException) -> None:
        nonlocal said
        if not said:
            said = True
            say(f"waiting for Redis at {redact_url(wait.url)} ({type(exc).__name__}); "
                f"giving up after {wait.limit_s:g}s (--redis-wait)")

    wait = StartupWait(redis_url, wait_s or CLI_REDIS_WAIT_S, on_wait=waiting)
    return wait


def redis_failed(command: str, exc: RedisGaveUpError | RedisError, redis_url: str) -> int:
    """Redis gone for a command's whole wait, or refusing it: one line on stderr, exit 3
    (a Redis error nobody explains is a bug: raised)."""
    said = str(exc) if isinstance(exc, RedisGaveUpError) else redis_error_message(
        exc, redis_url)
    if said is None:
        raise exc
    print(f"{command}: {said}", file=sys.stderr, flush=True)
    return EXIT_REDIS


def say(text: str = "") -> None:
    """A line for the operator, now."""
    print(text, flush=True)


def progress_line(elapsed: float, s: Stats, total: int | None = None) -> str:
    """One line of a crawl's state; `total` None: what was enqueued so far (a spider's
    crawl grows as it goes). crawlq's own soft-404 probes done are not counted."""
    probes = sum(s.counters.get(f"outcome:{code}", 0) for code in OWN)
    total = s.counters.get("enqueued", 0) - probes if total is None else total
    return (f"[{elapsed:5.1f}s] done {s.done - probes}/{total}  pending {s.pending}  "
            f"leased {s.leased}  waiting {s.waiting}  dead {s.dead}  "
            f"retried {s.counters.get('retried', 0)}")


def tail(path: Path, lines: int = 15) -> str:
    """The last `lines` of a log, indented."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in text[-lines:])


def dir_summary(path: Path) -> str:
    """How many files a directory holds and their size."""
    files = [p for p in path.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    return f"{len(files)} files, {size / 1e6:.1f} MB"


async def watch(children: Children, queue: CrawlQueue, *, total: int | None, timeout_s: float,
                started: float, logs: Path,
                notes: Callable[[], list[str]] = list) -> bool:
    """Show progress until every consumer exits, and the lines `notes` gives meanwhile
    (the consumers' warnings); False on a timeout or a failed consumer."""
    tty = sys.stdout.isatty()
    consumers = {n: p for n, p in children.procs.items() if n.startswith("consumer")}
    deadline = time.monotonic() + timeout_s
    next_plain = 0.0
    line = ""
    try:
        while any(p.returncode is None for p in consumers.values()):
            now = time.monotonic()
            if now > deadline:
                say(f"\nthe crawl did not finish within {timeout_s:g}s; stopping the consumers")
                return False
            for note in notes():
                say(f"\r\x1b[K{note}" if tty else note)
            try:  # the consumers wait out a Redis outage: so does the progress line
                line = progress_line(now - started, await queue.stats(), total)
            except REDIS_ERRORS:
                await asyncio.sleep(PROGRESS_EVERY_S)
                continue
            if tty:
                print(f"\r{line}\x1b[K", end="", flush=True)
            elif now >= next_plain:
                say(line)
                next_plain = now + PLAIN_PROGRESS_EVERY_S
            await asyncio.sleep(PROGRESS_EVERY_S)
    finally:
        if tty:
            print(flush=True)
    for note in notes():
        say(note)
    say(progress_line(time.monotonic() - started, await queue.stats(), total))
    failed = [(n, p.returncode) for n, p in consumers.items() if p.returncode != 0]
    told: dict[tuple[int | None, str], list[str]] = {}
    for name, code in failed:
        said = failure_line(logs / f"{name}.log")  # its error's advice, else its log's end
        if said is None:
            say(f"{name} exited with code {code}; the end of its log:\n"
                f"{tail(logs / f'{name}.log')}")
        else:
            told.setdefault((code, said), []).append(name)
    for (code, said), names in told.items():  # the same error of several: one line
        say(f"{', '.join(names)} exited with code {code}: {said}")
    return not failed


async def run_producer(children: Children, argv: Sequence[str], env: dict[str, str],
                       log: Path) -> dict[str, Any] | None:
    """Run the producer with `argv` to its end; its JSON summary, or None (said, with its
    log's tail) when it failed."""
    proc = await children.start("producer", [
        sys.executable, "-m", "producer", *argv, "--json", "--progress", "off"],
        env, log, stdout=asyncio.subprocess.PIPE)
    stdout, _ = await proc.communicate()
    try:
        summary = codec.loads(stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        summary = None
    if proc.returncode != 0 or not isinstance(summary, dict):
        say(f"the producer failed (exit {proc.returncode}); its log:\n{tail(log)}")
        return None
    return summary
