"""Slow and hostile clients against a real uvicorn process, over raw sockets: stalled headers and
stalled bodies are answered 408 and closed in the configured time, connections beyond the limit
are refused at once with 503, malformed HTTP gets a JSON 400, and a client that leaves mid-body
is neither logged as an exception nor counted as a 500. The timeouts come from the environment
(HARMONY_*), which `harmony serve` must respect."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.helpers.fallback_server import ADMIN_TOKEN, make_model_dir
from tests.server_process import serve

TIMEOUT = 1.0
MAX_CONNECTIONS = 12
ENV = {
    "HARMONY_HEADER_TIMEOUT_SECONDS": str(TIMEOUT),
    "HARMONY_BODY_TIMEOUT_SECONDS": str(TIMEOUT),
}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    flags = ("--max-connections", str(MAX_CONNECTIONS))
    with serve(root / "data", make_model_dir(root), *flags, env=ENV) as url:
        yield url


def connect(base_url: str) -> socket.socket:
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    started, chunks = time.monotonic(), []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks), time.monotonic() - started


def status_and_json(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def test_stalled_headers_are_408_and_closed(base_url):
    with connect(base_url) as sock:
        sock.sendall(b"POST /v1/uploads HTTP/1.1\r\nHost: test\r\nContent-Le")  # and nothing more
        response, waited = read_until_closed(sock)
    status, body = status_and_json(response)
    assert status == 408 and "headers not complete within 1 s" in body["detail"]
    assert waited < TIMEOUT + 2


def test_a_silent_connection_is_closed(base_url):
    with connect(base_url) as sock:
        response, waited = read_until_closed(sock)
    assert status_and_json(response)[0] == 408 and waited < TIMEOUT + 2


@pytest.mark.parametrize(
    "path,content_type",
    [("/v1/uploads", "application/json"), ("/v2/models/harmony-backend/infer", "application/octet-stream")],
)
def test_stalled_body_is_408_and_closed(base_url, path, content_type):
    head = (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: 5000\r\n\r\n"
    )
    with connect(base_url) as sock:
        sock.sendall(head.encode() + b"HMFT" * 4)  # 16 of the 5000 promised bytes
        response, waited = read_until_closed(sock)
    status, body = status_and_json(response)
    key = "error" if path.startswith("/v2") else "detail"
    assert status == 408 and "body not complete within 1 s" in body[key]
    assert waited < TIMEOUT + 2


def test_connections_beyond_the_limit_are_refused_at_once(base_url):
    held = [connect(base_url) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)
        with connect(base_url) as extra:
            response, waited = read_until_closed(extra)
        status, body = status_and_json(response)
        assert status == 503 and "too many open connections" in body["detail"] and waited < 1
        assert b"retry-after: 1" in response.lower()
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)  # the held slots are free again
    assert httpx.get(f"{base_url}/v2/health/live").status_code == 200


def test_malformed_http_is_a_json_400(base_url):
    with connect(base_url) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost test\r\n\r\n")  # header without a colon
        response, _ = read_until_closed(sock)
    status, body = status_and_json(response)
    assert status == 400 and body["detail"]


def test_client_leaving_mid_body_is_not_a_server_error(base_url):
    head = (
        f"POST /v2/models/harmony-backend/infer HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
        "Content-Type: application/octet-stream\r\nContent-Length: 5000\r\n\r\n"
    )
    for _ in range(3):
        with connect(base_url) as sock:
            sock.sendall(head.encode() + b"HMFT")
            time.sleep(0.1)
    time.sleep(0.3)
    metrics = httpx.get(f"{base_url}/metrics").text
    infer_lines = [line for line in metrics.splitlines() if 'route="/v2/models/{name}/infer"' in line]
    assert any('status="499"' in line for line in infer_lines), infer_lines
    assert not any('status="500"' in line for line in metrics.splitlines())
