"""Two server processes on one PostgreSQL, as replicas behind a load balancer: a device enrolled on
one authenticates on the other, an upload acknowledged by one is visible to the other, and a
replay through the other is a duplicate (a different envelope under that message id is a 409).
A version registered by one replica is served by the other (its file comes from the store) and
a new default reaches the replica that did not set it."""

from __future__ import annotations

import shutil
import time
import uuid

import httpx

from tests.helpers.fallback_server import ADMIN, LABEL_EPOCH, bearer, make_model_dir, sealed_upload
from tests.postgres import create_database
from tests.server_process import serve


def test_two_replicas_share_one_postgresql(tmp_path, postgres_server):
    url = create_database(postgres_server)
    model_dir = make_model_dir(tmp_path / "a")
    newer_model_dir = make_model_dir(tmp_path / "b", seed=1, model_version="v2")
    first_dir, second_dir = tmp_path / "replica-1", tmp_path / "replica-2"
    with serve(first_dir, model_dir, "--database-url", url) as first:
        # Replicas share the sealing key (phones pin one public key): provisioned like a secret.
        second_dir.mkdir()
        shutil.copy(first_dir / "server_key.x25519", second_dir / "server_key.x25519")
        with serve(second_dir, newer_model_dir, "--database-url", url, "--no-alignment") as second:
            device = httpx.post(f"{first}/v1/devices", json={"tier": "mid-android"}, headers=ADMIN).json()
            auth = bearer(device["token"])
            body = sealed_upload(device, LABEL_EPOCH, [1, 2, 3])

            stored = httpx.post(f"{first}/v1/uploads", json=body, headers=auth)
            assert stored.status_code == 201, stored.text
            replay = httpx.post(f"{second}/v1/uploads", json=body, headers=auth)
            assert replay.status_code == 200 and replay.json()["duplicate"] is True
            assert replay.json()["upload_id"] == stored.json()["upload_id"]

            other = sealed_upload(device, LABEL_EPOCH, [4], message_id=uuid.UUID(body["message_id"]))
            conflict = httpx.post(f"{second}/v1/uploads", json=other, headers=auth)
            assert conflict.status_code == 409

            listed = httpx.get(f"{second}/v1/devices", headers=ADMIN).json()
            assert [d["device_id"] for d in listed] == [device["device_id"]]
            # the second replica imported a new export: v2 is the default of the shared registry
            registry = httpx.get(f"{first}/v1/registry/versions", headers=ADMIN).json()
            assert registry["default"] == "v2" and [v["version"] for v in registry["versions"]] == [
                "v1",
                "v2",
            ]
            x = {
                "inputs": [
                    {"name": "features", "shape": [1, 64, 8, 8], "datatype": "FP32", "data": [0.5] * 4096}
                ]
            }
            on_second = httpx.post(
                f"{second}/v2/models/harmony-backend/versions/v1/infer", json=x, headers=auth
            )
            assert on_second.json()["model_version"] == "v1"  # v1's file came from the store
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # the first replica follows the new default
                answer = httpx.post(f"{first}/v2/models/harmony-backend/infer", json=x, headers=auth).json()
                if answer["model_version"] == "v2":
                    break
                time.sleep(0.2)
            assert answer["model_version"] == "v2"
            refused = httpx.post(f"{second}/v1/alignment/rounds", json={}, headers=ADMIN)
            assert refused.status_code == 409 and "does not run alignment rounds" in refused.json()["detail"]
