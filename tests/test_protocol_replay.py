"""docs/PROTOCOL.md and tests/vectors/error_bodies.json against a live `harmony serve`.

Every HTTP example of the document, in document order, and every server case of the error vectors
is sent to a real server process; its status, the headers the example lists and its body must be
what is written, byte for byte (placeholders aside: tests/helpers/exchanges.py). The requests go out
through http.client with exactly the headers written (plus Host and Content-Length), as a phone
would send them. The server serves manifest_signature.json's manifest and a back-end of that
version, label epoch and class names, so the document's slot tables decode with the vectors'
federation secret.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from harmony_mobile.models import Backend, InterfaceSpec, ProjectionHead
from harmony_mobile.protocol.label_tokens import class_tokens, epoch_key
from harmony_mobile.protocol.sealing import AssociatedData, seal
from harmony_mobile.protocol.slots import SlotTable
from harmony_mobile.protocol.wire import UploadMetadata, encode_tensor, encode_upload
from harmony_mobile.run_dir import save_backend
from tests.helpers.exchanges import (
    PLACEHOLDER,
    Exchange,
    Message,
    Values,
    body_pattern,
    fill,
    json_string,
    parse_exchanges,
    remember,
)
from tests.helpers.fallback_server import ADMIN_TOKEN, class_features
from tests.server_process import serve

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / "docs" / "PROTOCOL.md"
VECTORS = ROOT / "tests" / "vectors"
GOLDEN = json.loads((VECTORS / "manifest_signature.json").read_text(encoding="utf-8"))
MANIFEST = json.loads(GOLDEN["manifest_text"])
SECRET = bytes.fromhex(json.loads((VECTORS / "label_tokens.json").read_text())["federation_secret"])
SERVER_CASES = [
    case
    for case in json.loads((VECTORS / "error_bodies.json").read_text(encoding="utf-8"))["cases"]
    if case["path"] is not None
]
POLL_SECONDS = 90


def replay_model_dir(root: Path) -> Path:
    """manifest_signature.json's export (manifest, both signatures) with a seeded random back-end of
    its version, label epoch, class names and slot table; 50 replay rows."""
    model_dir = root / "model"
    model_dir.mkdir(parents=True)
    (model_dir / "manifest.json").write_bytes(GOLDEN["manifest_text"].encode("utf-8"))
    (model_dir / "manifest.sig").write_text(GOLDEN["signature_file"])
    (model_dir / "manifest.p256.sig").write_text(GOLDEN["p256_signature_file"])
    for artifact in GOLDEN[
        "artifacts"
    ]:  # the phones' files (GET /v1/artifacts); the back-end is written below
        if not artifact["path"].startswith("backend/"):
            target = model_dir / artifact["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(base64.b64decode(artifact["content_base64"]))
    torch.manual_seed(0)
    backend = Backend(InterfaceSpec(), MANIFEST["num_classes"])
    projection = ProjectionHead(backend.feature_dim, 32)
    tokens = [bytes.fromhex(token) for token in MANIFEST["slot_table"]]
    table = SlotTable(MANIFEST["label_epoch"], MANIFEST["num_classes"], tokens)
    replay = torch.from_numpy(class_features(np.arange(50) % 10, seed=7))
    names = tuple(MANIFEST["class_names"])
    save_backend(
        model_dir / "backend" / "backend.pt",
        backend,
        projection,
        MANIFEST["model_version"],
        names,
        table,
        replay,
    )
    return model_dir


@pytest.fixture(scope="module")
def empty_server(tmp_path_factory):
    """A server with no back-end and no manifest."""
    with serve(tmp_path_factory.mktemp("empty") / "data", None, ready=False) as base:
        yield base


def start_loaded(tmp_path_factory, name: str):
    root = tmp_path_factory.mktemp(name)
    return serve(root / "data", replay_model_dir(root))


@pytest.fixture(scope="module")
def document_server(tmp_path_factory):
    """The document's examples change the server (an enrolment, uploads, a round): their own one."""
    with start_loaded(tmp_path_factory, "document") as base:
        yield base


