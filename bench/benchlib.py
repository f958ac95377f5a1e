"""What the benchmarks share: reading a process's CPU, waiting for a port, installing a
Debian package they need (nginx, python3-doc) when it is missing, the python3-doc tree,
an nginx config, child processes started and stopped together, and a run in a temporary
directory that stops what it started however it ends."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]  # the checkout: where crawlq's commands run
#: Debian's python3-doc: a real HTML tree (~530 pages) for the benches that crawl one.
DOC_ROOT = Path("/usr/share/doc/python3-doc/html")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (/proc/<pid>/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    """Wait until something listens on 127.0.0.1:port (SystemExit if `proc` exits first
    or after 15 s)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port}")


def apt_install(package: str) -> None:
    """apt-get install -y `package` (an apt-get update first if that fails)."""
    print(f"installing {package} (apt-get install -y {package}) ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", package]
    if subprocess.run(cmd, env=env, check=False, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=False, capture_output=True)
        subprocess.run(cmd, env=env, check=False, capture_output=True)


def which_nginx(install: bool = False) -> str | None:
    """nginx on PATH or in /usr/sbin; with `install`, apt-get installs it when missing."""
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if found is None and install:
        apt_install("nginx")
        found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    return found


def doc_root(root: Path | None) -> Path:
    """`root`, or python3-doc's tree (apt-get installed when missing); it must hold
    index.html (SystemExit otherwise)."""
    if root is None:
        if not (DOC_ROOT / "index.html").exists():
            apt_install("python3-doc")
        root = DOC_ROOT
    if not (root / "index.html").is_file():
        raise SystemExit(f"{root}/index.html not found (give --root an HTML tree)")
    return root.resolve()


def nginx_conf(directory: Path, port: int, *, http: str = "", server: str,
               workers: int = 1) -> str:
    """A foreground nginx config whose files all live in `directory`, serving on
    127.0.0.1:`port`: `http` adds to its http block (logging, types), `server` is what
    its server block serves."""
    return f"""\
worker_processes {workers};
daemon off;
master_process on;
pid {directory}/nginx.pid;
error_log {directory}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    client_body_temp_path {directory}/body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
{http}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
{server}
    }}
}}
"""


# -- arguments ----------------------------------------------------------------------------


def add_server_args(p: argparse.ArgumentParser) -> None:
    """The hidden flags a bench passes to itself to run its own server as a child process
    (``--serve --port P --out FILE``)."""
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)


def parse_with_profile(p: argparse.ArgumentParser, argv: list[str] | None,
                       quick: dict[str, object], full: dict[str, object]) -> argparse.Namespace:
    """Parse `argv`; each option left unset (None) takes its value from the ``--quick``
    profile or the full one."""
    args = p.parse_args(argv)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


# -- processes: every one a bench starts, stopped on exit --------------------------------


STARTED: list[subprocess.Popen[bytes]] = []


def spawn(argv: list[str], *, log: Path | None = None, cwd: Path = ROOT,
          env: dict[str, str] | None = None,
          stdout: int | None = None) -> subprocess.Popen[bytes]:
    """Start `argv` (its output appended to `log`, else to `stdout`), noted in STARTED."""
    out = open(log, "ab") if log is not None else None  # noqa: SIM115 - the child holds it
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                stdout=out if out is not None else stdout,
                                stderr=out if out is not None else None, cwd=cwd, env=env)
    finally:
        if out is not None:
            out.close()
    STARTED.append(proc)
    return proc


def stop(procs: list[subprocess.Popen[bytes]], grace: float = 5.0) -> None:
    """SIGTERM them all, then SIGKILL what is left after `grace` seconds."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait()


def stop_all() -> None:
    """Stop every process `spawn` started, the last first."""
    stop(list(reversed(STARTED)))
    STARTED.clear()


def start_nginx(root: Path, workdir: Path, http: str) -> tuple[int, Path]:
    """nginx serving `root` on a free 127.0.0.1 port (apt-get installed if missing), with
    `http` (its access log at ``{log}``) in its http block; returns (port, log path).
    Stopped by `stop_all`."""
    from common.redis.server import free_port  # noqa: PLC0415 - benches put ROOT on the path

    d = workdir / "nginx"
    d.mkdir()
    port, log = free_port(), d / "access.log"
    conf = d / "nginx.conf"
    conf.write_text(nginx_conf(d, port, http=http.replace("{log}", str(log)),
                               server=f"        root {root};\n        index index.html;"))
    nginx = which_nginx(install=True)
    if nginx is None:
        raise SystemExit("no nginx on PATH (apt-get install nginx)")
    proc = spawn([nginx, "-p", str(d), "-c", str(conf)], stdout=subprocess.DEVNULL)
    wait_port(port, proc, "nginx")
    return port, log


def tail(path: Path, lines: int = 6) -> str:
    """The last `lines` lines of a log, indented, each cut to 300 characters."""
    if not path.exists():
        return ""
    text = path.read_text(errors="replace").strip().splitlines()[-lines:]
    return "\n".join("      | " + line[:300] for line in text)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through every finally, as Ctrl-C does


def run_in_workdir(prefix: str, body: Callable[[Path], int], stop_all: Callable[[], None],
                   keep: Callable[[Path], None] | None = None) -> int:
    """`body(workdir)` in a new temporary directory; on SIGTERM or Ctrl-C it exits 130,
    and whatever happens `stop_all()` stops what it started, `keep` may copy the
    directory away, and the directory is removed."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        return body(workdir)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping everything the bench started", file=sys.stderr)
        return 130
    finally:
        stop_all()
        if keep is not None:
            keep(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
