"""A real PostgreSQL server for the tests: Debian's ``initdb`` and ``postgres`` on a free port
of 127.0.0.1, its data directory and unix socket in a temporary directory.

PostgreSQL refuses to run as root: as root, both run as the ``postgres`` user (Debian's
package creates it), the temporary directory handed to it. Durability is off for tests
(fsync, synchronous commit): they kill consumers, never the database's machine.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from support.ports import closed_port

#: Where Debian puts each major version's server binaries.
DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"
START_TIMEOUT_S = 60.0


def find_bindir() -> Path | None:
    """The newest directory holding both ``initdb`` and ``postgres``, or None."""
    def version(path: str) -> int:
        name = Path(path).parent.name
        return int(name) if name.isdigit() else 0

    candidates = sorted(glob.glob(DEBIAN_BINDIRS), key=version, reverse=True)
    on_path = shutil.which("postgres")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for bindir in candidates:
        if all(os.access(Path(bindir, b), os.X_OK) for b in ("initdb", "postgres")):
            return Path(bindir)
    return None


class PostgresServer:
    """One ``postgres`` process; `url(db)` is a URL a client connects with (no password:
    trust on 127.0.0.1). Use as a context manager, or start() and stop(). `durable`: fsync
    and synchronous commit on, as a database in use has them (benchmarks)."""

    def __init__(self, bindir: Path, *, durable: bool = False, password: str = "") -> None:
        self.bindir = bindir
        self.durable = durable
        #: set: a TCP login needs it (scram-sha-256; the unix socket stays trust)
        self.password = password
        self.dir = Path(tempfile.mkdtemp(prefix="crawlq-pg-"))
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.data = self.dir / "data"
        self.log_path = self.dir / "postgres.log"
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            self._as = {"user": "postgres", "group": "postgres"}
            shutil.chown(self.dir, "postgres", "postgres")

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> PostgresServer:
        """initdb, then the server on a free port."""
        auth = ["--auth=trust"]
        if self.password:
            pwfile = self.dir / "pwfile"
            pwfile.write_text(self.password + "\n")
            if self._as:
                shutil.chown(pwfile, "postgres", "postgres")
            auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        subprocess.run([str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                        *auth, "-E", "UTF8", "--no-sync", "--no-instructions"],
                       check=True, capture_output=True, cwd=self.dir, **self._as)
        for _ in range(5):  # another process may take the free port first
            self.port = closed_port()
            if self._launch():
                return self
        raise RuntimeError(f"postgres did not start:\n{self.log()[-3000:]}")

    def down(self) -> None:
        """Shut the server down (its clients' connections end); its data stays."""
        process, self.process = self.process, None
        if process is not None:
            process.send_signal(signal.SIGINT)  # fast shutdown: sessions ended at once
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)

    def up(self) -> None:
        """Start a server that is down again, on its port, with its data."""
        if not self._launch():
            raise RuntimeError(f"postgres did not start again:\n{self.log()[-3000:]}")

    def _launch(self) -> bool:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(self.bindir / "postgres"), "-D", str(self.data), "-k", str(self.dir),
                 "-h", "127.0.0.1", "-p", str(self.port), "-c", "max_connections=200",
                 *(() if self.durable else ("-c", "fsync=off", "-c", "synchronous_commit=off",
                                            "-c", "full_page_writes=off"))],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, **self._as)
        return self._ready()

    def _ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            probe = subprocess.run([str(self.bindir / "pg_isready"), "-q",
                                    "-h", "127.0.0.1", "-p", str(self.port)], check=False)
            if probe.returncode == 0:
                return True
            time.sleep(0.1)
        self.process.kill()
        return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        """Shut the server down, then its files go."""
        self.down()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
