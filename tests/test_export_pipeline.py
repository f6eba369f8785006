"""export_run end to end on a small run directory, the CLI, and bad inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from harmony_mobile.export import pipeline, steps, verify
from harmony_mobile.export.keys import PUBLIC_KEY_FILE, load_public_key
from harmony_mobile.export.manifest import MANIFEST_FILE, ManifestError, verify_manifest
from harmony_mobile.export.pipeline import export_run
from harmony_mobile.export.steps import ExportError
from typer.testing import CliRunner

from harmony_mobile.cli import app
from harmony_mobile.run_dir import RunDir, RunDirError, load_backend_file
from tests.export_fixtures import make_run_dir

TIERS = ["entry-android", "mid-ios"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def run_path(workspace):
    return make_run_dir(workspace / "run")


@pytest.fixture(scope="module")
def exported(workspace, run_path):
    """One full export (two tiers: XNNPACK fp32+int8, and Core ML fp16/int8/palette4)."""
    result = export_run(
        run_path,
        workspace / "out",
        tiers=TIERS,
        key_dir=workspace / "keys",
        latency_runs=10,
        progress=False,
    )
    return result


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


# --------------------------------------------------------------------------- the export directory


def test_layout_is_as_documented(exported):
    out = exported.out
    expected = {
        "manifest.json",
        "manifest.sig",
        "signing_key.pub",
        "verification.json",
        "verification.md",
        "backend/backend.pt",
        "backend/backend.pt2",
        "tiers/entry-android/front_fp32.pte",
        "tiers/entry-android/front_int8.pte",
        "tiers/mid-ios/front_fp32.pte",
        "tiers/mid-ios/front_int8.pte",
    }
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert expected <= files
    for variant in ("coreml-fp16", "coreml-int8", "coreml-palette4"):
        assert (out / f"tiers/mid-ios/front_{variant}.mlpackage/Manifest.json").is_file()
    assert exported.key_created
    assert leftovers(out.parent) == []


def test_manifest_describes_each_tier(exported, run_path, workspace):
    run = RunDir(run_path)
    manifest = verify_manifest(exported.out, workspace / "keys" / PUBLIC_KEY_FILE)
    assert manifest.model_version == run.info.model_version == exported.manifest.model_version
    assert manifest.class_names == list(run.info.class_names) and manifest.interface_shape == [64, 8, 8]
    assert [t.name for t in manifest.tiers] == TIERS
    for entry in manifest.tiers:
        tier = run.info.tiers.get(entry.name)
        client = run.representative_client(entry.name)
        assert (entry.family, entry.split_depth, entry.client_id) == (
            tier.family,
            tier.split_depth,
            client.client_id,
        )
        assert entry.threshold == pytest.approx(client.threshold) and entry.threshold_source == "calibrated"
        assert entry.input.name == "image" and entry.input.shape == [1, 1, 28, 28]
        assert entry.normalization.mean == list(run.info.mean) and entry.normalization.std == list(
            run.info.std
        )
        assert [(o.name, o.shape) for o in entry.outputs] == [
            ("exit_logits", [1, 10]),
            ("features", [1, 64, 8, 8]),
        ]
        assert entry.interface_shape == [64, 8, 8] and entry.class_names == manifest.class_names
        assert [a.quantization for a in entry.artifacts] == list(tier.quantization)
        for artifact in entry.artifacts:
            assert artifact.size > 0 and len(artifact.sha256) == 64 and artifact.batch == (1, 1)
    assert manifest.backend.state_dict_file == "backend/backend.pt"
    assert load_backend_file(exported.out / "backend/backend.pt").model_version == manifest.model_version
    assert load_public_key(exported.out / PUBLIC_KEY_FILE) == load_public_key(
        workspace / "keys" / PUBLIC_KEY_FILE
    )


def test_exported_pte_runs_like_the_clients_front_end(exported, run_path):
    run = RunDir(run_path)
    client, front_end = steps.select_front_end(run, "entry-android")
    images = run.dataset().images[client.test_idx[:8]]
    method = steps.load_method(exported.out / "tiers/entry-android/front_fp32.pte")
    for image in images:
        logits, features = method.execute([image[None].contiguous()])
        with torch.no_grad():
            ref_logits, ref_features = front_end(image[None])
        assert (logits - ref_logits).abs().max() <= 1e-4 and (features - ref_features).abs().max() <= 1e-4


def test_verification_report(exported):
    report = json.loads((exported.out / "verification.json").read_text())
    assert report == json.loads(json.dumps(exported.report))
    assert report["threads"] == 1 and report["versions"]["executorch"].startswith("1.5.1")
    for tier in report["tiers"]:
        assert tier["checks"]["fully_delegated"] and tier["checks"]["fp32_max_abs_le_1e-4"]
        # the client's 64 test + 40 validation images, then images it never trained on
        assert tier["test_samples"] == verify.GATE_SAMPLES == 1000
        assert tier["verification_images"] == {"test": 64, "val": 40, "other": 896}
        rows = {r["quantization"]: r for r in tier["pte"]}
        assert (
            rows["int8"]["float_layers"] == ["front_end.exit_head.mlp.2"]
            and rows["fp32"]["float_layers"] == []
        )
        assert rows["fp32"]["delegates"] >= 1 and rows["int8"]["undelegated"] == []
        fp32 = rows["fp32"]["vs_eager_fp32"]
        assert max(fp32["max_abs_logits"], fp32["max_abs_features"]) <= 1e-4
        simulation = rows["int8"]["vs_pt2e_simulation"]
        assert max(simulation["rel_l2_logits"], simulation["rel_l2_features"]) < 0.05
        assert rows["int8"]["size"] < rows["fp32"]["size"]
        for row in rows.values():
            latency = row["latency_batch1"]
            assert latency["eager_ms"] > 0 and latency["pte_ms"] > 0 and latency["pte_over_eager"] > 0
    coreml = {c["quantization"]: c for c in report["tiers"][1]["coreml"]}
    assert coreml["coreml-palette4"]["weights_size"] < coreml["coreml-int8"]["weights_size"]
    assert coreml["coreml-int8"]["weights_size"] < coreml["coreml-fp16"]["weights_size"]
    assert [o["name"] for o in coreml["coreml-fp16"]["outputs"]] == ["exit_logits", "features"]
    markdown = (exported.out / "verification.md").read_text()
    assert "check_coreml_on_mac" in markdown and "| entry-android | int8 |" in markdown


def test_manifest_records_each_variants_verdict_and_a_version(exported):
    manifest = exported.manifest
    verdicts = {(t.name, a.quantization): a.verdict for t in manifest.tiers for a in t.artifacts}
    checks = {t["tier"]: t["checks"] for t in exported.report["tiers"]}
    for (tier, quantization), verdict in verdicts.items():
        if quantization.startswith("coreml-"):
            assert verdict == "not_checked"
        else:  # this run's variants pass every check of theirs
            assert checks[tier]["int8_agreement_resolves_1pt"] and verdict == "pass", (tier, quantization)
    assert manifest.manifest_version >= 1_700_000_000  # UTC seconds


def test_a_failing_variant_stops_the_export_unless_allowed(run_path, tmp_path, monkeypatch):
    """With 40 gate images the agreement interval is wider than +-1 point: int8 fails its gate."""
    monkeypatch.setattr(verify, "GATE_SAMPLES", 40)
    built, build_programs = [], pipeline.export_personalization
    monkeypatch.setattr(
        pipeline, "export_personalization", lambda *a, **k: built.append(a[1].name) or build_programs(*a, **k)
    )
    runner = CliRunner()
    command = ["export", str(run_path), "--out", str(tmp_path / "out"), "--tiers", "entry-android"]
    command += ["--key-dir", str(tmp_path / "keys")]
    failed = runner.invoke(app, command)
    assert failed.exit_code == 1, failed.output
    output = " ".join(failed.output.split())
    assert "entry-android int8: int8_agreement_resolves_1pt" in output and "753 images" in output
    assert "entry-android fp32" not in output and "variant of tier entry-android" in output
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    assert built == []  # stopped before the tier's training programs
    allowed = runner.invoke(app, [*command, "--allow-failed-variants"])
    assert allowed.exit_code == 0, allowed.output
    assert built == ["entry-android"]
    manifest = verify_manifest(tmp_path / "out")
    artifacts = {a.quantization: a for a in manifest.tier("entry-android").artifacts}
    assert artifacts["int8"].verdict == "fail" and artifacts["fp32"].verdict == "pass"
    assert "int8_agreement_resolves_1pt" in artifacts["int8"].failed_checks
    assert pipeline.next_manifest_version(tmp_path / "out") > manifest.manifest_version - 1


def test_next_manifest_version_stays_above_the_export_it_replaces(exported, tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline.time, "time", lambda: exported.manifest.manifest_version - 3600.0)
    assert pipeline.next_manifest_version(exported.out) == exported.manifest.manifest_version + 1
    assert pipeline.next_manifest_version(tmp_path / "nothing") == exported.manifest.manifest_version - 3600


# --------------------------------------------------------------------------- tampering


@pytest.fixture
def copy_of_export(exported, tmp_path):
    return Path(shutil.copytree(exported.out, tmp_path / "copy"))


@pytest.mark.parametrize(
    "relpath",
    [
        "tiers/entry-android/front_int8.pte",
        "tiers/mid-ios/front_coreml-palette4.mlpackage/Data/com.apple.CoreML/weights/weight.bin",
        "backend/backend.pt2",
        "verification.json",
    ],
)
def test_a_changed_byte_in_an_exported_file_fails_verification(copy_of_export, relpath):
    path = copy_of_export / relpath
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=relpath.replace(".", r"\.")):
        verify_manifest(copy_of_export)


def test_cli_verify_fails_loudly_and_names_the_file(copy_of_export, workspace):
    runner = CliRunner()
    ok = runner.invoke(
        app,
        ["export", "verify", str(copy_of_export), "--public-key", str(workspace / "keys" / PUBLIC_KEY_FILE)],
    )
    assert ok.exit_code == 0, ok.output
    assert "signature valid" in " ".join(ok.output.split())
    manifest = json.loads((copy_of_export / MANIFEST_FILE).read_text())
    manifest["tiers"][0]["threshold"] = 0.05
    (copy_of_export / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    (copy_of_export / "tiers/mid-ios/front_fp32.pte").write_bytes(b"evil")
    bad = runner.invoke(app, ["export", "verify", str(copy_of_export)])
    assert bad.exit_code == 1
    assert "manifest.sig" in bad.output and "tiers/mid-ios/front_fp32.pte" in bad.output


# --------------------------------------------------------------------------- bad inputs


def test_run_without_a_trained_model_is_refused(tmp_path):
    unfinished = make_run_dir(tmp_path / "unfinished", clients_per_tier=1, finished=False)
    with pytest.raises(RunDirError, match="no trained model"):
        export_run(unfinished, tmp_path / "out", key_dir=tmp_path / "keys", progress=False)
    no_backend = make_run_dir(tmp_path / "no-backend", clients_per_tier=1, with_backend=False)
    with pytest.raises(RunDirError, match="no backend.pt"):
        export_run(no_backend, tmp_path / "out", key_dir=tmp_path / "keys", progress=False)
    with pytest.raises(RunDirError, match="not a harmony run directory"):
        export_run(tmp_path / "nothing", tmp_path / "out", key_dir=tmp_path / "keys", progress=False)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_weights_that_do_not_fit_the_tier_are_refused(tmp_path):
    run = make_run_dir(tmp_path / "run", clients_per_tier=1)
    client_file = run / "clients" / "client-002.pt"  # the "tiny" tier's client
    state = torch.load(client_file, weights_only=True)
    state["front_end_state"].pop(next(iter(state["front_end_state"])))
    torch.save(state, client_file)
    with pytest.raises(RunDirError, match="does not fit tier 'tiny'"):
        export_run(run, tmp_path / "out", tiers=["tiny"], key_dir=tmp_path / "keys", progress=False)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_unknown_tier_is_refused(run_path, tmp_path):
    with pytest.raises(ExportError, match="unknown tier 'watch'; known: entry-android, mid-ios, tiny"):
        export_run(run_path, tmp_path / "out", tiers=["watch"], key_dir=tmp_path / "keys", progress=False)
    assert not (tmp_path / "out").exists()


def test_tier_for_another_input_shape_is_refused(tmp_path):
    from harmony_mobile.run_dir import write_run_info

    run_path = make_run_dir(tmp_path / "run", clients_per_tier=1)
    info = RunDir(run_path).info
    tiers = info.tiers.model_copy(
        update={"tiers": tuple(t.model_copy(update={"input_shape": (3, 32, 32)}) for t in info.tiers.tiers)}
    )
    write_run_info(run_path, info.model_copy(update={"tiers": tiers}))
    with pytest.raises(ExportError, match=r"expects input \(3, 32, 32\)"):
        export_run(run_path, tmp_path / "out", tiers=["tiny"], key_dir=tmp_path / "keys", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["under-a-file", "read-only-fs", "not-an-export"])
def test_unwritable_output_is_refused(run_path, tmp_path, where):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    out = {
        "under-a-file": tmp_path / "a-file" / "out",
        "read-only-fs": Path("/proc/harmony-export-test/out"),
        "not-an-export": tmp_path / "precious",
    }[where]
    with pytest.raises(ExportError, match="cannot write|refusing to replace"):
        export_run(run_path, out, tiers=["tiny"], key_dir=tmp_path / "keys", progress=False)
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep me"
    assert leftovers(tmp_path) == []


def test_a_failure_midway_leaves_no_artifact_directory(run_path, tmp_path, monkeypatch):
    def explode(*args, **kwargs):
        raise ExportError("simulated failure while exporting the back-end")

    monkeypatch.setattr(pipeline.steps, "export_backend", explode)
    with pytest.raises(ExportError, match="simulated failure"):
        export_run(
            run_path, tmp_path / "new" / "out", tiers=["tiny"], key_dir=tmp_path / "keys", progress=False
        )
    assert not (tmp_path / "new").exists()  # not even the parent it created


def test_move_into_place_replaces_an_existing_export(tmp_path):
    out, work = tmp_path / "out", tmp_path / ".out.partial-1"
    out.mkdir()
    (out / MANIFEST_FILE).write_text("old")
    work.mkdir()
    (work / MANIFEST_FILE).write_text("new")
    pipeline._move_into_place(work, out)
    assert (out / MANIFEST_FILE).read_text() == "new" and not work.exists() and leftovers(tmp_path) == []


# --------------------------------------------------------------------------- the CLI


def test_cli_export_then_verify(run_path, tmp_path):
    runner = CliRunner()
    keys, out = tmp_path / "keys", tmp_path / "cli-out"
    result = runner.invoke(
        app,
        [
            "export",
            str(run_path),
            "--out",
            str(out),
            "--tiers",
            "tiny",
            "--dynamic-batch",
            "4",
            "--key-dir",
            str(keys),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "signed manifest" in result.output
    manifest = verify_manifest(out, keys / PUBLIC_KEY_FILE)
    assert [a.batch for a in manifest.tier("tiny").artifacts] == [(1, 4)]
    assert steps.planned_input_shape(out / "tiers/tiny/front_fp32.pte")[0] == 4
    verified = runner.invoke(app, ["export", "verify", str(out), "--public-key", str(keys / PUBLIC_KEY_FILE)])
    assert verified.exit_code == 0, verified.output


def test_cli_errors_are_clear(run_path, tmp_path):
    """Bad input (a tier, a run dir, a folder) exits 2 before any work, like every command's."""
    runner = CliRunner()
    result = runner.invoke(app, ["export", str(run_path), "--out", str(tmp_path / "o"), "--tiers", "watch"])
    assert result.exit_code == 2 and "unknown tier 'watch'" in result.output
    # a path longer than the terminal is printed whole on one line, so it can be copied
    missing = tmp_path / ("missing-" + "x" * 100)
    result = runner.invoke(app, ["export", str(missing), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and f"{missing} is not a harmony run directory" in result.output
    result = runner.invoke(app, ["export", "verify", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "not a directory" in result.output
    assert not (tmp_path / "o").exists()
