"""`export_run`: a finished training run -> a signed export directory, tier by tier.

Output directory layout:

    OUT/
      manifest.json  manifest.sig  signing_key.pub      (manifest.py)
      verification.json  verification.md              (verify.py)
      backend/backend.pt                              g + h state dicts, run_dir.save_backend format
      backend/backend.pt2                             torch.export of g, dynamic batch
      tiers/<tier>/front_fp32.pte                     XNNPACK, fully delegated
      tiers/<tier>/front_int8.pte                     PT2E static int8 per-channel, XNNPACK
      tiers/<tier>/front_coreml-fp16.mlpackage/       ML Program, iOS 16+ (coreml tiers)
      tiers/<tier>/front_coreml-int8.mlpackage/       int8 weights
      tiers/<tier>/front_coreml-palette4.mlpackage/   4-bit k-means palettized weights

Everything is written into a temporary directory beside OUT and renamed into place only after
the manifest was signed and verified, so a failure never leaves a half-written OUT. An existing
OUT is replaced only if it is an export directory (has manifest.json) or empty.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from harmony_mobile.export import coreml as coreml_steps
from harmony_mobile.export import steps
from harmony_mobile.export.keys import load_or_create_p256_signing_key, load_or_create_signing_key
from harmony_mobile.export.manifest import (
    MANIFEST_FILE,
    BackendEntry,
    Manifest,
    Normalization,
    TensorSpec,
    TierEntry,
    artifact_entry,
    build_manifest,
    verify_manifest,
    write_signed_manifest,
)
from harmony_mobile.export.steps import ExportError
from harmony_mobile.export.verify import tier_checks, verify_pte, write_report

from harmony_mobile.models import Tier
from harmony_mobile.run_dir import ClientArtifact, RunDir, RunDirError

ProgressCallback = Callable[..., None]  # (description: str, advance: int = 0): report a step's progress

BACKEND_DIR = "backend"
TIERS_DIR = "tiers"


@dataclass
class ExportResult:
    out: Path
    manifest: Manifest
    report: dict
    key_created: bool
    seconds: float


def artifact_path(tier: str, quantization: str) -> str:
    """Relative path of one artifact inside the export directory."""
    suffix = "mlpackage" if quantization.startswith("coreml-") else "pte"
    return f"{TIERS_DIR}/{tier}/front_{quantization}.{suffix}"


# --------------------------------------------------------------------------- checks before any work


def resolve_tiers(run: RunDir, names: list[str] | None) -> list[Tier]:
    known = run.info.tiers
    if not names:
        return list(known.tiers)
    tiers = []
    for name in dict.fromkeys(names):  # each tier once, in the order given
        try:
            tiers.append(known.get(name))
        except KeyError as error:
            raise ExportError(error.args[0]) from None
    return tiers


def check_output(out: Path) -> None:
    """Refuse to replace something that is not an export directory; refuse an unwritable parent."""
    if out.exists():
        if not out.is_dir():
            raise ExportError(f"output {out} exists and is not a directory")
        if any(out.iterdir()) and not (out / MANIFEST_FILE).is_file():
            raise ExportError(
                f"output {out} exists, is not empty and is not an export directory; refusing to replace it"
            )
    parent = out.parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ExportError(f"cannot write the export to {out}: {existing} is not a writable directory")


def check_tiers(run: RunDir, selected: list[Tier]) -> None:
    """Every selected tier has a loadable front-end and the run's input shape (checked before
    anything is written)."""
    for tier in selected:
        steps.select_front_end(run, tier.name)  # RunDirError: no client of this tier, or unloadable weights
        if tuple(tier.input_shape) != tuple(run.info.input_shape):
            raise ExportError(
                f"tier {tier.name} expects input {tuple(tier.input_shape)}, "
                f"the run's data is {tuple(run.info.input_shape)}"
            )


def open_run(run_dir: str | Path) -> RunDir:
    run = RunDir(run_dir)  # RunDirError: not a run dir / training not finished
    if not (run.path / "backend.pt").is_file():
        raise RunDirError(
            f"{run.path} holds no trained server back-end (no backend.pt); run `harmony train` first"
        )
    return run


# --------------------------------------------------------------------------- one tier


class _Progress:
    """A rich progress bar with one row per tier (or nothing). Domain code sees only the
    `ProgressCallback` that `callback` hands out."""

    def __init__(self, enabled: bool, console=None):
        self.enabled = enabled
        self.console = console
        self.bar = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("{task.fields[tier]:<16}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def callback(self, row: str, total: int) -> ProgressCallback:
        if self.bar is None:
            return lambda description, advance=0: None
        task = self.bar.add_task("waiting", total=total, tier=row)
        return lambda description, advance=0: self.bar.update(task, description=description, advance=advance)


def tier_steps(tier: Tier) -> int:
    xnn = [q for q in tier.quantization if q in ("fp32", "int8")]
    cml = [q for q in tier.quantization if q.startswith("coreml-")]
    return 1 + 2 * len(xnn) + (1 if cml else 0)


def verification_indices(client: ClientArtifact, limit: int | None = None) -> list[int]:
    """The client's held-out ID images the .pte files are verified on: its test split, then its
    validation split (at most `limit` in all).

    Neither is used for training or int8 calibration (validation only sets the exit threshold,
    which no check here depends on). Both are used for the sample size: on the 75 test images of
    a small client one top-1 flip is 1.3 points, so "exit accuracy within 1 point" would mean
    "not one net flip" and ">= 98 % agreement" at most one flip.
    """
    indices = list(client.test_idx) + list(client.val_idx)
    return indices[:limit] if limit else indices


@dataclass
class TierInputs:
    """What one tier's export and verification read: the wrapped front-end and its data."""

    client: ClientArtifact
    module: torch.nn.Module
    parameters: int
    logits_shape: list[int]
    features_shape: list[int]
    calibration: torch.Tensor
    held_out: list[int]
    test_images: torch.Tensor
    test_labels: torch.Tensor


