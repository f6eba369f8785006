"""`run_demo`: every stage in order (train, export, serve, deploy, drift, outage, align, recover)
and the helpers only it uses; the server process is stopped on every exit path."""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harmony_mobile.demo.config import DemoConfig, DemoError
from harmony_mobile.demo.drift import (
    calibrate_on_device,
    calibration_target,
    drift_front_end,
    export_drifted,
    feature_shift,
)
from harmony_mobile.demo.phones import PhoneData, classify_all, confirm, deliver, phone_data
from harmony_mobile.demo.report import show_phase, write_report
from harmony_mobile.demo.server_process import ServerProcess, terminate_on_sigterm
from harmony_mobile.device import (
    DeviceCredentials,
    FederationKey,
    FrontEndProgram,
    Phone,
    UploadQueue,
    decode_public_key,
    enrol,
    load_front_end,
    load_manifest,
    normalize,
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


def classify_phase(
    console: Console,
    phones: dict[str, Phone],
    data: dict[str, PhoneData],
    results: dict[str, dict],
    stage: str,
    after: Callable[[str, Phone, Progress, Any], None] | None = None,
) -> None:
    """Every phone classifies its test data (a progress bar per tier) into results[tier][stage];
    `after` runs per phone once it is done (the deployed phase confirms labels and uploads)."""
    with progress_bar(console) as progress:
        tasks = {
            tier: progress.add_task("", total=len(d.labels), stage=stage, tier=tier)
            for tier, d in data.items()
        }
        for tier, phone in phones.items():
            results[tier][stage] = classify_all(phone, data[tier], progress, tasks[tier])
            if after is not None:
                after(tier, phone, progress, tasks[tier])


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


def run_demo(config: DemoConfig, console: Console | None = None) -> dict:
    """Run every stage; returns the report dict (also written as demo-report.md/.json under config.out)."""
    console = console or Console()
    torch.set_num_threads(1)
    out = config.out = Path(config.out).absolute()
    started = time.perf_counter()
    timings: dict[str, float] = {}

    def mark(stage: str, since: float) -> float:
        timings[stage] = time.perf_counter() - since
        return time.perf_counter()

    prepare_output(out, config.reuse_run)
    console.rule("[bold]1. train")
    t = time.perf_counter()
    train_results = train_stage(config, console)
    t = mark("train", t)

    console.rule("[bold]2. export every tier")
    from harmony_mobile.export.keys import (
        encode_public_key,
        load_or_create_p256_signing_key,
        load_or_create_signing_key,
    )
    from harmony_mobile.export.pipeline import export_run

    signing_key, _ = load_or_create_signing_key(out / "keys")
    p256_signing_key, _ = load_or_create_p256_signing_key(out / "keys")
    pinned = encode_public_key(signing_key.public_key())  # what the apps ship with
    export = reuse_export(out) if config.reuse_run else None
    if export is None:
        export = export_run(
            out / "run",
            out / "export",
            private_key=signing_key,
            p256_private_key=p256_signing_key,
            latency_runs=config.latency_runs,
            console=console,
        )
    export_summary = {
        "model_version": export.manifest.model_version,
        "seconds": export.seconds,
        "tiers": {
            t["tier"]: {row["quantization"]: row["size"] for row in t["pte"] + t["coreml"]}
            for t in export.report["tiers"]
        },
    }
    t = mark("export", t)

    run = RunDir(out / "run")
    info = run.info
    dataset = run.dataset()
    manifest = load_manifest(out / "export", decode_public_key(pinned))
    data = phone_data(run, dataset, manifest, config)

    console.rule("[bold]3. start the fallback server")
    server = ServerProcess(out / "server", out / "export", out / "server.log", secrets.token_urlsafe(32))
    phones: dict[str, Phone] = {}
    results: dict[str, dict[str, dict]] = {tier: {} for tier in data}
    uploads: dict[str, dict[str, dict]] = {tier: {} for tier in data}
    drift: dict[str, dict] = {}
    outage: dict[str, dict] = {}
    with terminate_on_sigterm():
        try:
            server.start()
            console.print(f"harmony serve on {server.url} (log: {server.log_file})")
            t = mark("server start", t)
            # provisioned to phones only, out of band: the lineage's secret, without which the slots the
            # server answers with name no class
            federation = FederationKey(run.federation_secret())
            for entry in manifest["tiers"]:
                tier = entry["name"]
                credentials = DeviceCredentials.from_enrolment(
                    enrol(server.url, server.admin_token, tier, name=f"demo-{tier}")
                )
                phones[tier] = Phone(
                    manifest=manifest,
                    tier=tier,
                    program=load_front_end(out / "export", manifest, tier, config.quantization),
                    server_url=server.url,
                    credentials=credentials,
                    federation_key=federation,
                    queue=UploadQueue(out / "phones" / tier / "queue"),
                )

            console.rule("[bold]4. phones classify their own data (ID + OOD), users confirm labels")

            def confirm_and_upload(tier: str, phone: Phone, progress: Progress, task) -> None:
                rows = confirm(phone, data[tier], dataset, info, "deployed")
                uploads[tier]["deployed"] = deliver(phone, rows)
                progress.update(task, description=f"+{uploads[tier]['deployed']['rows']} uploads")

            classify_phase(console, phones, data, results, "deployed", after=confirm_and_upload)
            t = mark("deployed", t)
            show_phase(console, results, "deployed")

            console.rule(
                "[bold]5. drift: phones keep personalizing locally (exit loss only), recalibrate tau"
            )
            target = calibration_target(info)
            with progress_bar(console) as progress:
                tasks = {tier: progress.add_task("", total=4, stage="drift", tier=tier) for tier in data}
                for tier, phone in phones.items():
                    progress.update(tasks[tier], description=f"fine-tune {config.drift_steps} steps")
                    front_end, images, loss = drift_front_end(run, data[tier], dataset, config)
                    progress.update(
                        tasks[tier], advance=1, description=f"re-export {config.quantization} .pte"
                    )
                    path = out / "phones" / tier / f"front_{config.quantization}_drifted.pte"
                    program = FrontEndProgram(
                        export_drifted(front_end, images, info, config.quantization, path), str(path)
                    )
                    progress.update(tasks[tier], advance=1, description="recalibrate tau on own val data")
                    # a threshold the operator fixed for the tier stays; a calibrated one is recalibrated
                    recalibrate = phone.entry["threshold_source"] == "calibrated"
                    threshold = (
                        calibrate_on_device(program, data[tier], phone.normalization, target)
                        if recalibrate
                        else phone.threshold
                    )
                    progress.update(tasks[tier], advance=1, description="measure")
                    probe = normalize(data[tier].pixels[:64], phone.normalization)
                    drift[tier] = {
                        "steps": config.drift_steps,
                        "final_exit_loss": loss,
                        "feature_shift": feature_shift(phone.program, program, probe),
                        "threshold_source": phone.entry["threshold_source"],
                        "calibration_target": target,
                        "val_samples": len(data[tier].val_labels),
                        "threshold_deployed": phone.threshold,
                        # context: tau the deployed .pte itself would get on the same val samples
                        # (the manifest's was calibrated on the fp32 training model)
                        "threshold_deployed_pte": calibrate_on_device(
                            phone.program, data[tier], phone.normalization, target
                        ),
                        "threshold_drifted": threshold,
                    }
                    phone.use_local_front_end(
                        program, threshold=threshold, model_version=f"{manifest['model_version']}+local-1"
                    )
                    progress.update(
                        tasks[tier],
                        advance=1,
                        description=f"features moved {drift[tier]['feature_shift']:.0%}, tau "
                        f"{drift[tier]['threshold_deployed']:.3f} -> {threshold:.3f}",
                    )
            t = mark("drift", t)
            classify_phase(console, phones, data, results, "drifted")
            t = mark("drifted", t)
            show_phase(console, results, "drifted")

            console.rule("[bold]6. server outage: phones answer locally and queue their sealed uploads")
            server.stop()
            with progress_bar(console) as progress:
                for tier, phone in phones.items():
                    step = max(1, len(data[tier].pixels) // config.outage_images)  # ID and OOD alike
                    images = data[tier].pixels[::step][: config.outage_images]
                    task = progress.add_task("", total=len(images), stage="outage", tier=tier)
                    sources = []
                    for pixels in images:
                        sources.append(phone.classify(pixels).source)
                        progress.advance(task)
                    rows = confirm(phone, data[tier], dataset, info, "drifted")
                    attempt = phone.flush()
                    outage[tier] = {
                        "answered": len(sources),
                        "local_exit": sources.count("local"),
                        "local_after_server_failure": sources.count("local_after_server_failure"),
                        "queued_uploads": attempt.remaining,
                        "queued_rows": rows,
                        "flush_error": attempt.error,
                    }
                    progress.update(
                        task,
                        description=f"{sources.count('local_after_server_failure')} local answers after a failed "
                        f"fallback, {attempt.remaining} uploads queued",
                    )
            server.start()
            for phone in phones.values():  # drop pooled connections to the old process
                phone.close()
                phone.connect()
            console.print(f"server restarted on {server.url}")
            with progress_bar(console) as progress:
                for tier, phone in phones.items():
                    task = progress.add_task("", total=1, stage="flush", tier=tier)
                    uploads[tier]["drifted"] = deliver(phone, outage[tier]["queued_rows"])
                    outage[tier]["delivered_after_restart"] = uploads[tier]["drifted"]["uploads"]
                    progress.update(
                        task,
                        advance=1,
                        description=f"{uploads[tier]['drifted']['uploads']} queued uploads delivered "
                        f"({uploads[tier]['drifted']['rows']} rows)",
                    )
            t = mark("outage", t)

            console.rule("[bold]7. alignment round over the sealed uploads (admin API)")
            with progress_bar(console) as progress:
                response = server.admin("POST", "/v1/alignment/rounds", json=config.alignment)
                if response.status_code != 202:
                    raise DemoError(
                        f"starting the alignment round failed: {response.status_code} {response.text}"
                    )
                round_id = response.json()["id"]
                task = progress.add_task("queued", total=100, stage="align", tier=f"round {round_id}")
                alignment = wait_for_round(server, round_id, config.alignment_timeout, progress, task)
            t = mark("alignment", t)
            console.print(
                f"alignment round {round_id}: [bold]{alignment['status']}[/bold]"
                + (
                    f", new back-end version {alignment['new_version']}"
                    if alignment.get("new_version")
                    else ""
                )
                + (f" ({alignment['error']})" if alignment.get("error") else "")
            )

            console.rule("[bold]8. phones classify again against the aligned back-end")
            classify_phase(console, phones, data, results, "aligned")
            t = mark("aligned", t)
            registry = server.admin("GET", "/v1/registry/versions").json()
        finally:
            for phone in phones.values():
                phone.close()
            status = server.stop()
            if server.port:
                console.print(f"server stopped (exit status {status})")

    timings["total"] = time.perf_counter() - started
    report = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
        "train": {k: train_results.get(k) for k in ("summary", "train_seconds", "thresholds")},
        "export": export_summary,
        "results": results,
        "uploads": uploads,
        "drift": drift,
        "outage": outage,
        "alignment": alignment,
        "registry": registry,
        "timings": timings,
        "server": {"url": server.url, "exit_status": status, "log": str(server.log_file)},
    }
    write_report(out, report, console)
    return report
