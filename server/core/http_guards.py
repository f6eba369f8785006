"""uvicorn's httptools protocol with the guards a public server needs against slow or hostile clients.

* header timeout: a request whose headers are not complete `header_timeout` seconds after its first
  byte (or after the connection opened) is answered 408 and the connection closed (slowloris).
  Between requests any byte starts that clock, bare CRLFs included: httptools skips them without
  beginning a request and each one resets uvicorn's keep-alive timer, so a client trickling them
  would otherwise hold its connection forever;
* connection limit: beyond `max_connections` open connections a new one is answered 503 with
  Retry-After and closed as soon as its request line arrived (at most REFUSAL_WAIT_SECONDS),
  before it can hold a slot;
* malformed HTTP is answered with a JSON 400 instead of uvicorn's plain text;
* a client that half-closes after its requests still gets their answers, then the connection closes.
Their JSON bodies use the error key of the path asked for (server/core/errors.py: `error` on /v2, which
tritonclient reads, `detail` elsewhere); with no request line yet, both keys.
The body-read timeout lives in the app (server/core/limits.py), so the 408 it produces is an ordinary
JSON response that the metrics count; the protocol marks a request's scope once its whole body has
arrived, so that the app arms no timer it cannot need. Limits are class attributes set by `configure` from Settings
in each worker process (uvicorn builds one protocol object per connection).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from urllib.parse import urlsplit

from harmony_mobile.server.core.errors import error_key
from harmony_mobile.server.core.limits import BODY_RECEIVED
from harmony_mobile.server.core.settings import Settings
from httptools import HttpParserError
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

REASONS = {400: b"Bad Request", 408: b"Request Timeout", 503: b"Service Unavailable"}
# A refused connection is read until its request line for the path's error key, not longer: a
# client sends its request right after connecting, and closing before reading it would also make
# the kernel answer the unread bytes with a reset that can destroy the 503 before the client reads it.
REFUSAL_WAIT_SECONDS = 0.5
MAX_REQUEST_LINE = 8192
# method SP request-target (RFC 9112 3), after the empty lines a server must ignore before it
REQUEST_LINE = re.compile(rb"(?:\r?\n)*[!-~]+ +([!-~]+)")


def error_body(path: str | None, message: str) -> bytes:
    keys = ("error", "detail") if path is None else (error_key(path),)
    return json.dumps(dict.fromkeys(keys, message)).encode()


def target_path(request_target: bytes) -> str | None:
    """The path of a request target (origin or absolute form), None if there is none."""
    text = request_target.decode("latin-1")
    if not text.startswith("/"):  # absolute form, as sent to a proxy: scheme://authority/path?query
        try:
            text = urlsplit(text).path
        except ValueError:  # such as a malformed [IPv6] authority
            return None
    return text.split("?", 1)[0] or None


def request_line_path(data: bytes) -> str | None:
    match = REQUEST_LINE.match(data)
    return target_path(match.group(1)) if match else None


def raw_error(
    status: int, message: str, path: str | None, extra_headers: dict[str, str] | None = None
) -> bytes:
    body = error_body(path, message)
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
        self._in_message = False  # between a request's first byte and its last
        self._refused_start: bytearray | None = None  # over the limit: what came before the 503
        self._peer_done = False  # the client half-closed: it sends nothing more
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._refused_start = bytearray()
            self._header_deadline = self.loop.call_later(REFUSAL_WAIT_SECONDS, self._refuse_connection)
            return
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused_start is not None:
            self._refused_start += data[: MAX_REQUEST_LINE - len(self._refused_start)]
            if b"\n" in self._refused_start or len(self._refused_start) >= MAX_REQUEST_LINE:
                self._refuse_connection()
            return
        if not self._in_message and self._header_deadline is None:
            self._arm_header_deadline()  # a byte between requests: the next one's clock starts
        super().data_received(data)

    def eof_received(self) -> bool:
        """A client may half-close once it has sent its requests (shutdown(SHUT_WR), `nc -N`). Closing
        at once, as uvicorn does, would drop the answers still being computed (and their writes
        fail); the connection stays open for them and closes after the last one. A request whose
        bytes stopped mid-way is a client that left (499), as before."""
        self._peer_done = True
        if self._in_message or not self._answering():  # a request cut short can never complete
            self.transport.close()
        return True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._peer_done and not self._answering():
            self.transport.close()

    def _answering(self) -> bool:
        """A response is being computed or a pipelined request waits for its turn."""
        return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

    def on_message_begin(self) -> None:
        self._in_message = True
        super().on_message_begin()
        if self._header_deadline is None:
            self._arm_header_deadline()

    def on_headers_complete(self) -> None:
        self._disarm_header_deadline()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_message = False
        self.scope[BODY_RECEIVED] = True  # the app's body deadline has nothing left to wait for
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this inside its `except HttpParserError`, with one sentence for every fault:
        # the parser's own reason says which ("Invalid character in Content-Length")
        error = sys.exc_info()[1]
        if isinstance(error, HttpParserError) and str(error):
            msg = f"malformed HTTP request: {error}"
        self._refuse(400, msg, self._current_path())

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
        if busy and not self._in_message:
            # only stray bytes (some clients send a CRLF after a body) came while the last request
            # is still being answered: nothing stalls yet, so the clock restarts
            self._arm_header_deadline()
            return
        if busy:  # an earlier pipelined request is still answering: just stop reading more
            self.transport.close()
            return
        message = f"request headers not complete within {self.header_timeout:g} s"
        self._refuse(408, message, self._current_path())

    def _refuse_connection(self) -> None:
        self._disarm_header_deadline()
        path = request_line_path(bytes(self._refused_start or b""))
        message = f"too many open connections (limit {self.max_connections}); retry later"
        self._refuse(503, message, path, {"retry-after": str(self.retry_after_seconds)})

    def _current_path(self) -> str | None:
        """The path of the request being received; None between requests (uvicorn's `url` then
        still holds the previous request's)."""
        return target_path(getattr(self, "url", b"")) if self._in_message else None

    def _refuse(
        self, status: int, message: str, path: str | None, headers: dict[str, str] | None = None
    ) -> None:
        if not self.transport.is_closing():
            self.transport.write(raw_error(status, message, path, headers))
            self.transport.close()
