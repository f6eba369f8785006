"""The HTTP examples of docs/PROTOCOL.md as data: parse them, fill their requests in, and match a
live server's answer against them byte for byte (tests/test_protocol_replay.py; no tests here).

An example is a ```http block holding a request (`METHOD TARGET HTTP/1.1`, header lines, a blank
line, the body) followed by a ```http block holding the response (`HTTP/1.1 CODE PHRASE`, the
headers that matter, a blank line, the body). A body written over several lines is the lines
without their surrounding whitespace, joined with nothing. `{{name}}` stands for a value the
document names: filled in from `values` in a request, matched by the pattern of PLACEHOLDERS in a
response (a response's value is remembered under its name, and a later use must repeat it). An
HTML comment `<!-- replay: OPTION -->` just before a request block says how to replay it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

PLACEHOLDER = re.compile(r"\{\{([^{}]+)\}\}")
BLOCK = re.compile(r"(?:<!-- replay: (?P<option>[^>]*?) -->\n)?```http\n(?P<text>.*?)\n```", re.S)
NUMBER = rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
TIMESTAMP = rb"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z"
# response placeholders: name -> the bytes pattern its value matches (values are remembered)
PLACEHOLDERS = {
    "device_id": rb"dev_[0-9a-f]{16}",
    "token": rb"[A-Za-z0-9_-]{43}",
    "server_public_key": rb"[A-Za-z0-9+/]{43}=",
    "timestamp": TIMESTAMP,
    "timestamp or null": b'(?:"' + TIMESTAMP + b'"|null)',
    "upload_id": rb"[1-9][0-9]*",
    "round_id": rb"[1-9][0-9]*",
    "sha256": rb"[0-9a-f]{64}",
    "number": NUMBER,
    "queued or running": rb"(?:queued|running)",
    "version or null": rb'(?:"[A-Za-z0-9][A-Za-z0-9._-]*"|null)',
    "path of the imported file": rb'[^"]+',
}
# values that name one thing (a device, an upload, a round): remembered, and equal wherever repeated
REMEMBERED = {"device_id", "token", "server_public_key", "upload_id", "round_id"}


@dataclass
class Message:
    line: int  # 1-based line of the block in the document, for failure messages
    start: str  # request line or status line
    headers: list[tuple[str, str]]
    body: str


@dataclass
class Exchange:
    request: Message
    response: Message
    option: str | None = None

    @property
    def name(self) -> str:
        return f"line {self.request.line}: {self.request.start}"


@dataclass
class Values:
    """What the placeholders stand for: fixed values, remembered ones, and makers of request bytes."""

    fixed: dict[str, bytes] = field(default_factory=dict)
    makers: list[tuple[re.Pattern, Callable[[re.Match, str], bytes]]] = field(default_factory=list)

    def request_value(self, name: str, body: str) -> bytes:
        if name in self.fixed:
            return self.fixed[name]
        for pattern, make in self.makers:
            match = pattern.fullmatch(name)
            if match:
                return make(match, body)
        raise AssertionError(f"no value for the request placeholder {{{{{name}}}}}")


def _message(text: str, line: int) -> Message:
    head, _, body = text.partition("\n\n")
    start, *header_lines = head.splitlines()
    headers = [tuple(part.strip() for part in h.split(":", 1)) for h in header_lines]
    return Message(line, start, headers, "".join(part.strip() for part in body.splitlines()))


def parse_exchanges(document: str) -> list[Exchange]:
    """Every request block with the response block after it, in document order."""
    blocks = []
    for match in BLOCK.finditer(document):
        line = document.count("\n", 0, match.start("text")) + 1
        blocks.append((match["option"], _message(match["text"], line)))
    exchanges = []
    for (option, request), (_, response) in zip(blocks[::2], blocks[1::2], strict=True):
        assert not request.start.startswith("HTTP/"), f"line {request.line}: a response without a request"
        assert response.start.startswith("HTTP/1.1 "), f"line {response.line}: a request without a response"
        exchanges.append(Exchange(request, response, option))
    return exchanges


def fill(text: str, values: Values, body: str = "") -> bytes:
    """A request part with its placeholders replaced by bytes."""
    out, position = b"", 0
    for match in PLACEHOLDER.finditer(text):
        out += text[position : match.start()].encode() + values.request_value(match[1], body)
        position = match.end()
    return out + text[position:].encode()


def _pattern(name: str, values: Values, groups: set[str]) -> bytes:
    counted = re.fullmatch(r"(\d+) (numbers|integers|bytes)(?:: .*)?", name)
    if counted:
        count = int(counted[1])
        item = {"numbers": NUMBER, "integers": rb"[0-9]+"}.get(counted[2])
        if item is None:  # raw bytes of a binary output
            return rb"[\s\S]{%d}" % count
        return item + (rb"(?:," + item + rb"){%d}" % (count - 1) if count > 1 else b"")
    if name in values.fixed:
        return re.escape(values.fixed[name])
    assert name in PLACEHOLDERS, f"unknown response placeholder {{{{{name}}}}}"
    if name not in REMEMBERED:
        return b"(?:%s)" % PLACEHOLDERS[name]
    if name in groups:  # the same name twice in one body: the same value
        return b"(?P=%s)" % _group(name).encode()
    groups.add(name)
    return b"(?P<%s>%s)" % (_group(name).encode(), PLACEHOLDERS[name])


def _group(name: str) -> str:
    return re.sub(r"\W", "_", name)


def body_pattern(text: str, values: Values) -> re.Pattern:
    """The response body as a bytes pattern: literal bytes, placeholders by their patterns."""
    pattern, position, groups = b"", 0, set()
    for match in PLACEHOLDER.finditer(text):
        pattern += re.escape(text[position : match.start()].encode()) + _pattern(match[1], values, groups)
        position = match.end()
    return re.compile(pattern + re.escape(text[position:].encode()))


def remember(match: re.Match, values: Values) -> None:
    """Values a response gave for its placeholders: later requests and responses reuse them."""
    for name in REMEMBERED:
        group = _group(name)
        if group in match.re.groupindex and name not in values.fixed and match[group] is not None:
            values.fixed[name] = match[group]


def json_string(text: str) -> bytes:
    """A text as the server writes it inside JSON (UTF-8, not \\u-escaped), quotes included."""
    return json.dumps(text, ensure_ascii=False).encode()
