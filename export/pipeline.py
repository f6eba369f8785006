"""`export_run`: a finished training run -> a signed export directory, tier by tier.

Output directory layout:

    OUT/
      manifest.json  manifest.sig  signing_key.pub      (manifest.py)
      verification.json  verification.md              (verify.py)
      backend/backend.pt                              g + h state dicts, run_dir.save_backend format
      backend/backend.pt2                             torch.export of g, dynamic batch
      backend/backend.onnx                            g for ONNX Runtime (replicas without torch)
      tiers/<tier>/front_fp32.pte                     XNNPACK, fully delegated
      tiers/<tier>/front_int8.pte                     PT2E static int8 per-channel, XNNPACK
      tiers/<tier>/front_coreml-fp16.mlpackage/       ML Program, iOS 16+ (coreml tiers)
      tiers/<tier>/front_coreml-int8.mlpackage/       int8 weights
      tiers/<tier>/front_coreml-palette4.mlpackage/   4-bit k-means palettized weights
      tiers/<tier>/personalize_{frozen,train,head}.pte  on-device training (personalization.py)
      slot_prototypes.hmft                            slot_margin runs: what the phones gate by

Everything is written into a temporary directory beside OUT and renamed into place only after
the manifest was signed and verified, so a failure never leaves a half-written OUT. An existing
OUT is replaced only if it is an export directory (has manifest.json) or empty.
"""

from __future__ import annotations

import contextlib
import math
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
from harmony_mobile.export import personalization, steps, verify
from harmony_mobile.export.keys import load_or_create_p256_signing_key, load_or_create_signing_key
from harmony_mobile.export.manifest import (
    MANIFEST_FILE,
    BackendEntry,
    Manifest,
    Normalization,
    SlotPrototypes,
    TensorSpec,
    TierEntry,
    artifact_entry,
    build_manifest,
    path_digest,
    read_manifest,
    verify_manifest,
    write_signed_manifest,
)
from harmony_mobile.export.steps import ExportError, ExportInputError
from harmony_mobile.export.verify import tier_checks, verify_pte, write_verification_report

from harmony_mobile.models import Tier
from harmony_mobile.run_dir import ClientArtifact, RunDir, RunDirError

ProgressCallback = Callable[..., None]  # (description: str, advance: int = 0): report a step's progress

BACKEND_DIR = "backend"
TIERS_DIR = "tiers"
SLOT_PROTOTYPES_FILE = "slot_prototypes.hmft"  # phones fetch it: outside backend/, which they never get


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
            raise ExportInputError(error.args[0]) from None
    return tiers


def check_output(out: Path) -> None:
    """Refuse to replace something that is not an export directory; refuse an unwritable parent."""
    if out.exists():
        if not out.is_dir():
            raise ExportInputError(f"output {out} exists and is not a directory")
        if any(out.iterdir()) and not (out / MANIFEST_FILE).is_file():
            raise ExportInputError(
                f"output {out} exists, is not empty and is not an export directory; refusing to replace it"
            )
    parent = out.parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ExportInputError(f"cannot write the export to {out}: {existing} is not a writable directory")


def check_tiers_exportable(run: RunDir, selected: list[Tier]) -> None:
    """Every selected tier has a loadable front-end and the run's input shape (checked before
    anything is written)."""
    for tier in selected:
        steps.select_front_end(run, tier.name)  # RunDirError: no client of this tier, or unloadable weights
        if tuple(tier.input_shape) != tuple(run.info.input_shape):
            raise ExportInputError(
                f"tier {tier.name} expects input {tuple(tier.input_shape)}, "
                f"the run's data is {tuple(run.info.input_shape)}"
            )


def open_run(run_dir: str | Path) -> RunDir:
    run = RunDir(run_dir)  # RunDirError: not a run dir / training not finished
    if not (run.path / "backend.pt").is_file():
        raise RunDirError(
            f"{run.path} holds no trained server back-end (no backend.pt); run `harmony train` first"
        )
    check_exit_rule(run)
    return run


SHIPPED_EXIT_RULES = ("max_softmax", "slot_margin")  # the scores the manifest and phone runtimes know


def run_exit_rule(run: RunDir) -> str:
    """The score the run's phones exit by (its method's, or the run's `exit_rule`)."""
    from harmony_mobile.algorithms.registry import run_exit_gate

    return run_exit_gate(run.info)[0]