def prepare_tier(
    run: RunDir,
    tier: Tier,
    images: torch.Tensor,
    labels: torch.Tensor,
    calibration_samples: int,
    test_samples: int | None,
) -> TierInputs:
    """Select the tier's personalized front-end, wrap it for export, pick calibration and
    verification images (the input shape was checked by `check_tiers` before anything was written)."""
    client, front_end = steps.select_front_end(run, tier.name)
    input_shape = tuple(tier.input_shape)
    module = steps.wrap_front_end(front_end, input_shape, run.info.num_classes)
    logits_shape, features_shape = steps.output_shapes(module, input_shape)
    held_out = verification_indices(client, test_samples)
    if not held_out:
        raise ExportError(
            f"client {client.client_id} of tier {tier.name} has no held-out ID samples to verify on"
        )
    return TierInputs(
        client=client,
        module=module,
        parameters=sum(p.numel() for p in module.parameters()),
        logits_shape=logits_shape,
        features_shape=features_shape,
        calibration=images[client.train_idx][:calibration_samples],
        held_out=held_out,
        test_images=images[held_out],
        test_labels=labels[held_out],
    )


def export_pte_variants(
    tier: Tier,
    inputs: TierInputs,
    directory: Path,
    *,
    max_batch: int,
    latency_runs: int,
    progress: ProgressCallback,
) -> tuple[list, list[dict]]:
    """One .pte per fp32/int8 quantization of the tier: export, quantize, lower, serialize, verify."""
    artifacts, rows = [], []
    for quantization in [q for q in tier.quantization if q in ("fp32", "int8")]:
        progress(f"{quantization}: export, quantize, lower")
        build = steps.build_pte(
            inputs.module, tuple(tier.input_shape), quantization, inputs.calibration, max_batch
        )
        relpath = artifact_path(tier.name, quantization)
        steps.serialize(build, directory / relpath)
        progress(f"{quantization}: verify with the ExecuTorch runtime", 1)
        row = verify_pte(
            directory / relpath,
            inputs.module,
            inputs.test_images,
            inputs.test_labels,
            quantization,
            simulation=build.reference if quantization == "int8" else None,
            max_batch=max_batch,
            latency_runs=latency_runs,
        )
        row.update(file=relpath, delegates=build.delegates, undelegated=[], float_layers=build.float_layers)
        rows.append(row)
        artifacts.append(
            artifact_entry(
                directory,
                relpath,
                backend="xnnpack",
                quantization=quantization,
                batch=(1, max_batch),
                parameters=inputs.parameters,
                extra={"delegates": build.delegates},
            )
        )
        progress("", 1)
    return artifacts, rows