@pytest.fixture(scope="module")
def vector_server(tmp_path_factory):
    with start_loaded(tmp_path_factory, "vectors") as base:
        yield base


# ---------------------------------------------------------------- request values


def upload_plaintext(tier: str = "entry-android", classes: tuple[str, ...] = ("3", "7")) -> bytes:
    """What the document's example envelope holds: rows of these classes from a phone of `tier`."""
    entry = next(t for t in MANIFEST["tiers"] if t["name"] == tier)
    key = epoch_key(SECRET, MANIFEST["label_epoch"])
    metadata = UploadMetadata(
        label_tokens=tuple(t.hex() for t in class_tokens(key, classes)),
        split_depths=(entry["split_depth"],) * len(classes),
        family=entry["family"],
        tier=tier,
        model_version=MANIFEST["model_version"],
    )
    features = class_features(np.array([int(c) for c in classes]), seed=3)
    return encode_upload(metadata, features)


def envelope_maker(plaintext: bytes, values: Values):
    """{{envelope}}: the plaintext sealed for the remembered device, the body's label epoch and
    message id; the same bytes again for the same message id, however it is written (a retry
    resends its envelope)."""
    sealed: dict[uuid.UUID, bytes] = {}

    def make(_match, body: str) -> bytes:
        fields = json.loads(PLACEHOLDER.sub("", body))
        message_id = uuid.UUID(fields["message_id"])
        if message_id not in sealed:
            ad = AssociatedData(values.fixed["device_id"].decode(), fields["label_epoch"], message_id)
            server_key = base64.b64decode(values.fixed["server_public_key"])
            sealed[message_id] = base64.b64encode(seal(server_key, plaintext, ad))
        return sealed[message_id]

    return make