def check_exit_rule(run: RunDir) -> None:
    """The manifest's threshold is on a score every phone runtime computes."""
    rule = run_exit_rule(run)
    if rule not in SHIPPED_EXIT_RULES:
        raise ExportInputError(
            f"{run.path}'s phones exit by {rule}, but the phone runtimes answer locally by "
            f"{' or '.join(SHIPPED_EXIT_RULES)} only: export a run trained with one of those"
        )


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
    return 2 + 2 * len(xnn) + (1 if cml else 0)  # + 1: the personalization programs


def verification_indices(
    run: RunDir, client: ClientArtifact, dataset_size: int, limit: int | None = None
) -> tuple[list[int], dict[str, int]]:
    """The images a tier's .pte files are verified and gated on, and how many come from where.

    The client's held-out ID images first (its test split, then its validation split), then images
    the client never trained on: other clients' held-out images, then the rest of the data set.
    None is in the client's training split (its int8 calibration images are among those). Up to
    `limit` (default verify.GATE_SAMPLES) images: top-1 agreement needs no label, and on the ~100
    held-out images of a small client one flip moved agreement by a point; from
    verify.samples_to_resolve() = 753 images on, the 95 % interval around 98 % is +-1 point.
    """
    limit = verify.GATE_SAMPLES if limit is None else limit
    trained = set(client.train_idx)
    others = [i for c in run.clients() if c.client_id != client.client_id for i in (*c.test_idx, *c.val_idx)]
    ordered = [*client.test_idx, *client.val_idx, *others, *range(dataset_size)]
    chosen = [i for i in dict.fromkeys(ordered) if i not in trained][:limit]
    test, val = set(client.test_idx), set(client.val_idx)
    split = {
        "test": sum(i in test for i in chosen),
        "val": sum(i in val and i not in test for i in chosen),
    }
    split["other"] = len(chosen) - split["test"] - split["val"]
    return chosen, split


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
    split: dict[str, int]
    test_images: torch.Tensor
    test_labels: torch.Tensor  # exit-order labels; -1 for images outside the client's classes


def prepare_tier(
    run: RunDir,
    tier: Tier,
    images: torch.Tensor,
    labels: tuple[torch.Tensor, torch.Tensor],
    calibration_samples: int,
    test_samples: int | None,
) -> TierInputs:
    """Select the tier's personalized front-end, wrap it for export, pick calibration and
    verification images (the input shape was checked by `check_tiers_exportable` before anything was written).
    `labels`: (class labels, exit-order labels) of every image."""
    client, front_end = steps.select_front_end(run, tier.name)
    input_shape = tuple(tier.input_shape)
    module = steps.wrap_front_end(front_end, input_shape, run.info.num_classes)
    logits_shape, features_shape = steps.output_shapes(module, input_shape)
    held_out, split = verification_indices(run, client, len(images), test_samples)
    class_labels, exit_labels = labels
    own_class = torch.isin(class_labels[held_out], torch.tensor(client.classes, dtype=class_labels.dtype))
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
        split=split,
        test_images=images[held_out],
        test_labels=torch.where(own_class, exit_labels[held_out], -1),
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


def export_personalization(run: RunDir, tier: Tier, inputs: TierInputs, directory: Path, max_batch: int):
    """The tier's on-device training programs (export/personalization.py), checked against eager
    PyTorch: (manifest entry, report row)."""
    front_end = inputs.module.front_end
    build = personalization.build_personalization(
        front_end, tuple(tier.input_shape), run.info.num_classes, max_batch, inputs.calibration
    )
    target = personalization.calibration_target(run.info)
    entry = personalization.write_personalization(build, directory, f"{TIERS_DIR}/{tier.name}", target)
    row = {
        "scope": entry.scope,
        "files": [p.path for p in entry.programs()],
        "trained_parameters": sum(math.prod(s) for s in entry.parameter_shapes),
        "loss_vs_eager_max_abs": build.loss_difference,
        "head_logits_vs_eager_max_abs": build.logit_difference,
        "frozen_outputs_vs_eager_max_abs": build.frozen_difference,
    }
    return entry, row