def export_coreml_variants(
    tier: Tier, inputs: TierInputs, directory: Path, progress: ProgressCallback
) -> tuple[list, list[dict]]:
    """The tier's Core ML packages (fp16 / int8 weights / 4-bit palettized), spec-checked here;
    their numerical parity needs a Mac (export/check_coreml_on_mac.py)."""
    variants = [q for q in tier.quantization if q.startswith("coreml-")]
    if not variants:
        return [], []
    progress("Core ML: convert, compress, check spec")
    paths = {v: directory / artifact_path(tier.name, v) for v in variants}
    coreml_steps.export_coreml_variants(inputs.module, tuple(tier.input_shape), variants, paths)
    artifacts, rows = [], []
    for variant in variants:
        summary = coreml_steps.spec_summary(paths[variant])
        coreml_steps.check_spec(summary, tuple(tier.input_shape))
        relpath = artifact_path(tier.name, variant)
        rows.append({"quantization": variant, "file": relpath, **summary})
        artifacts.append(
            artifact_entry(
                directory,
                relpath,
                backend="coreml",
                quantization=variant,
                batch=(1, 1),
                parameters=inputs.parameters,
                extra={"minimum_deployment_target": coreml_steps.MINIMUM_TARGET, "parity": "run on a Mac"},
            )
        )
    progress("", 1)
    return artifacts, rows


def tier_entry(run: RunDir, tier: Tier, inputs: TierInputs, artifacts: list) -> TierEntry:
    """The tier's manifest entry."""
    info = run.info
    return TierEntry(
        name=tier.name,
        family=tier.family,
        split_depth=tier.split_depth,
        width=tier.width,
        client_id=inputs.client.client_id,
        parameters=inputs.parameters,
        input=TensorSpec(name=coreml_steps.INPUT_NAME, shape=[1, *tier.input_shape]),
        normalization=Normalization(mean=list(info.mean), std=list(info.std)),
        outputs=[
            TensorSpec(name="exit_logits", shape=inputs.logits_shape),
            TensorSpec(name="features", shape=inputs.features_shape),
        ],
        class_names=list(info.class_names),
        interface_shape=list(info.interface_spec.shape),
        threshold=float(inputs.client.threshold),
        threshold_source="calibrated" if tier.threshold is None else "tier",
        quantization=list(tier.quantization),
        backends=list(tier.backends),
        latency_budget_ms=tier.latency_budget_ms,
        artifacts=artifacts,
    )


def tier_report(tier: Tier, inputs: TierInputs, pte_rows: list[dict], coreml_rows: list[dict]) -> dict:
    """The tier's section of verification.json, with its pass/fail checks."""
    tested_test_split = min(len(inputs.held_out), len(inputs.client.test_idx))
    report = {
        "tier": tier.name,
        "family": tier.family,
        "split_depth": tier.split_depth,
        "client_id": inputs.client.client_id,
        "parameters": inputs.parameters,
        "calibration_samples": len(inputs.calibration),
        "test_samples": len(inputs.test_images),
        "verification_images": {
            "test": tested_test_split,
            "val": len(inputs.held_out) - tested_test_split,
        },
        "pte": pte_rows,
        "coreml": coreml_rows,
    }
    report["checks"] = tier_checks(report)
    return report


