"""What an operator gets wrong, answered plainly: a server that cannot start says why in one line
before anything is written; HEAD works where GET does; a stray slash is 404, not a redirect; a body
sent as a form, a NaN or a chunked body past the limit is named as such; the data dir is owner-only."""

from __future__ import annotations

import os
import socket
import stat

import pytest
from fastapi.testclient import TestClient
from harmony_mobile.server.app import create_app
from harmony_mobile.server.launch import LaunchError, check_can_start
from typer.testing import CliRunner

from harmony_mobile.cli import app as cli_app
from tests.helpers.fallback_server import ADMIN, make_settings


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(make_settings(tmp_path, None, max_body_bytes=1024))) as client:
        yield client


def test_head_answers_where_get_does_and_a_stray_slash_is_404(client):
    for path in ("/", "/metrics"):
        response = client.head(path)
        assert response.status_code == 200 and response.content == b""
    response = client.delete("/v1/devices/", headers=ADMIN, follow_redirects=False)
    assert response.status_code == 404 and "location" not in response.headers


def test_a_body_that_is_not_json_a_nan_and_a_chunked_body_past_the_limit(client):
    form = {**ADMIN, "content-type": "application/x-www-form-urlencoded"}
    response = client.post("/v1/devices", content=b"{}", headers=form)
    assert response.status_code == 422
    assert "send Content-Type: application/json" in response.json()["detail"]
    nan = client.post("/v1/alignment/rounds", content=b'{"learning_rate": NaN}', headers=ADMIN)
    assert nan.status_code == 422 and "learning_rate: Input should be a finite number" in nan.json()["detail"]

    def chunks():
        for _ in range(4):
            yield b"x" * 512

    chunked = client.post("/v1/devices", content=chunks(), headers=ADMIN)
    assert chunked.status_code == 413
    assert chunked.json()["detail"] == "request body is over the limit of 1024 bytes (max_body_bytes)"


def test_the_data_dir_and_the_store_are_owner_only(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)  # made by someone else, wider than the server wants
    (data / "harmony.sqlite3").touch(mode=0o644)
    (data / "harmony.sqlite3").chmod(0o644)
    with TestClient(create_app(make_settings(tmp_path, None))) as client:
        assert client.get("/v2/health/live").status_code == 200
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "harmony.sqlite3").stat().st_mode) == 0o600


def test_a_server_that_cannot_start_says_why_before_writing_anything(tmp_path):
    settings = make_settings(tmp_path, None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LaunchError, match=f"cannot listen on 127.0.0.1:{port}: Address already in use"):
            check_can_start(settings, "127.0.0.1", port)
    assert not settings.data_dir.exists()
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    under_a_file = make_settings(tmp_path, None, data_dir=a_file / "data")
    with pytest.raises(LaunchError, match="cannot use data dir"):
        check_can_start(under_a_file, "127.0.0.1", 0)
    unreachable = make_settings(tmp_path, None, database_url="postgresql://operator:hunter2@127.0.0.1:1/db")
    with pytest.raises(
        LaunchError, match=r"cannot open the store \(PostgreSQL\): connection failed"
    ) as error:
        check_can_start(unreachable, "127.0.0.1", 0)
    assert "hunter2" not in str(error.value)


def test_serve_reads_its_address_flags_from_the_environment(tmp_path):
    env = {"HARMONY_PORT": "70000", "HARMONY_DATA_DIR": str(tmp_path / "data")}
    result = CliRunner().invoke(cli_app, ["serve"], env=env)
    assert result.exit_code == 2 and "0<=x<=65535" in result.output  # HARMONY_PORT was read
    env = {"HARMONY_LOG_LEVEL": "loud", "HARMONY_DATA_DIR": str(tmp_path / "data")}
    result = CliRunner().invoke(cli_app, ["serve"], env=env)
    assert result.exit_code == 2 and "--log-level 'loud'" in result.output
    assert not os.path.exists(tmp_path / "data")