def build_tier_entry(run: RunDir, tier: Tier, inputs: TierInputs, artifacts: list) -> TierEntry:
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
        exit_rule=run_exit_rule(run),
        quantization=list(tier.quantization),
        backends=list(tier.backends),
        latency_budget_ms=tier.latency_budget_ms,
        artifacts=artifacts,
    )


def tier_report(tier: Tier, inputs: TierInputs, pte_rows: list[dict], coreml_rows: list[dict]) -> dict:
    """The tier's section of verification.json, with its pass/fail checks."""
    report = {
        "tier": tier.name,
        "family": tier.family,
        "split_depth": tier.split_depth,
        "client_id": inputs.client.client_id,
        "parameters": inputs.parameters,
        "calibration_samples": len(inputs.calibration),
        "test_samples": len(inputs.test_images),
        "verification_images": dict(inputs.split),
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
    labels: tuple[torch.Tensor, torch.Tensor],
    *,
    max_batch: int,
    calibration_samples: int,
    test_samples: int | None,
    latency_runs: int,
    progress: ProgressCallback,
    allow_failed_variants: bool,
) -> tuple[TierEntry, dict]:
    """One tier, step by step: prepare, .pte variants, Core ML variants, manifest entry + report,
    training programs. A failed variant stops here unless allowed (QualityGateError)."""
    progress("select personalized front-end")
    inputs = prepare_tier(run, tier, images, labels, calibration_samples, test_samples)
    progress("", 1)
    pte_artifacts, pte_rows = export_pte_variants(
        tier, inputs, directory, max_batch=max_batch, latency_runs=latency_runs, progress=progress
    )
    coreml_artifacts, coreml_rows = export_coreml_variants(tier, inputs, directory, progress)
    entry = build_tier_entry(run, tier, inputs, pte_artifacts + coreml_artifacts)
    report = tier_report(tier, inputs, pte_rows, coreml_rows)
    if not allow_failed_variants:
        _stop_on_failed_variant(report)
    progress("personalization: training programs")
    entry.personalization, report["personalization"] = export_personalization(
        run, tier, inputs, directory, max_batch
    )
    progress("", 1)
    verdicts = verify.variant_verdicts(report)
    for artifact in entry.artifacts:
        artifact.verdict, artifact.failed_checks = verdicts.get(artifact.quantization, ("not_checked", []))
    return entry, report


class QualityGateError(ExportError):
    """A variant the export would ship failed its quality checks (and failed variants were not allowed)."""


def _stop_on_failed_variant(tier_report_: dict) -> None:
    """Raised before the tier's training programs, the tiers after it and the back-end are built:
    an export that will not be written should not spend minutes on them."""
    failures = failed_variants([tier_report_])
    if failures:
        raise QualityGateError(
            f"a variant of tier {tier_report_['tier']} failed its quality checks, so the export stopped "
            "and nothing was written (pass --allow-failed-variants to ship it marked failed in the "
            "manifest):\n  " + "\n  ".join(failures)
        )