def export_tier(
    run: RunDir,
    tier: Tier,
    directory: Path,
    images: torch.Tensor,
    labels: torch.Tensor,
    *,
    max_batch: int,
    calibration_samples: int,
    test_samples: int | None,
    latency_runs: int,
    progress: ProgressCallback,
) -> tuple[TierEntry, dict]:
    """One tier, step by step: prepare, .pte variants, Core ML variants, manifest entry + report."""
    progress("select personalized front-end")
    inputs = prepare_tier(run, tier, images, labels, calibration_samples, test_samples)
    progress("", 1)
    pte_artifacts, pte_rows = export_pte_variants(
        tier, inputs, directory, max_batch=max_batch, latency_runs=latency_runs, progress=progress
    )
    coreml_artifacts, coreml_rows = export_coreml_variants(tier, inputs, directory, progress)
    entry = tier_entry(run, tier, inputs, pte_artifacts + coreml_artifacts)
    return entry, tier_report(tier, inputs, pte_rows, coreml_rows)


# --------------------------------------------------------------------------- the whole run


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    result = {}
    for package in ("torch", "executorch", "torchao", "coremltools"):
        try:
            result[package] = version(package)
        except PackageNotFoundError:
            result[package] = "not installed"
    return result


def export_run(
    run_dir: str | Path,
    out: str | Path,
    *,
    tiers: list[str] | None = None,
    max_batch: int = 1,
    key_dir: str | Path | None = None,
    private_key: Ed25519PrivateKey | None = None,
    p256_private_key: ec.EllipticCurvePrivateKey | None = None,
    threads: int = 1,
    calibration_samples: int = 256,
    test_samples: int | None = None,
    latency_runs: int = 50,
    progress: bool = True,
    console=None,
) -> ExportResult:
    """Export the run's personalized front-ends per tier, the back-end, the report and the signed manifest.

    `tiers`: tier names (default: every tier of the run). `max_batch` > 1 makes every .pte accept a
    dynamic batch 1..max_batch. The signing keys are `private_key` (Ed25519) and
    `p256_private_key` (ECDSA P-256, which Android verifies; without it the manifest carries the
    Ed25519 signature only) if given, else the pair in `key_dir` (default
    ~/.config/harmony-mobile/keys; generated on first use).
    Raises RunDirError / ExportError / SigningKeyError before writing anything when the inputs are bad.
    """
    started = time.perf_counter()
    if max_batch < 1:
        raise ExportError(f"--dynamic-batch must be >= 1, got {max_batch}")
    run = open_run(run_dir)
    selected = resolve_tiers(run, tiers)
    check_tiers(run, selected)
    out = Path(out).expanduser().absolute()
    check_output(out)
    key_created = False
    if private_key is None:
        private_key, key_created = load_or_create_signing_key(key_dir)
        p256_private_key, _ = load_or_create_p256_signing_key(key_dir)

    steps.set_threads(threads)
    with warnings.catch_warnings():
        # torch 2.13 pytree LeafSpec FutureWarnings fire on every export : noise only
        warnings.simplefilter("ignore", FutureWarning)
        return _export(
            run,
            selected,
            out,
            (private_key, p256_private_key),
            key_created=key_created,
            started=started,
            max_batch=max_batch,
            threads=threads,
            calibration_samples=calibration_samples,
            test_samples=test_samples,
            latency_runs=latency_runs,
            progress=progress,
            console=console,
        )


