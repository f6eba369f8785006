"""The provisioning payload (export/provisioning.py): the format phones read the federation secret
from, agreed with harmony-core and HarmonyKit through tests/vectors/provisioning_payloads.json, and
`harmony provision`, which writes it owner-only outside the apps."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from harmony_mobile.export.provisioning import (
    MANAGED_CONFIG_KEY,
    URI_PREFIX,
    ProvisionedDevice,
    Provisioning,
    ProvisioningError,
    parse_payload,
    payload_json,
    payload_uri,
    provisioned_device,
)
from typer.testing import CliRunner

from harmony_mobile.cli import app
from harmony_mobile.run_dir import RunDir, save_client, write_federation_secret
from tests.export_fixtures import fake_export_dir, make_run_dir

ROOT = Path(__file__).resolve().parents[1]
CASES = json.loads((ROOT / "tests" / "vectors" / "provisioning_payloads.json").read_text(encoding="utf-8"))
SECRET = bytes(range(50, 82))


def _expected(case: dict) -> Provisioning:
    device, own = case["device"], case["own_classes"]
    return Provisioning(
        bytes.fromhex(case["federation_secret_hex"]),
        case["server_url"],
        None
        if device is None
        else ProvisionedDevice(
            device["device_id"], device["token"], bytes.fromhex(device["server_public_key_hex"])
        ),
        None if own is None else {tier: tuple(classes) for tier, classes in own.items()},
    )


@pytest.mark.parametrize("case", CASES["valid"], ids=lambda c: c["name"])
def test_valid_payloads_parse_and_python_writes_them_byte_for_byte(case):
    expected = _expected(case)
    assert parse_payload(case["payload"]) == expected
    if case["payload"].startswith(URI_PREFIX):
        assert payload_uri(expected) == case["payload"]  # what harmony-core and HarmonyKit read
    else:
        assert payload_json(expected) == case["payload"].strip()


@pytest.mark.parametrize("case", CASES["invalid"], ids=lambda c: c["name"])
def test_invalid_payloads_are_refused(case):
    with pytest.raises(ProvisioningError):
        parse_payload(case["payload"])


def test_the_vector_file_names_the_constants_the_apps_use():
    assert CASES["uri_prefix"] == URI_PREFIX and CASES["managed_config_key"] == MANAGED_CONFIG_KEY
    assert len(CASES["valid"]) >= 4 and len(CASES["invalid"]) >= 25


def test_a_payload_never_shows_its_secret_in_a_repr():
    provisioning = Provisioning(SECRET, None, ProvisionedDevice("d", "a-bearer-token", bytes(32)))
    assert SECRET.hex() not in repr(provisioning) and "a-bearer-token" not in repr(provisioning)


def test_an_enrolment_response_becomes_the_device_part():
    device = provisioned_device({"device_id": "d1", "token": "t", "server_public_key": "AA" * 21 + "A="})
    assert device.device_id == "d1" and len(device.server_public_key) == 32
    with pytest.raises(ProvisioningError, match="not an enrolment response"):
        provisioned_device({"device_id": "d1"})


@pytest.fixture
def run(tmp_path) -> Path:
    write_federation_secret(tmp_path / "run", SECRET)
    return tmp_path / "run"


def test_harmony_provision_writes_an_owner_only_payload(run, tmp_path):
    out = tmp_path / "secrets" / "phone-1.txt"
    result = CliRunner().invoke(
        app, ["provision", "--run", str(run), "--out", str(out), "--server-url", "http://10.0.0.2:8000"]
    )
    assert result.exit_code == 0, result.output
    assert out.stat().st_mode & 0o777 == 0o600
    assert parse_payload(out.read_text()) == Provisioning(SECRET, "http://10.0.0.2:8000")
    assert SECRET.hex() not in result.output


def test_harmony_provision_refuses_the_app_trees_and_a_missing_run(run, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    inside = ROOT / "android_demo" / "app" / "src" / "main" / "assets" / "payload.txt"
    result = CliRunner().invoke(app, ["provision", "--run", str(run), "--out", str(inside)])
    assert result.exit_code == 2 and "ship in the app" in " ".join(result.output.split())
    assert not inside.exists()
    monkeypatch.chdir(tmp_path)  # run from outside the checkout: the app trees are still found
    result = CliRunner().invoke(app, ["provision", "--run", str(run), "--out", str(inside)])
    assert result.exit_code == 2 and "ship in the app" in " ".join(result.output.split())
    assert not inside.exists()
    missing = CliRunner().invoke(app, ["provision", "--run", str(tmp_path / "nope"), "--out", "-"])
    assert missing.exit_code == 2 and "federation_secret" in missing.output
    printed = CliRunner().invoke(app, ["provision", "--run", str(run), "--out", "-"])
    assert printed.exit_code == 0 and parse_payload(printed.output).federation_secret == SECRET


def test_harmony_provision_names_each_exported_tiers_own_classes(tmp_path):
    """With --export the payload says, per tier, the classes of the client whose front-end the export
    ships (what a demo app's slot gate needs), read from the manifest once it verifies; a manifest
    signed by another than the pinned key, a tampered one and an export of another run are refused."""
    run = make_run_dir(tmp_path / "run")
    for client in RunDir(run).clients():  # clients that hold different classes, as after training
        save_client(run, replace(client, classes=tuple(range(client.client_id, client.client_id + 3))))
    clients, names = RunDir(run).clients(), RunDir(run).info.class_names
    shipped = {c.tier: c for c in reversed(clients) if c.tier in ("entry-android", "mid-ios")}
    export = fake_export_dir(
        tmp_path / "export", tmp_path / "keys", {t: c.client_id for t, c in shipped.items()}
    )

    def provision(export_dir: Path, *extra: str):
        command = ["provision", "--run", str(run), "--export", str(export_dir), "--out", "-", *extra]
        result = CliRunner().invoke(app, command)
        return result.exit_code, " ".join(result.output.split())

    code, output = provision(export, "--public-key", str(tmp_path / "keys" / "signing_key.pub"))
    assert code == 0, output
    own = parse_payload(output).own_classes
    assert own == {t: tuple(names[c] for c in client.classes) for t, client in shipped.items()}
    assert len(set(own.values())) == len(own)  # each tier its own client's classes
    other_key = fake_export_dir(tmp_path / "other", tmp_path / "other-keys") / "signing_key.pub"
    code, output = provision(export, "--public-key", str(other_key))
    assert code == 2 and "does not verify" in output
    manifest_file = export / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["tiers"][0]["client_id"] = shipped["mid-ios"].client_id  # another phone's front-end named
    manifest_file.write_text(json.dumps(manifest))
    code, output = provision(export)
    assert code == 2 and "does not verify" in output and "signature" in output
    foreign = fake_export_dir(tmp_path / "foreign", tmp_path / "keys", class_names=tuple("abcdefghij"))
    code, output = provision(foreign)
    assert code == 2 and "was not exported from" in output
