"""A throwaway PostgreSQL server for the tests: initdb into a temp dir, pg_ctl start on a free
loopback port, one fresh database per test, everything removed at the end.

Outside CI a machine without the PostgreSQL server binaries skips the PostgreSQL variants (with
the reason); in CI (`CI` set, as .ci/run does) missing binaries fail the run instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers.ports import free_port

SUPERUSER = "postgres"


def server_binaries() -> Path | None:
    """The newest /usr/lib/postgresql/<major>/bin (Debian's layout), else whatever PATH has."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))
    if candidates:
        return Path(candidates[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _as_server_user(command: list[str]) -> list[str]:
    # initdb refuses to run as root: run the server as the 'postgres' system user then.
    return ["runuser", "-u", SUPERUSER, "--", *command] if os.geteuid() == 0 else command


@contextmanager
def running_postgres() -> Iterator[str]:
    """Yields the base URL postgresql://postgres@127.0.0.1:<port> of a fresh server."""
    binaries = server_binaries()
    if binaries is None:
        reason = "PostgreSQL server binaries (initdb, pg_ctl) not found; apt-get install postgresql"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (required in CI)")
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="harmony-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, SUPERUSER, SUPERUSER)
    port = free_port()
    run = dict(check=True, capture_output=True, text=True, timeout=120)
    subprocess.run(
        _as_server_user([str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", SUPERUSER]), **run
    )
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1"
    pg_ctl = [str(binaries / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log")]
    subprocess.run(_as_server_user([*pg_ctl, "-o", options, "-w", "start"]), **run)
    try:
        yield f"postgresql://{SUPERUSER}@127.0.0.1:{port}"
    finally:
        subprocess.run(_as_server_user([*pg_ctl, "-m", "immediate", "stop"]), capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def create_database(base_url: str) -> str:
    """A new empty database on the server; returns its URL."""
    import psycopg

    name = f"harmony_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{base_url}/postgres", autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return f"{base_url}/{name}"
