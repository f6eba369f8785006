"""`run_demo`: every stage in order (train, export, serve, deploy, drift, outage, align, recover)
and the helpers only it uses; the server process is stopped on every exit path.

One function per stage, all over a `DemoRun` (what the stages share and measure). What a phone
does in a step reports progress through a `ProgressReport` callback; only this module draws bars."""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harmony_mobile.demo.config import DemoConfig, DemoError, ProgressReport
from harmony_mobile.demo.drift import calibrate_on_device, calibration_target, personalize_on_device
from harmony_mobile.demo.phones import PhoneData, classify_all, confirm, deliver, phone_data
from harmony_mobile.demo.report import show_phase, write_demo_report
from harmony_mobile.demo.server_process import ServerProcess, terminate_on_sigterm
from harmony_mobile.device import (
    DeviceCredentials,
    FederationKey,
    Phone,
    UploadQueue,
    decode_public_key,
    enrol,
    load_front_end,
    load_manifest,
    load_slot_prototypes,
)
from harmony_mobile.run_dir import RunDir


def wait_for_round(server: ServerProcess, round_id: int, timeout: float, progress: Progress, task) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        response = server.admin("GET", f"/v1/alignment/rounds/{round_id}")
        response.raise_for_status()
        record = response.json()
        progress.update(
            task, completed=round(100 * (record.get("progress") or 0)), description=record["status"]
        )
        if record["status"] not in ("queued", "running"):
            return record
        if time.monotonic() > deadline:
            raise DemoError(f"alignment round {round_id} did not finish in {timeout:.0f} s")
        time.sleep(0.5)


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.fields[stage]:<10}"),
        TextColumn("{task.fields[tier]:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
    )


def progress_report(progress: Progress, stage: str, tier: str, total: int) -> ProgressReport:
    """A new bar of `progress` for one tier's step, as the callback the step reports through."""
    task = progress.add_task("", total=total, stage=stage, tier=tier)

    def report(done: int, description: str | None) -> None:
        progress.update(task, completed=done, description=description)

    return report


def classify_phase(
    demo: DemoRun, stage: str, after: Callable[[str, Phone, ProgressReport], None] | None = None
) -> None:
    """Every phone classifies its test data (a progress bar per tier) into results[tier][stage];
    `after` runs per phone once it is done (the deployed phase confirms labels and uploads)."""
    with progress_bar(demo.console) as progress:
        reports = {
            tier: progress_report(progress, stage, tier, len(d.labels)) for tier, d in demo.data.items()
        }
        for tier, phone in demo.phones.items():
            demo.results[tier][stage] = classify_all(phone, demo.data[tier], reports[tier])
            if after is not None:
                after(tier, phone, reports[tier])