def _export(
    run: RunDir,
    selected: list[Tier],
    out: Path,
    signing_keys: tuple[Ed25519PrivateKey, ec.EllipticCurvePrivateKey | None],
    *,
    key_created: bool,
    started: float,
    max_batch: int,
    threads: int,
    calibration_samples: int,
    test_samples: int | None,
    latency_runs: int,
    progress: bool,
    console,
) -> ExportResult:
    """Write everything into a temporary directory beside `out`, then rename it into place."""
    created_parents = [p for p in reversed(out.parents) if not p.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    except OSError as error:
        _remove_empty(created_parents)
        raise ExportError(f"cannot write the export to {out}: {error}") from None
    try:
        with _Progress(progress, console) as bar:
            entries, tier_reports = _export_tiers(
                run,
                selected,
                work,
                bar,
                max_batch=max_batch,
                calibration_samples=calibration_samples,
                test_samples=test_samples,
                latency_runs=latency_runs,
            )
            backend = _export_backend(run, work, bar.callback("backend", 1))
        report = {
            "model_version": run.info.model_version,
            "run": str(run.path),
            "dataset": run.info.dataset,
            "threads": threads,
            "latency_runs": latency_runs,
            "max_batch": max_batch,
            "versions": _versions(),
            "tiers": tier_reports,
            "backend": backend,
            "all_checks_pass": all(ok is not False for t in tier_reports for ok in t["checks"].values()),
        }
        manifest = _sign_manifest(run, work, entries, backend, write_report(work, report), *signing_keys)
        _move_into_place(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        _remove_empty(created_parents)
        raise
    return ExportResult(out, manifest, report, key_created, time.perf_counter() - started)


def _export_tiers(
    run: RunDir, selected: list[Tier], work: Path, bar: _Progress, **options
) -> tuple[list[TierEntry], list[dict]]:
    dataset = run.dataset()
    labels = run.exit_labels(dataset.labels)  # the front-ends answer in exit (token) order
    callbacks = {t.name: bar.callback(t.name, tier_steps(t)) for t in selected}
    entries, reports = [], []
    for tier in selected:
        entry, report = export_tier(
            run, tier, work, dataset.images, labels, progress=callbacks[tier.name], **options
        )
        entries.append(entry)
        reports.append(report)
        callbacks[tier.name]("done")
    return entries, reports


def _export_backend(run: RunDir, work: Path, progress: ProgressCallback) -> dict:
    progress("torch.export of g")
    backend = steps.export_backend(run.path / "backend.pt", work / BACKEND_DIR)
    progress("done", 1)
    if backend["model_version"] != run.info.model_version:
        raise ExportError(
            f"backend.pt is model version {backend['model_version']}, the run is {run.info.model_version}"
        )
    backend["state_dict_file"] = f"{BACKEND_DIR}/backend.pt"
    backend["exported_program_file"] = f"{BACKEND_DIR}/backend.pt2"
    return backend


def _sign_manifest(
    run: RunDir,
    work: Path,
    entries: list[TierEntry],
    backend: dict,
    reports: list,
    private_key: Ed25519PrivateKey,
    p256_private_key: ec.EllipticCurvePrivateKey | None = None,
) -> Manifest:
    """Build manifest.json over every written file, sign it, and verify the signature once."""
    interface = list(run.info.interface_spec.shape)
    served = run.backend()
    manifest = build_manifest(
        work,
        model_version=run.info.model_version,
        run={
            "algorithm": run.info.algorithm,
            "dataset": run.info.dataset,
            "seed": run.info.seed,
            "run_dir": run.path.name,
            **upload_privacy_fields(run.info.privacy),
        },
        class_names=run.info.class_names,
        label_epoch=served.label_epoch,
        slot_table=served.slot_table.to_hex(),
        interface_shape=interface,
        backend=BackendEntry.describe(
            backend["model_version"],
            interface,
            backend["num_classes"],
            backend["state_dict_file"],
            backend["exported_program_file"],
        ),
        tiers=entries,
        public_key=private_key.public_key(),
        reports=reports,
        p256_public_key=p256_private_key.public_key() if p256_private_key is not None else None,
    )
    write_signed_manifest(work, manifest, private_key, p256_private_key)
    verify_manifest(work, private_key.public_key())
    return manifest


def upload_privacy_fields(privacy: dict) -> dict[str, float | None]:
    """The upload protections the run trained with, flat for the manifest's `run` object: a phone
    applies the same ones to its uploads (label_dp_epsilon, feature_clip, noise_multiplier), and the
    training accountant's (epsilon, delta) for the features is reported beside them."""
    features = privacy.get("features", {})
    return {
        "label_dp_epsilon": privacy.get("label_dp_epsilon"),
        "feature_clip": features.get("feature_clip"),
        "noise_multiplier": features.get("noise_multiplier"),
        "feature_epsilon": features.get("epsilon"),
        "feature_delta": features.get("delta"),
    }


def _remove_empty(directories: list[Path]) -> None:
    for directory in reversed(directories):
        with contextlib.suppress(OSError):
            directory.rmdir()


def _move_into_place(work: Path, out: Path) -> None:
    if not out.exists():
        os.rename(work, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.rename(out, old / out.name)
    try:
        os.rename(work, out)
    except OSError:
        os.rename(old / out.name, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
