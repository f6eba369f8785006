"""uvicorn's httptools protocol with the guards a public server needs against slow or hostile clients.

* header timeout: a request whose headers are not complete `header_timeout` seconds after its first
  byte (or after the connection opened) is answered 408 and the connection closed (slowloris);
* connection limit: beyond `max_connections` open connections a new one is answered 503 with
  Retry-After and closed at once, before it can hold a slot;
* malformed HTTP is answered with a JSON 400 instead of uvicorn's plain text.
The body-read timeout lives in the app (server/limits.py), so the 408 it produces is an ordinary
JSON response that the metrics count. Limits are class attributes set by `configure` from Settings
in each worker process (uvicorn builds one protocol object per connection).
"""

from __future__ import annotations

import asyncio
import json

from harmony_mobile.server.settings import Settings
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

REASONS = {400: b"Bad Request", 408: b"Request Timeout", 503: b"Service Unavailable"}


def raw_error(status: int, message: str, extra_headers: dict[str, str] | None = None) -> bytes:
    body = json.dumps({"detail": message}).encode()
    headers = {"content-type": "application/json", "content-length": str(len(body)), "connection": "close"}
    headers.update(extra_headers or {})
    head = b"".join(f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items())
    return b"HTTP/1.1 %d %s\r\n%s\r\n%s" % (status, REASONS[status], head, body)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    # until `configure` runs: the settings' own defaults
    header_timeout: float = Settings.model_fields["header_timeout_seconds"].default
    max_connections: int = Settings.model_fields["max_connections"].default
    retry_after_seconds: int = Settings.model_fields["retry_after_seconds"].default

    @classmethod
    def configure(cls, header_timeout: float, max_connections: int, retry_after_seconds: int) -> None:
        cls.header_timeout = header_timeout
        cls.max_connections = max_connections
        cls.retry_after_seconds = retry_after_seconds

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            message = f"too many open connections (limit {self.max_connections}); retry later"
            self._refuse(503, message, {"retry-after": str(self.retry_after_seconds)})
            return
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_deadline is None:  # a later request on a kept-alive connection
            self._arm_header_deadline()

    def on_headers_complete(self) -> None:
        self._disarm_header_deadline()
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, msg)

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._header_timed_out)

    def _disarm_header_deadline(self) -> None:
        if getattr(self, "_header_deadline", None) is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_timed_out(self) -> None:
        self._header_deadline = None
        busy = self.cycle is not None and not self.cycle.response_complete
        if busy:  # an earlier pipelined request is still answering: just stop reading more
            self.transport.close()
            return
        self._refuse(408, f"request headers not complete within {self.header_timeout:g} s")

    def _refuse(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        if not self.transport.is_closing():
            self.transport.write(raw_error(status, message, headers))
            self.transport.close()