def failed_variants(tier_reports: list[dict]) -> list[str]:
    """'tier variant: check (measured)' for every failed check of a shipped variant."""
    failures = []
    for report in tier_reports:
        for quantization, (verdict, failed) in verify.variant_verdicts(report).items():
            if verdict == "fail":
                measured = "; ".join(f"{name} ({verify.measured(report, name)})" for name in failed)
                failures.append(f"{report['tier']} {quantization}: {measured}")
    return failures


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
    allow_failed_variants: bool = False,
) -> ExportResult:
    """Export the run's personalized front-ends per tier, the back-end, the report and the signed manifest.

    A variant failing its quality checks raises QualityGateError (nothing written; the export stops
    at that tier) unless `allow_failed_variants`: then it ships with verdict "fail" in the manifest. `tiers`: tier names (default: every tier of the run). `max_batch` > 1 makes every .pte accept a
    dynamic batch 1..max_batch. The signing keys are `private_key` (Ed25519) and
    `p256_private_key` (ECDSA P-256, which Android verifies; without it the manifest carries the
    Ed25519 signature only) if given, else the pair in `key_dir` (default
    ~/.config/harmony-mobile/keys; generated on first use).
    Raises RunDirError / ExportInputError / SigningKeyError before writing anything when the inputs are bad.
    """
    started = time.perf_counter()
    if max_batch < 1:
        raise ExportInputError(f"--dynamic-batch must be >= 1, got {max_batch}")
    run = open_run(run_dir)
    selected = resolve_tiers(run, tiers)
    check_tiers_exportable(run, selected)
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
            allow_failed_variants=allow_failed_variants,
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
    allow_failed_variants: bool,
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
                allow_failed_variants=allow_failed_variants,
            )
            backend = _export_backend(run, work, bar.callback("backend", 1))
        prototypes = export_slot_prototypes(run, work) if run_exit_rule(run) == "slot_margin" else None
        report = _report(run, tier_reports, backend, threads, latency_runs, max_batch)
        reports = write_verification_report(work, report)
        manifest = _sign_manifest(
            run, work, entries, backend, reports, *signing_keys, previous=out, slot_prototypes=prototypes
        )
        _move_into_place(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        _remove_empty(created_parents)
        raise
    return ExportResult(out, manifest, report, key_created, time.perf_counter() - started)


def _report(run: RunDir, tier_reports: list[dict], backend: dict, threads, latency_runs, max_batch) -> dict:
    """verification.json's content."""
    return {
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


def _export_tiers(
    run: RunDir, selected: list[Tier], work: Path, bar: _Progress, **options
) -> tuple[list[TierEntry], list[dict]]:
    dataset = run.dataset()
    # the front-ends answer in exit (token) order; class labels say which images are a client's own
    labels = (torch.as_tensor(dataset.labels), run.exit_labels(dataset.labels))
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
    progress("torch.export and ONNX of g")
    backend = steps.export_backend(run.path / "backend.pt", work / BACKEND_DIR)
    progress("done", 1)
    if backend["model_version"] != run.info.model_version:
        raise ExportError(
            f"backend.pt is model version {backend['model_version']}, the run is {run.info.model_version}"
        )
    backend["state_dict_file"] = f"{BACKEND_DIR}/backend.pt"
    backend["exported_program_file"] = f"{BACKEND_DIR}/backend.pt2"
    return backend


def export_slot_prototypes(run: RunDir, work: Path) -> SlotPrototypes:
    """What slot_margin tiers gate by: the server's slot prototypes, made as training made them
    (federation/slot_gate.py: the back-end puts each replay row in its top slot), one float32 HMFT
    tensor (slots, flattened interface) in slot order."""
    from harmony_mobile.federation.slot_gate import slot_prototypes
    from harmony_mobile.protocol.wire import encode_tensor

    served = run.backend()
    if served.replay is None or not len(served.replay):
        raise ExportError(f"{run.path}'s backend.pt holds no replay set to make slot prototypes from")
    prototypes = slot_prototypes(served.backend.eval(), len(served.slot_table.tokens), served.replay)
    path = work / SLOT_PROTOTYPES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_tensor(prototypes.numpy().astype("float32")))
    sha, size = path_digest(path)
    return SlotPrototypes(path=SLOT_PROTOTYPES_FILE, sha256=sha, size=size, shape=tuple(prototypes.shape))


def _sign_manifest(
    run: RunDir,
    work: Path,
    entries: list[TierEntry],
    backend: dict,
    reports: list,
    private_key: Ed25519PrivateKey,
    p256_private_key: ec.EllipticCurvePrivateKey | None = None,
    previous: Path | None = None,
    slot_prototypes: SlotPrototypes | None = None,
) -> Manifest:
    """Build manifest.json over every written file, sign it, and verify the signature once. Its
    manifest_version is the time in UTC seconds, and above that of the export at `previous`."""
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
        slot_prototypes=slot_prototypes,
        public_key=private_key.public_key(),
        reports=reports,
        p256_public_key=p256_private_key.public_key() if p256_private_key is not None else None,
        manifest_version=next_manifest_version(previous),
    )
    write_signed_manifest(work, manifest, private_key, p256_private_key)
    verify_manifest(work, private_key.public_key())
    return manifest


def next_manifest_version(previous: Path | None) -> int:
    """Now in UTC seconds, or one more than the version of the export at `previous` if that is later
    (a clock set back must not make an update look older than what phones run)."""
    now = int(time.time())
    try:
        return max(now, read_manifest(previous).manifest_version + 1) if previous is not None else now
    except (OSError, ValueError):  # no export there yet, or not a readable one
        return now


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
