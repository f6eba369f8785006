"""The infer route's request path in-process: the body deadline is armed only while the body can
still be on its way, headers repeat as Starlette reads them, and a client leaving mid-body is a
ClientDisconnect as with `Request.body`."""

from __future__ import annotations

import asyncio

import pytest
from harmony_mobile.server.core import limits
from harmony_mobile.server.core.limits import BODY_RECEIVED, BodySizeLimitMiddleware
from harmony_mobile.server.routes.v2_infer import _first_headers, _read_body
from starlette.requests import ClientDisconnect


def run_middleware(scope: dict, messages: list[dict]) -> bytes:
    """The body the app behind the middleware reads from `messages`."""
    read: list[bytes] = []

    async def app(scope, receive, send):
        read.append(await _read_body(receive))

    async def receive():
        return messages.pop(0)

    async def send(message):
        raise AssertionError(f"nothing should be answered: {message}")

    middleware = BodySizeLimitMiddleware(app, max_body_bytes=1000, body_timeout=5.0)
    asyncio.run(middleware(scope, receive, send))
    return read[0]


def http_scope(**extra) -> dict:
    return {"type": "http", "method": "POST", "path": "/v2/models/m/infer", "headers": [], **extra}


@pytest.fixture
def deadlines(monkeypatch) -> list[float]:
    """Records each body deadline the middleware arms."""
    armed: list[float] = []
    real = asyncio.timeout_at

    def recording(when):
        armed.append(when)
        return real(when)

    monkeypatch.setattr(limits.asyncio, "timeout_at", recording)
    return armed


def test_no_deadline_once_the_protocol_holds_the_whole_body(deadlines):
    body = run_middleware(http_scope(**{BODY_RECEIVED: True}), [{"type": "http.request", "body": b"abc"}])
    assert body == b"abc" and deadlines == []


def test_a_body_still_arriving_reads_under_the_deadline(deadlines):
    parts = [
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"c"},
    ]
    assert run_middleware(http_scope(), parts) == b"abc"
    assert len(deadlines) == 2  # one per receive, the same deadline
    assert deadlines[0] == deadlines[1]


def test_the_first_of_repeated_headers_wins_as_in_starlette():
    scope = {
        "headers": [(b"authorization", b"Bearer first"), (b"x-harmony-tier", b"t"), (b"authorization", b"x")]
    }
    assert _first_headers(scope) == {"authorization": "Bearer first", "x-harmony-tier": "t"}


def test_a_client_leaving_mid_body_is_a_client_disconnect():
    messages = [{"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.disconnect"}]

    async def receive():
        return messages.pop(0)

    with pytest.raises(ClientDisconnect):
        asyncio.run(_read_body(receive))
