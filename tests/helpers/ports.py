"""A free TCP port on the loopback interface for a server a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the kernel just had free; the socket closes before the server binds it, so another
    process could take it in between, which is rare enough for tests."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
