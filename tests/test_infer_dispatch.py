"""Infer requests skip FastAPI's router (server/core/infer_dispatch.py): the same answers, error bodies,
metrics labels and exception handling as through the router, and every other request untouched."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from fastapi.testclient import TestClient
from harmony_mobile.server import create_app
from harmony_mobile.server.core.infer_dispatch import DEFAULT_PATH, VERSION_PATH, match_infer_path
from sqlalchemy.exc import OperationalError

from harmony_mobile.protocol.wire import encode_tensor
from tests.helpers.fallback_server import ADMIN, error_message, make_model_dir, make_settings

BINARY = {**ADMIN, "Content-Type": "application/octet-stream"}


@pytest.mark.parametrize(
    "path,expected",
    [
        ("/v2/models/m/infer", (DEFAULT_PATH, "m", None)),
        ("/v2/models/m/versions/v7/infer", (VERSION_PATH, "m", "v7")),
        ("/v2/models//infer", None),  # the router's {name} needs a character
        ("/v2/models/m/versions//infer", None),
        ("/v2/models/m/infer/", None),
        ("/v2/models/m/ready", None),
        ("/v2/models/m/versions/v7/ready", None),
        ("/v1/models/m/infer", None),
        ("/v2/models/a/b/infer", None),
    ],
)
def test_only_the_two_infer_paths_match(path, expected):
    assert match_infer_path(path) == expected


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("dispatch")
    model_dir = make_model_dir(root / "model")
    with TestClient(
        create_app(make_settings(root / "server", model_dir)), raise_server_exceptions=False
    ) as c:
        yield c


def one_row() -> bytes:
    return encode_tensor(np.random.default_rng(0).standard_normal((1, 64, 8, 8), dtype=np.float32))


def test_both_infer_paths_answer_and_are_labelled_by_their_route(client):
    assert (
        client.post("/v2/models/harmony-backend/infer", content=one_row(), headers=BINARY).status_code == 200
    )
    versioned = client.post("/v2/models/harmony-backend/versions/v1/infer", content=one_row(), headers=BINARY)
    assert versioned.status_code == 200 and versioned.json()["model_version"] == "v1"
    text = client.get("/metrics").text
    for route in (DEFAULT_PATH, VERSION_PATH):
        assert f'harmony_http_requests_total{{method="POST",route="{route}",status="200"}}' in text


def test_an_unknown_version_or_model_is_a_v2_error_body(client):
    missing = client.post("/v2/models/harmony-backend/versions/v9/infer", content=one_row(), headers=BINARY)
    assert missing.status_code == 404 and "v9" in missing.json()["error"]
    other = client.post("/v2/models/other/infer", content=one_row(), headers=BINARY)
    assert other.status_code == 404 and "unknown model 'other'" in other.json()["error"]
    assert client.post("/v2/models/harmony-backend/infer", content=one_row()).status_code == 401


def test_a_store_outage_during_infer_is_503_with_retry_after(client, monkeypatch):
    registry = client.app.state.harmony.registry

    def unreachable(*_):
        raise OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))

    monkeypatch.setattr(registry, "loaded", unreachable)
    response = client.post("/v2/models/harmony-backend/infer", content=one_row(), headers=BINARY)
    assert response.status_code == 503 and response.headers["retry-after"]
    assert error_message(response) == "the store is unavailable; retry later"


def test_a_bug_in_infer_is_a_logged_json_500(client, monkeypatch, caplog):
    def broken(*_):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(client.app.state.harmony.registry, "loaded", broken)
    with caplog.at_level(logging.ERROR, logger="harmony_mobile.server"):
        response = client.post("/v2/models/harmony-backend/infer", content=one_row(), headers=BINARY)
    assert response.status_code == 500
    assert response.json() == {"error": "internal error (ZeroDivisionError)"}
    assert "unexpected error on POST /v2/models/harmony-backend/infer" in caplog.text
    text = client.get("/metrics").text
    assert f'harmony_http_requests_total{{method="POST",route="{DEFAULT_PATH}",status="500"}}' in text


def test_other_methods_on_the_infer_path_still_reach_the_router(client):
    response = client.get("/v2/models/harmony-backend/infer", headers=ADMIN)
    assert response.status_code == 405 and response.headers["allow"] == "POST"


@pytest.mark.parametrize(
    "header,gzipped",
    [
        ("gzip", True),
        ("gzip, deflate", True),
        ("deflate, gzip;q=0.5", True),
        ("x-gzip", True),
        ("*", True),
        ("gzip;q=0", False),
        ("gzip;q=0.0, deflate", False),
        ("*, gzip;q=0", False),
        ("*;q=0", False),
        ("identity", False),
        ("", False),
        ("gzip;q=abc", False),
    ],
)
def test_the_answer_is_gzipped_only_when_accept_encoding_accepts_gzip(client, header, gzipped):
    plain = client.post(
        "/v2/models/harmony-backend/infer",
        content=one_row(),
        headers={**BINARY, "Accept-Encoding": "identity"},
    )
    response = client.post(
        "/v2/models/harmony-backend/infer", content=one_row(), headers={**BINARY, "Accept-Encoding": header}
    )
    assert response.status_code == 200
    assert (response.headers.get("content-encoding") == "gzip") is gzipped
    assert response.json() == plain.json()  # httpx decodes a gzipped body