def prepare_output(out: Path, reuse_run: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    keep = {"run", "export", "keys"} if reuse_run else set()
    for name in ("run", "export", "server", "phones", "plots"):
        if name not in keep and (out / name).exists():
            shutil.rmtree(out / name)
    for name in ("demo-report.md", "demo-report.json", "server.log"):
        (out / name).unlink(missing_ok=True)


def train_stage(config: DemoConfig, console: Console) -> dict:
    from harmony_mobile.training import train

    run_path = config.out / "run"
    if config.reuse_run and (run_path / "final_metrics.json").is_file():
        stored = json.loads((run_path / "run.json").read_text()).get("train_config")
        if stored == config.train_config().model_dump():
            console.print(f"reusing the finished run in {run_path}")
            return RunDir(run_path).final_metrics()
        shutil.rmtree(run_path)
    return train(config.train_config(), run_path, show_progress=True)


def reuse_export(out: Path):
    """The export of a reused run, if it is complete and of the same model version (else None)."""
    from harmony_mobile.export.manifest import ManifestError, verify_manifest
    from harmony_mobile.export.pipeline import ExportResult

    try:
        manifest = verify_manifest(out / "export")
    except (ManifestError, OSError):
        return None
    if manifest.model_version != RunDir(out / "run").info.model_version:
        return None
    report = json.loads((out / "export" / "verification.json").read_text())
    return ExportResult(out / "export", manifest, report, False, 0.0)


def export_stage(config: DemoConfig, console: Console) -> tuple[Any, bytes]:
    """(ExportResult, pinned public key): every tier exported and signed with the demo's keys
    (created once under OUT/keys), or a reused run's complete export. The apps ship the pinned key."""
    from harmony_mobile.export.keys import (
        encode_public_key,
        load_or_create_p256_signing_key,
        load_or_create_signing_key,
    )
    from harmony_mobile.export.pipeline import export_run

    out = config.out
    signing_key, _ = load_or_create_signing_key(out / "keys")
    p256_signing_key, _ = load_or_create_p256_signing_key(out / "keys")
    pinned = encode_public_key(signing_key.public_key())
    export = reuse_export(out) if config.reuse_run else None
    if export is None:
        export = export_run(
            out / "run",
            out / "export",
            private_key=signing_key,
            p256_private_key=p256_signing_key,
            latency_runs=config.latency_runs,
            console=console,
            # the demo shows what phones do with a variant that missed its gate: its verdict is in
            # the manifest and they run a passing one
            allow_failed_variants=True,
        )
    return export, pinned


def export_summary(export) -> dict:
    """Model version, seconds and the size of every artifact per tier and quantization."""
    return {
        "model_version": export.manifest.model_version,
        "seconds": export.seconds,
        "tiers": {
            t["tier"]: {row["quantization"]: row["size"] for row in t["pte"] + t["coreml"]}
            for t in export.report["tiers"]
        },
    }


class StageClock:
    """Wall time per stage: `lap(stage)` records the time since the previous lap (or `restart`)."""

    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.timings: dict[str, float] = {}

    def restart(self) -> None:
        self.last = time.perf_counter()

    def lap(self, stage: str) -> None:
        self.timings[stage] = time.perf_counter() - self.last
        self.last = time.perf_counter()

    def stop(self) -> dict[str, float]:
        self.timings["total"] = time.perf_counter() - self.started
        return self.timings


@dataclass
class DemoRun:
    """What the stages after the export share: the trained run, the verified manifest, each tier's
    phone data, the server process, the phones and everything they measured."""

    config: DemoConfig
    console: Console
    run: RunDir
    dataset: Any
    manifest: dict
    data: dict[str, PhoneData]
    server: ServerProcess
    phones: dict[str, Phone] = field(default_factory=dict)
    results: dict[str, dict[str, dict]] = field(init=False)  # tier -> phase -> classify_all's metrics
    uploads: dict[str, dict[str, dict]] = field(init=False)  # tier -> phase -> deliver's counts
    drift: dict[str, dict] = field(default_factory=dict)
    outage: dict[str, dict] = field(default_factory=dict)
    alignment: dict = field(default_factory=dict)
    registry: Any = None
    exit_status: int | None = None

    def __post_init__(self) -> None:
        self.results = {tier: {} for tier in self.data}
        self.uploads = {tier: {} for tier in self.data}

    @property
    def info(self):
        return self.run.info


def open_run(config: DemoConfig, console: Console, pinned: bytes) -> DemoRun:
    """The trained run, the export's manifest verified against the pinned key, the phones' data,
    and a fallback server process that is not started yet."""
    out = config.out
    run = RunDir(out / "run")
    dataset = run.dataset()
    manifest = load_manifest(out / "export", decode_public_key(pinned))
    data = phone_data(run, dataset, manifest, config)
    server = ServerProcess(out / "server", out / "export", out / "server.log", secrets.token_urlsafe(32))
    return DemoRun(config, console, run, dataset, manifest, data, server)


def enrol_phones(demo: DemoRun) -> None:
    """One phone per tier of the manifest: enrolled with the server, running the tier's .pte."""
    out = demo.config.out
    # provisioned to phones only, out of band: the lineage's secret, without which the slots the
    # server answers with name no class
    federation = FederationKey(demo.run.federation_secret())
    for entry in demo.manifest["tiers"]:
        tier = entry["name"]
        credentials = DeviceCredentials.from_enrolment(
            enrol(demo.server.url, demo.server.admin_token, tier, name=f"demo-{tier}")
        )
        demo.phones[tier] = Phone(
            manifest=demo.manifest,
            tier=tier,
            program=load_front_end(out / "export", demo.manifest, tier, demo.config.quantization),
            server_url=demo.server.url,
            credentials=credentials,
            federation_key=federation,
            queue=UploadQueue(out / "phones" / tier / "queue"),
            # a slot_margin tier gates by the shipped prototypes and the classes the phone holds
            slot_prototypes=load_slot_prototypes(out / "export", demo.manifest),
            own_classes=[demo.info.class_names[c] for c in demo.data[tier].client.classes],
        )


def deployed_stage(demo: DemoRun, clock: StageClock) -> None:
    demo.console.rule("[bold]4. phones classify their own data (ID + OOD), users confirm labels")

    def confirm_and_upload(tier: str, phone: Phone, report: ProgressReport) -> None:
        rows = confirm(phone, demo.data[tier], demo.dataset, demo.info, "deployed")
        demo.uploads[tier]["deployed"] = deliver(phone, rows)
        uploaded = demo.uploads[tier]["deployed"]
        report(len(demo.data[tier].labels), f"+{uploaded['uploads']} uploads ({uploaded['rows']} rows)")

    classify_phase(demo, "deployed", after=confirm_and_upload)
    clock.lap("deployed")
    show_phase(demo.console, demo.results, "deployed")


def drift_phone(demo: DemoRun, tier: str, phone: Phone, target: float, report: ProgressReport) -> dict:
    """The phone trains its exit classifier through the export's training .pte, recalibrates tau
    (unless the tier fixed it) and switches to them; what changed, and the speed vs eager PyTorch."""
    config, data = demo.config, demo.data[tier]
    report(0, "tau of the deployed .pte")
    before = {
        "threshold_source": phone.entry["threshold_source"],
        "calibration_target": target,
        "threshold_deployed": phone.threshold,
        # context: tau the deployed .pte itself would get on the same val samples
        # (the manifest's was calibrated on the fp32 training model)
        "threshold_deployed_pte": calibrate_on_device(
            phone, phone.program, data, target, demo.run.exit_labels
        ),
    }
    report(1, f"train {config.drift_steps} steps through the training .pte")
    drift = {
        **before,
        **personalize_on_device(config.out / "export", demo.run, phone, data, demo.dataset, config, target),
    }
    report(
        3,
        f"{drift['steps_per_second_pte']:.0f} steps/s ({drift['pte_vs_eager_speed']:.2f}x eager), "
        f"tau {drift['threshold_deployed']:.3f} -> {drift['threshold_drifted']:.3f}",
    )
    return drift


def drift_stage(demo: DemoRun, clock: StageClock) -> None:
    demo.console.rule(
        "[bold]5. drift: phones personalize on device (ExecuTorch training .pte), recalibrate tau"
    )
    target = calibration_target(demo.info)
    with progress_bar(demo.console) as progress:
        reports = {tier: progress_report(progress, "drift", tier, 3) for tier in demo.data}
        for tier, phone in demo.phones.items():
            demo.drift[tier] = drift_phone(demo, tier, phone, target, reports[tier])
    clock.lap("drift")
    classify_phase(demo, "drifted")
    clock.lap("drifted")
    show_phase(demo.console, demo.results, "drifted")


def outage_sample(data: PhoneData, phone: Phone, count: int) -> np.ndarray:
    """`count` test images spread over the test set, half of them (as far as there are) images the
    phone is unsure of, so that the outage shows both paths: answers the exit gives anyway, and
    fallbacks that fail and are answered locally. A spread alone can miss the second path when the
    phone's threshold lets almost everything exit."""
    unsure = np.array([not phone.would_exit(pixels) for pixels in data.pixels])

    def spread(indices: np.ndarray, n: int) -> np.ndarray:
        return indices[:: max(1, len(indices) // n)][:n] if n > 0 else indices[:0]

    uncertain = spread(np.flatnonzero(unsure), count // 2)
    confident = spread(np.flatnonzero(~unsure), count - len(uncertain))
    return data.pixels[np.sort(np.concatenate([uncertain, confident]))]


def answer_offline(
    demo: DemoRun, tier: str, phone: Phone, images: np.ndarray, report: ProgressReport
) -> dict:
    """With the server down, the phone answers `images` and tries to deliver newly confirmed rows:
    how it answered and what stayed queued."""
    sources = []
    for done, pixels in enumerate(images, start=1):
        sources.append(phone.classify(pixels).source)
        report(done, None)
    rows = confirm(phone, demo.data[tier], demo.dataset, demo.info, "drifted")
    attempt = phone.flush()
    report(
        len(images),
        f"{sources.count('local_after_server_failure')} local answers after a failed "
        f"fallback, {attempt.remaining} uploads queued",
    )
    return {
        "answered": len(sources),
        "local_exit": sources.count("local"),
        "local_after_server_failure": sources.count("local_after_server_failure"),
        "queued_uploads": attempt.remaining,
        "queued_rows": rows,
        "flush_error": attempt.error,
    }


def deliver_queued(demo: DemoRun, tier: str, phone: Phone, report: ProgressReport) -> None:
    """After the restart: the phone delivers what it queued during the outage."""
    delivered = demo.uploads[tier]["drifted"] = deliver(phone, demo.outage[tier]["queued_rows"])
    demo.outage[tier]["delivered_after_restart"] = delivered["uploads"]
    report(1, f"{delivered['uploads']} queued uploads delivered ({delivered['rows']} rows)")


def outage_stage(demo: DemoRun, clock: StageClock) -> None:
    demo.console.rule("[bold]6. server outage: phones answer locally and queue their sealed uploads")
    demo.server.stop()
    with progress_bar(demo.console) as progress:
        for tier, phone in demo.phones.items():
            images = outage_sample(demo.data[tier], phone, demo.config.outage_images)
            report = progress_report(progress, "outage", tier, len(images))
            demo.outage[tier] = answer_offline(demo, tier, phone, images, report)
    demo.server.start()
    for phone in demo.phones.values():  # drop pooled connections to the old process
        phone.close()
        phone.connect()
    demo.console.print(f"server restarted on {demo.server.url}")
    with progress_bar(demo.console) as progress:
        for tier, phone in demo.phones.items():
            deliver_queued(demo, tier, phone, progress_report(progress, "flush", tier, 1))
    clock.lap("outage")


def alignment_stage(demo: DemoRun, clock: StageClock) -> None:
    """The operator starts an alignment round over the admin API and waits for its outcome."""
    config, server = demo.config, demo.server
    demo.console.rule("[bold]7. alignment round over the sealed uploads (admin API)")
    with progress_bar(demo.console) as progress:
        response = server.admin("POST", "/v1/alignment/rounds", json=config.alignment)
        if response.status_code != 202:
            raise DemoError(f"starting the alignment round failed: {response.status_code} {response.text}")
        round_id = response.json()["id"]
        task = progress.add_task("queued", total=100, stage="align", tier=f"round {round_id}")
        demo.alignment = wait_for_round(server, round_id, config.alignment_timeout, progress, task)
    clock.lap("alignment")
    alignment = demo.alignment
    demo.console.print(
        f"alignment round {round_id}: [bold]{alignment['status']}[/bold]"
        + (f", new back-end version {alignment['new_version']}" if alignment.get("new_version") else "")
        + (f" ({alignment['error']})" if alignment.get("error") else "")
    )


def serve_phones(demo: DemoRun, clock: StageClock) -> None:
    """Stages 3 to 8: start the server, deploy, drift, outage, alignment, recovery."""
    demo.console.rule("[bold]3. start the fallback server")
    demo.server.start()
    demo.console.print(f"harmony serve on {demo.server.url} (log: {demo.server.log_file})")
    clock.lap("server start")
    enrol_phones(demo)
    deployed_stage(demo, clock)
    drift_stage(demo, clock)
    outage_stage(demo, clock)
    alignment_stage(demo, clock)
    demo.console.rule("[bold]8. phones classify again against the aligned back-end")
    classify_phase(demo, "aligned")
    clock.lap("aligned")
    demo.registry = demo.server.admin("GET", "/v1/registry/versions").json()


def stop_phones_and_server(demo: DemoRun) -> None:
    for phone in demo.phones.values():
        phone.close()
    demo.exit_status = demo.server.stop()
    if demo.server.port:
        demo.console.print(f"server stopped (exit status {demo.exit_status})")


def demo_report(config: DemoConfig, train_results: dict, export, demo: DemoRun, timings: dict) -> dict:
    """Everything the demo measured: demo-report.json, and what the markdown report renders."""
    server = demo.server
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
        "train": {k: train_results.get(k) for k in ("summary", "train_seconds", "thresholds")},
        "export": export_summary(export),
        "results": demo.results,
        "uploads": demo.uploads,
        "drift": demo.drift,
        "outage": demo.outage,
        "alignment": demo.alignment,
        "registry": demo.registry,
        "timings": timings,
        "server": {"url": server.url, "exit_status": demo.exit_status, "log": str(server.log_file)},
    }


def run_demo(config: DemoConfig, console: Console | None = None) -> dict:
    """Run every stage; returns the report dict (also written as demo-report.md/.json under config.out)."""
    console = console or Console()
    torch.set_num_threads(1)
    out = config.out = Path(config.out).absolute()
    clock = StageClock()
    prepare_output(out, config.reuse_run)
    console.rule("[bold]1. train")
    clock.restart()
    train_results = train_stage(config, console)
    clock.lap("train")
    console.rule("[bold]2. export every tier")
    export, pinned = export_stage(config, console)
    clock.lap("export")
    demo = open_run(config, console, pinned)
    with terminate_on_sigterm():
        try:
            serve_phones(demo, clock)
        finally:
            stop_phones_and_server(demo)
    report = demo_report(config, train_results, export, demo, clock.stop())
    write_demo_report(out, report, console)
    return report
