"""Slow and hostile clients against a real uvicorn process, over raw sockets: stalled headers and
stalled bodies are answered 408 and closed in the configured time, also a kept-alive connection
that only trickles bare CRLFs; connections beyond the limit are refused at once with 503,
malformed HTTP gets a JSON 400 (these three HTTP-layer answers carry the error key of the path
asked for: `error` on /v2), and a client that leaves mid-body is neither logged as an exception
nor counted as a 500. The timeouts come from the environment (HARMONY_*), which `harmony serve`
must respect."""

from __future__ import annotations

import json
import socket
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from harmony_mobile.protocol.wire import encode_tensor
from tests.helpers.fallback_server import ADMIN_TOKEN, INTERFACE, make_model_dir
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


def read_responses(sock: socket.socket, count: int) -> list[tuple[bytes, bytes]]:
    """`count` responses with Content-Length bodies, as (head, body), from one connection."""
    data, responses = b"", []
    while len(responses) < count:
        head, found, rest = data.partition(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = next(
            (int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:")), None
        )
        if not found or length is None or len(rest) < length:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(responses)} of {count} responses: {data!r}"
            data += chunk
            continue
        responses.append((head, rest[:length]))
        data = rest[length:]
    return responses


def read_one_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length body, leaving the connection open."""
    head, body = read_responses(sock, 1)[0]
    return head + b"\r\n\r\n" + body


def trickle_crlf_until_closed(socks: list[socket.socket], give_up: float, every: float = 0.3) -> float | None:
    """Send a bare CRLF on each socket every `every` s until the server closed all of them; how long
    that took, or None if some were still open after `give_up` s. A closing server may answer 408."""
    started, open_socks = time.monotonic(), list(socks)
    for sock in socks:
        sock.settimeout(0.01)
    while open_socks and time.monotonic() - started < give_up:
        for sock in list(open_socks):
            try:
                chunk = sock.recv(65536)
                if not chunk:
                    open_socks.remove(sock)
                elif not chunk.startswith(b"HTTP/1.1 408 "):
                    raise AssertionError(f"unexpected answer to bare CRLFs: {chunk!r}")
                continue
            except TimeoutError:
                pass
            except ConnectionError:
                open_socks.remove(sock)
                continue
            try:
                sock.sendall(b"\r\n")
            except ConnectionError:
                open_socks.remove(sock)
        time.sleep(every)
    return None if open_socks else time.monotonic() - started


# The error key of each route family (docs/PROTOCOL.md): tritonclient reads only `error`.
PATHS_AND_KEYS = [
    ("/v1/uploads", "detail"),
    ("/v2/models/harmony-backend/infer", "error"),
    ("/v2/health/live?x=1", "error"),
    ("http://test/v2/models/harmony-backend/infer", "error"),  # absolute-form target
]
# before a request line arrives no path is known: both keys, so every client finds its own
NO_PATH_KEYS = {"error", "detail"}


@pytest.mark.parametrize("path,key", PATHS_AND_KEYS)
def test_stalled_headers_are_408_and_closed(base_url, path, key):
    with connect(base_url) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Le".encode())  # and nothing more
        response, waited = read_until_closed(sock)
    status, body = status_and_json(response)
    assert status == 408 and set(body) == {key}, body
    assert "headers not complete within 1 s" in body[key]
    assert waited < TIMEOUT + 2


def test_a_silent_connection_is_closed(base_url):
    with connect(base_url) as sock:
        response, waited = read_until_closed(sock)
    status, body = status_and_json(response)
    assert status == 408 and set(body) == NO_PATH_KEYS and waited < TIMEOUT + 2


def test_a_connection_trickling_bare_crlfs_after_a_request_is_closed(base_url):
    # httptools skips CRLFs between requests, so no request ever begins; each CRLF also resets
    # uvicorn's keep-alive timer. The header deadline must still run from the first of them.
    with connect(base_url) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n")
        assert read_one_response(sock).startswith(b"HTTP/1.1 200 ")
        waited = trickle_crlf_until_closed([sock], give_up=TIMEOUT + 4)
    assert waited is not None and waited < TIMEOUT + 2, waited


def test_crlf_trickling_connections_do_not_lock_out_other_clients(base_url):
    held = [connect(base_url) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in held:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n")
            assert read_one_response(sock).startswith(b"HTTP/1.1 200 ")
        waited = trickle_crlf_until_closed(held, give_up=TIMEOUT + 4)
        assert waited is not None and waited < TIMEOUT + 2, waited
        assert httpx.get(f"{base_url}/v2/health/live").status_code == 200
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize(
    "path,content_type",
    [("/v1/devices", "application/json"), ("/v2/models/harmony-backend/infer", "application/octet-stream")],
)
def test_stalled_body_is_408_and_closed(base_url, path, content_type):
    """The admin token is accepted on both routes, so each goes on to read the body."""
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


@pytest.mark.parametrize("path,key", [(None, None), *PATHS_AND_KEYS])
def test_connections_beyond_the_limit_are_refused_at_once(base_url, path, key):
    held = [connect(base_url) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)
        with connect(base_url) as extra:
            if path is not None:
                extra.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
            response, waited = read_until_closed(extra)
        status, body = status_and_json(response)
        assert status == 503 and set(body) == ({key} if key else NO_PATH_KEYS), body
        assert "too many open connections" in body[key or "error"] and waited < 1
        assert b"retry-after: 1" in response.lower()
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)  # the held slots are free again
    assert httpx.get(f"{base_url}/v2/health/live").status_code == 200


def test_tritonclient_reads_the_connection_limit_503(base_url):
    held = [connect(base_url) for _ in range(MAX_CONNECTIONS)]
    client = triton.InferenceServerClient(base_url.removeprefix("http://"), network_timeout=10)
    try:
        time.sleep(0.2)
        with pytest.raises(InferenceServerException) as refused:
            client.get_server_metadata()
        # the whole message, not a decoding failure that quotes the body
        assert refused.value.status() == "503"
        assert refused.value.message() == f"too many open connections (limit {MAX_CONNECTIONS}); retry later"
    finally:
        client.close()
        for sock in held:
            sock.close()
    time.sleep(0.3)


@pytest.mark.parametrize("path,key", [("/", "detail"), *PATHS_AND_KEYS])
def test_malformed_http_is_a_json_400(base_url, path, key):
    with connect(base_url) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost test\r\n\r\n".encode())  # header without a colon
        response, _ = read_until_closed(sock)
    status, body = status_and_json(response)
    assert (
        status == 400 and set(body) == {key} and body[key] == "malformed HTTP request: Invalid header token"
    )


def test_a_content_length_that_is_no_number_is_named(base_url):
    with connect(base_url) as sock:
        sock.sendall(b"POST /v1/devices HTTP/1.1\r\nHost: test\r\nContent-Length: abc\r\n\r\n")
        response, _ = read_until_closed(sock)
    status, body = status_and_json(response)
    assert (status, body) == (400, {"detail": "malformed HTTP request: Invalid character in Content-Length"})


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


INFER_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/octet-stream"}


def infer_request(value: float) -> tuple[bytes, bytes]:
    """(HMFT body of one row filled with `value`, the whole HTTP/1.1 request carrying it)."""
    body = encode_tensor(np.full((1, *INTERFACE.shape), value, dtype=np.float32))
    head = "POST /v2/models/harmony-backend/infer HTTP/1.1\r\nHost: test\r\n" + "".join(
        f"{name}: {header}\r\n" for name, header in INFER_HEADERS.items()
    )
    return body, f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def test_pipelined_infer_requests_are_each_answered_from_their_own_body(base_url):
    """Two infer requests in one write: the server holds both bodies before the app reads either
    (the protocol marks each request's scope), and each answer is its own request's."""
    bodies, requests = zip(*(infer_request(value) for value in (0.5, -2.0)), strict=True)
    with connect(base_url) as sock:
        sock.sendall(b"".join(requests))
        responses = read_responses(sock, 2)
    assert all(head.startswith(b"HTTP/1.1 200") for head, _ in responses), responses
    answers = [json.loads(body) for _, body in responses]
    url = f"{base_url}/v2/models/harmony-backend/infer"
    singles = [httpx.post(url, content=body, headers=INFER_HEADERS).json() for body in bodies]
    assert answers == singles and answers[0]["outputs"] != answers[1]["outputs"]


def test_a_client_that_half_closes_after_its_request_gets_the_answer(base_url):
    """shutdown(SHUT_WR) right after the request (as `nc -N` does): the answer still comes, then the
    server closes the connection; uvicorn alone closed at once and the answer's write failed."""
    _, request = infer_request(0.5)
    with connect(base_url) as sock:
        sock.sendall(request + request)  # two, pipelined
        sock.shutdown(socket.SHUT_WR)
        data, waited = read_until_closed(sock)
    assert data.count(b"HTTP/1.1 200 OK") == 2, data
    assert waited < 3  # closed after the answers, not at the keep-alive timeout