def request_values(plaintext: bytes) -> Values:
    values = Values(
        fixed={
            "admin token": ADMIN_TOKEN.encode(),
            "manifest.json": GOLDEN["manifest_text"].encode("utf-8"),
            "manifest.json as a JSON string": json_string(GOLDEN["manifest_text"]),
            "manifest.sig": GOLDEN["signature_file"].encode(),
            "manifest.p256.sig": GOLDEN["p256_signature_file"].encode(),
        }
    )
    values.makers = [
        (re.compile(r"(\d+) numbers"), lambda m, _: b",".join([b"0.5"] * int(m[1]))),
        (re.compile(r"(\d+) bytes(?:: .*)?"), lambda m, _: np.full(int(m[1]) // 4, 0.5, "<f4").tobytes()),
        (re.compile(r"HMFT tensor, shape \[([0-9, ]+)\]"), lambda m, _: hmft(m[1])),
        (re.compile(r"envelope"), envelope_maker(plaintext, values)),
    ]
    return values


def hmft(shape: str) -> bytes:
    return encode_tensor(np.full([int(d) for d in shape.split(",")], 0.5, np.float32))


# ---------------------------------------------------------------- sending and matching


def send(base: str, request: Message, values: Values) -> tuple[int, str, dict[str, str], bytes]:
    """The request with exactly its written headers (http.client adds Host and Content-Length)."""
    method, target, _ = request.start.split(" ")
    body = fill(request.body, values, request.body) if request.body else None
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=60)
    try:
        connection.putrequest(method, fill(target, values).decode(), skip_accept_encoding=True)
        for name, value in request.headers:
            connection.putheader(name, fill(value, values))
        if body is not None or method in ("POST", "PUT"):
            connection.putheader("Content-Length", str(len(body or b"")))
        connection.endheaders(body)
        response = connection.getresponse()
        headers = {name.lower(): value for name, value in response.getheaders()}
        return response.status, response.reason, headers, response.read()
    finally:
        connection.close()


def mismatch(exchange: Exchange, status: int, reason: str, headers: dict, body: bytes, values: Values) -> str:
    """'' if the answer is the written response, else what differs (and the remembered values)."""
    expected = exchange.response
    if f"HTTP/1.1 {status} {reason}" != expected.start:
        return f"status line HTTP/1.1 {status} {reason}, written {expected.start!r}; body {body[:300]!r}"
    for name, value in expected.headers:
        if headers.get(name.lower()) != value:
            return f"header {name}: {headers.get(name.lower())!r}, written {value!r}"
    match = body_pattern(expected.body, values).fullmatch(body)
    if match is None:
        return f"body\n  sent    {body[:2000]!r}\n  written {expected.body[:2000]!r}"
    remember(match, values)
    return ""


def replay(base: str, exchange: Exchange, values: Values) -> str:
    deadline = time.monotonic() + (POLL_SECONDS if exchange.option == "poll" else 0)
    while True:
        problem = mismatch(exchange, *send(base, exchange.request, values), values)
        if not problem or time.monotonic() > deadline:
            return problem
        time.sleep(0.25)


# ---------------------------------------------------------------- the tests


def test_the_document_has_examples_of_every_kind():
    targets = {e.request.start for e in parse_exchanges(PROTOCOL.read_text(encoding="utf-8"))}
    for needed in (
        "POST /v1/devices",
        "GET /v1/manifest.sig",
        "GET /v1/manifest.p256.sig",
        "GET /v1/artifacts/",
        "POST /v1/uploads",
        "POST /v2/models/harmony-backend/infer",
    ):
        assert any(t.startswith(needed) for t in targets), needed


def test_every_example_of_the_protocol_document_is_what_the_server_does(document_server, empty_server):
    values = request_values(upload_plaintext())
    for exchange in parse_exchanges(PROTOCOL.read_text(encoding="utf-8")):
        base = empty_server if exchange.option == "no back-end" else document_server
        problem = replay(base, exchange, values)
        assert not problem, f"docs/PROTOCOL.md {exchange.name}: {problem}"


def enrol_device(base: str, tier: str | None) -> Values:
    values = request_values(upload_plaintext())
    enrolment = Message(0, "POST /v1/devices HTTP/1.1", [("Authorization", "Bearer {{admin token}}")], "")
    enrolment.headers.append(("Content-Type", "application/json"))
    enrolment.body = json.dumps({"tier": tier} if tier else {})
    status, _, _, body = send(base, enrolment, values)
    assert status == 201, body
    device = json.loads(body)
    for name in ("device_id", "token", "server_public_key"):
        values.fixed[name] = device[name].encode()
    return values


def vector_request(case: dict) -> Message:
    request = case["request"]
    headers = list(request["headers"].items())
    return Message(0, f"{request['method']} {request['target']} HTTP/1.1", headers, request["body"] or "")


@pytest.mark.parametrize("case", SERVER_CASES, ids=lambda case: case["name"])
def test_every_server_error_vector_is_what_the_server_writes(case, vector_server, empty_server):
    empty = case["given"].startswith("no back-end")
    base = empty_server if empty else vector_server
    values = enrol_device(base, None if empty else "entry-android")
    if case.get("envelope_plaintext"):
        values.makers[-1] = (
            re.compile("envelope"),
            envelope_maker(bytes.fromhex(case["envelope_plaintext"]), values),
        )
    if "stored an upload with this message_id" in case["given"]:
        stored = Message(0, "POST /v1/uploads HTTP/1.1", [("Authorization", "Bearer {{token}}")], "")
        message_id = json.loads(case["request"]["body"])["message_id"]
        stored.body = json.dumps(
            {"label_epoch": MANIFEST["label_epoch"], "message_id": message_id, "envelope": "{{envelope}}"}
        )
        stored.headers.append(("Content-Type", "application/json"))
        assert send(base, stored, values)[0] == 201
    status, _, headers, body = send(base, vector_request(case), values)
    assert status == case["status"], body
    assert body == case["body"].encode("utf-8")
    for name, value in case["headers"].items():
        assert headers.get(name.lower()) == value, name
