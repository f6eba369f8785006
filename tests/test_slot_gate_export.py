"""A run whose phones exit by the slot margin, shipped: the export writes the server's slot
prototypes beside the back-end, signs them into the manifest with the tier's exit rule and margin
threshold, and the Python device runtime exits by the margin those prototypes give
(docs/PROTOCOL.md 3.5). One small export of the fp32-only `tiny` tier, built once per module."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from harmony_mobile.export.apps import install
from harmony_mobile.export.keys import PUBLIC_KEY_FILE, encode_public_key, load_or_create_signing_key
from harmony_mobile.export.manifest import Manifest
from harmony_mobile.export.pipeline import SLOT_PROTOTYPES_FILE, export_run
from harmony_mobile.export.provisioning import parse_payload
from harmony_mobile.server import create_app

from harmony_mobile.device import (
    DeviceCredentials,
    DeviceError,
    FederationKey,
    ModelStore,
    Phone,
    UploadQueue,
    decode_public_key,
    fetch_server_artifact,
    fetch_signed_manifest,
    load_front_end,
    load_manifest,
    load_slot_prototypes,
    normalize,
)
from harmony_mobile.federation.slot_gate import slot_prototypes
from harmony_mobile.protocol.slot_gate import slot_margin
from harmony_mobile.protocol.wire import decode_tensor
from harmony_mobile.run_dir import RunDir
from tests.export_fixtures import CLASS_NAMES, FIXTURE_SECRET, make_run_dir
from tests.helpers.fallback_server import enrol, make_settings

TIER = "tiny"
OWN = ("1", "4", "7")
SLOT_CLASSES = [3, 7, 0, 9, 1, 5, 8, 2, 6, 4]  # slot s holds class SLOT_CLASSES[s]: not class order


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("slot-gate")
    run = make_run_dir(
        root / "run", algorithm_config={"exit_rule": "slot_margin"}, replay_rows=64, slot_classes=SLOT_CLASSES
    )
    key, _ = load_or_create_signing_key(root / "keys")
    export_run(
        run, root / "export", tiers=[TIER], private_key=key, latency_runs=2, test_samples=8, progress=False
    )
    return root / "run", root / "export", encode_public_key(key.public_key())


def phone(export_dir, manifest, http, **options) -> Phone:
    return Phone(
        manifest=manifest,
        tier=TIER,
        program=load_front_end(export_dir, manifest, TIER, "fp32"),
        server_url="http://testserver",
        credentials=options.pop("credentials", DeviceCredentials("d", "t", bytes(32), {})),
        federation_key=FederationKey(FIXTURE_SECRET),
        queue=UploadQueue(export_dir.parent / "queue"),
        http=http,
        **options,
    )


def test_the_manifest_carries_the_rule_the_threshold_and_the_prototypes(export):
    run_dir, export_dir, pinned = export
    manifest = load_manifest(export_dir, pinned)
    run = RunDir(run_dir)
    tier = manifest["tiers"][0]
    assert tier["exit_rule"] == "slot_margin"
    assert tier["threshold"] == pytest.approx(run.representative_client(TIER).threshold)
    entry = manifest["slot_prototypes"]
    assert entry["path"] == SLOT_PROTOTYPES_FILE and entry["shape"] == [10, 64 * 8 * 8]
    served = run.backend()
    expected = slot_prototypes(served.backend, len(served.slot_table.tokens), served.replay)
    shipped = decode_tensor((export_dir / SLOT_PROTOTYPES_FILE).read_bytes())
    assert np.array_equal(shipped, expected.numpy()) and (np.abs(shipped).sum(axis=1) > 0).any()
    assert torch.equal(load_slot_prototypes(export_dir, manifest), expected)


def test_the_phone_exits_by_the_margin_of_its_own_slots(export):
    _, export_dir, pinned = export
    manifest = load_manifest(export_dir, pinned)
    prototypes = load_slot_prototypes(export_dir, manifest)
    own = torch.tensor([CLASS_NAMES[c] in OWN for c in SLOT_CLASSES])
    program = load_front_end(export_dir, manifest, TIER, "fp32")
    normalization = manifest["tiers"][0]["normalization"]
    pixels = np.random.default_rng(0).integers(0, 256, (24, 1, 28, 28)).astype(np.uint8)
    margins = []
    for image in pixels:
        _, features = program.run(normalize(image, normalization))
        margins.append(float(slot_margin(features.double(), prototypes.double(), own)[0]))
    threshold = float(np.median(margins))  # random front-ends: a threshold that splits these samples
    refused = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    gated = phone(
        export_dir, manifest, refused, slot_prototypes=prototypes, own_classes=OWN, threshold=threshold
    )
    decisions = [gated.would_exit(image) for image in pixels]
    assert decisions == [m >= threshold for m in margins]
    assert 0 < sum(decisions) < len(decisions)
    for image, margin in zip(pixels, margins, strict=True):
        answer = gated.classify(image)
        assert answer.confidence == pytest.approx(margin, abs=1e-12)
        assert (answer.source == "local") == (margin >= threshold)


def test_a_gated_tier_needs_its_prototypes_and_the_phones_classes(export):
    _, export_dir, pinned = export
    manifest = load_manifest(export_dir, pinned)
    prototypes = load_slot_prototypes(export_dir, manifest)
    http = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    with pytest.raises(DeviceError, match="slot_prototypes"):
        phone(export_dir, manifest, http, own_classes=OWN)
    with pytest.raises(DeviceError, match="slot_prototypes"):
        phone(export_dir, manifest, http, slot_prototypes=prototypes)
    with pytest.raises(DeviceError, match="unknown"):
        phone(export_dir, manifest, http, slot_prototypes=prototypes, own_classes=("cat",))
    with pytest.raises(ValueError, match="slot_margin exit threshold"):
        phone(export_dir, manifest, http, slot_prototypes=prototypes, own_classes=OWN, threshold=-2.5)
    with pytest.raises(DeviceError, match="slot prototypes of shape"):
        phone(export_dir, manifest, http, slot_prototypes=prototypes[:, :10], own_classes=OWN)
    energy = {**manifest, "tiers": [{**manifest["tiers"][0], "exit_rule": "energy"}]}
    with pytest.raises(DeviceError, match="exits by 'energy'"):
        phone(export_dir, energy, http, slot_prototypes=prototypes, own_classes=OWN)


def test_tampered_prototypes_are_refused(export, tmp_path):
    _, export_dir, pinned = export
    manifest = load_manifest(export_dir, pinned)
    copy = tmp_path / "export"
    copy.mkdir()
    data = bytearray((export_dir / SLOT_PROTOTYPES_FILE).read_bytes())
    data[-1] ^= 1
    (copy / SLOT_PROTOTYPES_FILE).write_bytes(bytes(data))
    with pytest.raises(DeviceError, match="does not match the signed manifest"):
        load_slot_prototypes(copy, manifest)


def test_the_schema_ties_slot_margin_tiers_to_prototypes_and_a_margin_threshold(export):
    _, export_dir, _ = export
    document = json.loads((export_dir / "manifest.json").read_text())
    Manifest.model_validate(document)
    without = {k: v for k, v in document.items() if k != "slot_prototypes"}
    with pytest.raises(ValueError, match="needs slot_prototypes"):
        Manifest.model_validate(without)
    low = {**document, "tiers": [{**document["tiers"][0], "threshold": -2.5}]}
    with pytest.raises(ValueError, match="slot_margin threshold"):
        Manifest.model_validate(low)
    softmax = {**document, "tiers": [{**document["tiers"][0], "exit_rule": "max_softmax", "threshold": -0.1}]}
    with pytest.raises(ValueError, match="max_softmax threshold"):
        Manifest.model_validate(softmax)


def test_phones_install_the_prototypes_over_the_air_and_the_server_answers_a_gated_phone(export, tmp_path):
    _, export_dir, pinned = export
    manifest = load_manifest(export_dir, pinned)
    prototypes = load_slot_prototypes(export_dir, manifest)
    with TestClient(create_app(make_settings(tmp_path, export_dir))) as client:
        enrolment = enrol(client, tier=TIER)
        credentials = DeviceCredentials.from_enrolment(enrolment)
        store = ModelStore(tmp_path / "store", decode_public_key(pinned), TIER)
        installed = store.install(
            *fetch_signed_manifest(client, enrolment["token"]),
            fetch_server_artifact(client, enrolment["token"]),
        )
        assert torch.equal(load_slot_prototypes(installed.directory, installed.manifest), prototypes)
        assert store.current().manifest_version == installed.manifest_version
        (installed.directory / SLOT_PROTOTYPES_FILE).write_bytes(b"HMFT rot")
        with pytest.raises(DeviceError, match="does not match the signed manifest"):
            store.current()
        gated = phone(
            export_dir,
            manifest,
            client,
            credentials=credentials,
            slot_prototypes=prototypes,
            own_classes=OWN,
            threshold=2.5,  # above every margin: everything falls back
        )
        image = np.random.default_rng(1).integers(0, 256, (1, 28, 28)).astype(np.uint8)
        answer = gated.classify(image)
    assert answer.source == "server" and answer.server_version == manifest["model_version"]


def test_a_run_exiting_by_a_rule_no_phone_computes_is_refused(tmp_path):
    from harmony_mobile.export.steps import ExportError

    run = make_run_dir(tmp_path / "run", algorithm_config={"exit_rule": "neg_entropy"})
    with pytest.raises(ExportError, match="exit by neg_entropy"):
        export_run(run, tmp_path / "export", tiers=[TIER], key_dir=tmp_path / "keys", progress=False)
    assert not (tmp_path / "export").exists()


def test_on_device_personalization_recalibrates_tau_on_the_margin(export, tmp_path):
    from harmony_mobile.device.personalization import (
        Personalizer,
        calibrate_exit_threshold,
        personalize_phone,
    )

    _, export_dir, pinned = export
    manifest = load_manifest(export_dir, pinned)
    http = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    gated = phone(
        export_dir,
        manifest,
        http,
        slot_prototypes=load_slot_prototypes(export_dir, manifest),
        own_classes=OWN,
    )
    rng = np.random.default_rng(2)
    pixels = rng.integers(0, 256, (100, 1, 28, 28)).astype(np.uint8)
    class_ids = rng.integers(0, 10, 100).tolist()
    result = personalize_phone(
        gated,
        Personalizer(export_dir, manifest, TIER),
        (pixels[:60], class_ids[:60]),
        (pixels[60:], class_ids[60:]),
        steps=2,
        seed=0,
        model_version="test+local-1",
        target=0.3,
    )
    logits, features = gated.program.run(normalize(pixels[60:], gated.normalization))
    correct = (logits.argmax(dim=1) == gated.exit_positions(class_ids[60:])).numpy()
    margins = slot_margin(
        features.double(), load_slot_prototypes(export_dir, manifest).double(), gated._slot_gate[1]
    )
    softmax = torch.softmax(logits.float(), dim=1).max(dim=1).values
    assert gated.threshold == result.threshold == calibrate_exit_threshold(margins.numpy(), correct, 0.3)
    assert gated.threshold != calibrate_exit_threshold(softmax.numpy(), correct, 0.3)


def test_export_app_provisions_each_tier_with_the_classes_its_phone_holds(export, tmp_path):
    """A demo app installs a front-end personalized on another client's data: the payload export-app
    writes names that client's classes per tier (the slot gate's own slots), beside the secret."""
    run_dir, export_dir, _ = export
    repo = tmp_path / "repo"
    (repo / "ios_demo" / "HarmonyDemo" / "HarmonyDemo" / "Resources").mkdir(parents=True)
    result = install(
        "ios", export_dir, repo, run_dir=run_dir, pinned_key=export_dir.parent / "keys" / PUBLIC_KEY_FILE
    )
    run = RunDir(run_dir)
    client = run.representative_client(TIER)
    own = parse_payload(result.payload.read_text()).own_classes
    assert own == {TIER: tuple(run.info.class_names[c] for c in client.classes)}
    assert SLOT_PROTOTYPES_FILE in result.copied  # installed from the app's bundle with the tier's artifact
