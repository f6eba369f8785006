"""A real `harmony serve` process (uvicorn) on a free loopback port, for tests that need real
sockets: standard clients, slow clients, replicas."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.helpers.fallback_server import ADMIN_TOKEN
from tests.helpers.ports import free_port
from tests.helpers.processes import stop, wait_until_ready


@dataclass
class RunningServer:
    base: str  # http://127.0.0.1:<port>
    port: int
    process: subprocess.Popen  # `harmony serve` itself (with --workers N: uvicorn's supervisor)
    output: str = ""  # stdout and stderr, once it stopped


@contextmanager
def serve(
    data_dir: Path, model_dir: Path | None, *flags: str, env: dict[str, str] | None = None, ready: bool = True
) -> Iterator[str]:
    """Yields the base URL once /v2/health/live answers (and /ready, if `ready`); SIGTERM on exit.
    The output is checked for tracebacks: an exception that reached uvicorn is a bug."""
    with serve_process(data_dir, model_dir, *flags, env=env, ready=ready) as server:
        yield server.base


@contextmanager
def serve_process(
    data_dir: Path, model_dir: Path | None, *flags: str, env: dict[str, str] | None = None, ready: bool = True
) -> Iterator[RunningServer]:
    """`serve`, yielding the process too. On exit it must stop within 30 s of SIGTERM (else it is
    killed and the test fails); afterwards `process.returncode` says how it ended."""
    port = free_port()
    command = [
        sys.executable, "-m", "harmony_mobile.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--data-dir", str(data_dir), "--torch-threads", "1", "--log-level", "warning", *flags,
    ]  # fmt: skip
    if model_dir is not None:
        command += ["--model-dir", str(model_dir)]
    environment = {**os.environ, "HARMONY_ADMIN_TOKEN": ADMIN_TOKEN, **(env or {})}
    process = subprocess.Popen(
        command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    server = RunningServer(f"http://127.0.0.1:{port}", port, process)
    try:
        wait_until_ready(process, server.base + ("/v2/health/ready" if ready else "/v2/health/live"), 90)
        yield server
    finally:
        stopped_in_time = stop(process)
    output = server.output = process.stdout.read()
    assert "Traceback" not in output and "Exception in ASGI application" not in output, output
    assert stopped_in_time, f"the server did not stop within 30 s of SIGTERM:\n{output}"


# ---------------------------------------------------------------- which process holds a socket
# Linux only (/proc): uvicorn's workers accept connections on one listening socket, and the kernel
# records which process holds each accepted connection, so a test can tell which worker answered
# without the server saying so.

TCP_LISTEN, TCP_ESTABLISHED = "0A", "01"


def _tcp_inodes(local_port: int, remote_port: int, state: str) -> set[int]:
    """Inodes of the IPv4 sockets with these ports and state (/proc/net/tcp: hex ports, hex state)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, line_state, inode = fields[1], fields[2], fields[3], int(fields[9])
        ports = int(local.split(":")[1], 16), int(remote.split(":")[1], 16)
        if ports == (local_port, remote_port) and line_state == state:
            inodes.add(inode)
    return inodes


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def _children(pid: int) -> set[int]:
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (command)": state, ppid, ...
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            children.add(int(stat.parent.name))
    return children


def worker_pids(server: RunningServer) -> set[int]:
    """The child processes of the server that hold its listening socket: uvicorn's workers."""
    listening = _tcp_inodes(server.port, 0, TCP_LISTEN)
    assert listening, f"nothing listens on port {server.port}"
    return {pid for pid in _children(server.process.pid) if _socket_inodes(pid) & listening}


def answering_pid(server: RunningServer, response: httpx.Response, candidates: set[int]) -> int:
    """The process among `candidates` holding the server end of the (still open, kept-alive)
    connection `response` came over."""
    client_port = response.extensions["network_stream"].get_extra_info("client_addr")[1]
    [connection] = _tcp_inodes(server.port, client_port, TCP_ESTABLISHED)
    [pid] = [pid for pid in candidates if connection in _socket_inodes(pid)]
    return pid


def is_running(pid: int) -> bool:
    """False once the process is gone (or a zombie nobody reaped: it serves nothing either)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
