"""The privacy boundary of the server, checked on the code itself: no request model, route parameter
or server function can take a label (tokens only), and no log line or stored row holds feature
values or tokens in the clear."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import pkgutil
import re
import time
import typing

import harmony_mobile.server as server_package
import numpy as np
import pytest
import torch
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from harmony_mobile.server import create_app
from harmony_mobile.server.core import schemas
from harmony_mobile.server.routes import admin, devices, status, uploads, v2, v2_infer
from pydantic import BaseModel

from harmony_mobile.protocol.label_tokens import class_tokens, epoch_key
from harmony_mobile.protocol.messages import SERVER_BOUND
from harmony_mobile.protocol.wire import UploadMetadata
from tests.helpers.fallback_server import (
    ADMIN,
    CLASS_NAMES,
    FEDERATION_SECRET,
    LABEL_EPOCH,
    bearer,
    class_features,
    enrol,
    json_infer_body,
    make_model_dir,
    make_settings,
    sealed_upload,
)

torch.set_num_threads(1)
LABEL_LIKE = re.compile(
    r"^(y|ys|label|labels|target|targets|class|classes|class_id|class_ids|class_index|true_class)$"
)


def label_like(name: str) -> bool:
    return bool(LABEL_LIKE.match(name.lower()))


def is_model(candidate) -> bool:
    """A pydantic model or a dataclass (a response may list the store's records)."""
    return inspect.isclass(candidate) and (
        issubclass(candidate, BaseModel) or dataclasses.is_dataclass(candidate)
    )


def model_field_names(model: type, seen=None) -> set[str]:
    """Field names of a pydantic model or dataclass and every model nested in it."""
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    if issubclass(model, BaseModel):
        annotations = {name: field.annotation for name, field in model.model_fields.items()}
    else:
        annotations = typing.get_type_hints(model)
    names = set(annotations)
    for annotation in annotations.values():
        for candidate in getattr(annotation, "__args__", ()) + (annotation,):
            if is_model(candidate):
                names |= model_field_names(candidate, seen)
    return names


def server_modules():
    for info in pkgutil.walk_packages(server_package.__path__, prefix="harmony_mobile.server."):
        yield importlib.import_module(info.name)


def test_no_request_or_response_model_has_a_label_field():
    models = [m for m in vars(schemas).values() if is_model(m)]
    models.append(UploadMetadata)
    assert len(models) > 15
    for model in models:
        offending = {n for n in model_field_names(model) if label_like(n)}
        assert not offending, f"{model.__name__} has label-like fields {offending}"
    for message in SERVER_BOUND:  # what the alignment worker consumes
        assert not [f.name for f in dataclasses.fields(message) if label_like(f.name)]


def test_no_route_and_no_server_function_takes_a_label(tmp_path):
    app = create_app(make_settings(tmp_path, None))
    routers = [app.router] + [module.router for module in (v2, v2_infer, devices, uploads, admin, status)]
    routes = [r for router in routers for r in router.routes if isinstance(r, APIRoute)]
    assert len(routes) > 15
    for route in routes:
        params = route.dependant.query_params + route.dependant.path_params + route.dependant.header_params
        assert not [p.name for p in params if label_like(p.name)], route.path
        for body in route.dependant.body_params:
            annotation = body.field_info.annotation
            if is_model(annotation):
                assert not {n for n in model_field_names(annotation) if label_like(n)}, route.path
    checked = 0
    for module in server_modules():
        for _, member in inspect.getmembers(module, inspect.isfunction):
            if member.__module__ == module.__name__:
                checked += 1
                assert not [p for p in inspect.signature(member).parameters if label_like(p)], (
                    member.__qualname__
                )
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                for _, method in inspect.getmembers(cls, inspect.isfunction):
                    assert not [p for p in inspect.signature(method).parameters if label_like(p)], (
                        method.__qualname__
                    )
    assert checked > 30
    app.state.harmony.store.close()


@pytest.mark.parametrize("name", ["labels", "y", "class_ids", "target"])
def test_the_label_check_itself_catches_labels(name):
    assert label_like(name)
    assert not label_like("label_tokens")


def test_logs_and_store_hold_no_features_or_tokens(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    classes = np.arange(40) % 10
    features = class_features(classes, seed=7)
    tokens = class_tokens(epoch_key(FEDERATION_SECRET, LABEL_EPOCH), [CLASS_NAMES[c] for c in classes])
    settings = make_settings(tmp_path, make_model_dir(tmp_path))
    with TestClient(create_app(settings)) as client:
        device = enrol(client)
        auth = bearer(device["token"])
        for i in range(3):
            body = sealed_upload(device, LABEL_EPOCH, classes, features=features + i)
            assert client.post("/v1/uploads", json=body, headers=auth).status_code == 201
        tampered = sealed_upload(device, LABEL_EPOCH, classes, features=features)
        tampered["label_epoch"] = "e-another-epoch"
        assert client.post("/v1/uploads", json=tampered, headers=auth).status_code == 400
        assert (
            client.post(
                "/v2/models/harmony-backend/infer", json=json_infer_body(features[:2]), headers=auth
            ).status_code
            == 200
        )
        round_id = client.post(
            "/v1/alignment/rounds", json={"steps": 6, "batch_size": 16}, headers=ADMIN
        ).json()["id"]
        for _ in range(600):
            status = client.get(f"/v1/alignment/rounds/{round_id}", headers=ADMIN).json()["status"]
            if status not in ("queued", "running"):
                break
            time.sleep(0.05)
        assert status in ("published", "rejected")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "upload stored" in logged and "upload rejected" in logged  # the logs are there and say something
    for token in tokens:
        assert token.hex() not in logged
    for value in features.ravel()[:200]:
        if value > 0:
            assert f"{value:.4f}" not in logged and repr(float(value)) not in logged
    stored = b"".join(p.read_bytes() for p in settings.data_dir.glob("harmony.sqlite3*"))
    # The store holds each version's slot table (every class's token, public to enrolled phones via V2
    # metadata), so single tokens are expected in it; what must never be there is an upload's per-row
    # tokens, in the layout of the upload metadata or packed, nor its features.
    per_row = ", ".join(f'"{t.hex()}"' for t in tokens[:3]).encode()
    assert per_row not in stored and per_row.replace(b" ", b"") not in stored
    assert b"".join(tokens[:3]) not in stored
    assert features[:4].tobytes() not in stored
