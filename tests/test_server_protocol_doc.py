"""docs/PROTOCOL.md and the server agree on every status code: the per-route table in section 8
is exactly what the app's OpenAPI document says each route can answer, route for route. The
defaults the document states (enrolment limits, alignment round parameters) are the server's."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fastapi.routing import APIRoute
from harmony_mobile.server import create_app
from harmony_mobile.server.core.schemas import AlignmentParams
from harmony_mobile.server.core.settings import Settings
from harmony_mobile.server.routes import admin, artifacts, devices, uploads, v2, v2_infer

from tests.helpers.fallback_server import make_settings

PROTOCOL = Path(__file__).resolve().parents[1] / "docs" / "PROTOCOL.md"
ROW = re.compile(r"^\| `(?P<method>[A-Z]+) (?P<path>\S+)` \| (?P<statuses>[0-9, ]+) \|$")


def documented() -> dict[tuple[str, str], set[str]]:
    text = PROTOCOL.read_text()
    table = text.split("<!-- status-table:start -->")[1].split("<!-- status-table:end -->")[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        match = ROW.match(line)
        assert match, f"malformed status table row: {line!r}"
        rows[(match["method"], match["path"])] = set(match["statuses"].replace(" ", "").split(","))
    return rows


def test_status_table_matches_the_app(tmp_path):
    app = create_app(make_settings(tmp_path, None))
    try:
        schema = app.openapi()
    finally:
        app.state.harmony.store.close()
    routers = [module.router for module in (v2, v2_infer, devices, artifacts, uploads, admin)]
    served = {
        (method, re.sub(r":\w+}", "}", route.path))  # `{path:path}` is `{path}` in the OpenAPI document
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        for method in route.methods
    }
    from_app = {
        (method.upper(), path): set(operation["responses"])
        for path, item in schema["paths"].items()
        for method, operation in item.items()
    }
    assert set(from_app) == served  # the document covers every route the app serves
    table = documented()
    assert set(table) == served, set(table) ^ served
    for route, statuses in from_app.items():
        assert table[route] == statuses, route


def test_every_status_in_the_table_has_a_meaning_row():
    text = PROTOCOL.read_text()
    section = text.split("## 8. Status codes")[1].split("<!-- status-table:start -->")[0]
    explained = set(re.findall(r"^\| (\d{3}) \|", section, flags=re.M))
    used = set().union(*documented().values())
    assert used <= explained, used - explained


def test_the_enrolment_example_states_the_default_limits():
    limits = re.search(r'"limits":(\{[^}]*\})', PROTOCOL.read_text())
    assert limits, "no limits object in the enrolment example"
    for name, value in json.loads(limits[1]).items():
        assert Settings.model_fields[name].default == value, name


def test_the_alignment_parameter_table_states_the_defaults():
    text = PROTOCOL.read_text()
    table = text.split("Alignment round parameters")[1].split("\n\n")[1]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", table, flags=re.M)
    assert {name for name, _ in rows} == set(AlignmentParams.model_fields)
    for name, written in rows:
        assert AlignmentParams.model_fields[name].default == json.loads(written.strip()), name
