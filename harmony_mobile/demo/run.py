"""`harmony demo`: the whole product end to end on bundled data, on one machine.

    1. train      HARMONY on mnist5k with the default heterogeneous tiers (small budget)
    2. export     every tier: fp32/int8 .pte, Core ML packages, back-end, signed manifest
    3. serve      `harmony serve` in a subprocess on a free loopback port
    4. deploy     one simulated phone per tier (harmony_mobile.device: pinned manifest, the tier's
                  int8 .pte on the ExecuTorch runtime, local exit or server fallback) classifies its
                  own test data, ID + OOD (p = 0.5); users confirm labels of some local samples:
                  sealed uploads with label tokens
    5. drift      phones keep personalizing locally (exit loss only, on their own data), re-export
                  their .pte and recalibrate their exit threshold tau on their own validation samples
                  with it (same rule and target as training); their features drift away from what the
                  server back-end was trained on
    6. align      phones upload sealed features of newly confirmed samples; the operator starts an
                  alignment round over the admin API and waits for the new back-end version
    7. recover    phones classify again against the aligned back-end

Everything lands in the output directory (default ./demo-output): run/, export/, server/ (data dir
and log), phones/ (upload queues, drifted .pte), demo-report.md, demo-report.json and plots.
The server process is stopped on every exit path (normal end, error, Ctrl-C, SIGTERM).

This is a composition root like cli.py: it imports harmony_mobile.export lazily and talks to the
server only over HTTP.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harmony_mobile.algorithms.base import calibrate_threshold, exit_confidence
from harmony_mobile.data.partition import ClientSplit, make_partition, ood_test_indices
from harmony_mobile.device import (
    MODEL_NAME,
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
from harmony_mobile.federation.wire import encode_tensor
from harmony_mobile.run_dir import ClientArtifact, RunDir, RunInfo

PHASES = ("deployed", "drifted", "aligned")
UPLOAD_ROWS = 32  # confirmed samples per sealed upload
PHASE_TITLES = {
    "deployed": "deployed (trained back-end)",
    "drifted": "after local drift",
    "aligned": "after the alignment round",
}


class DemoError(RuntimeError):
    pass


@dataclass
class DemoConfig:
    out: Path = Path("demo-output")
    dataset: str = "mnist5k"
    dataset_limit: int | None = None
    tiers_file: str | None = None
    clients_per_tier: int = 3
    rounds: int = 8
    seed: int = 0
    quantization: str = "int8"  # which .pte each phone runs
    ood_fraction: float = 0.5
    max_test: int | None = None  # cap on ID test samples per phone (the e2e test uses a small one)
    confirmed: int = 128  # confirmed samples each phone uploads per phase (deployed, drifted)
    # 100 steps at 2e-3 moved the features 31-69 % but did not lower the back-end's accuracy on them
    # (its training simulated such extractor variation); this drift does, so there is a loss to recover
    drift_steps: int = 200
    drift_lr: float = 1e-2
    drift_batch: int = 32
    # JSON body of POST /v1/alignment/rounds: empty = the server's defaults (docs/PROTOCOL.md 7).
    # The round distills to the current version on the replay set shipped in backend.pt (features
    # of the clients' training images), not on the uploads it must correct.
    alignment: dict[str, Any] = field(default_factory=dict)
    latency_runs: int = 20  # export's own latency measurement per .pte
    reuse_run: bool = False  # keep a finished run in OUT/run with the same configuration
    alignment_timeout: float = 600.0
    outage_images: int = 20  # test images each phone answers while the server is down

    def train_config(self):
        from harmony_mobile.training import TrainConfig

        return TrainConfig(
            dataset=self.dataset,
            dataset_limit=self.dataset_limit,
            tiers_file=self.tiers_file,
            clients_per_tier=self.clients_per_tier,
            rounds=self.rounds,
            seed=self.seed,
            threads=1,
        )


# --------------------------------------------------------------------------- the server process


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`harmony serve` in a subprocess on a free loopback port; `stop()` is idempotent."""

    def __init__(self, data_dir: Path, model_dir: Path, log_file: Path, admin_token: str):
        self.data_dir, self.model_dir, self.log_file = data_dir, model_dir, log_file
        self.admin_token = admin_token
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self._log = None

    def start(self, timeout: float = 120.0) -> None:
        command = [
            sys.executable, "-m", "harmony_mobile.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--data-dir", str(self.data_dir), "--model-dir", str(self.model_dir),
            "--torch-threads", "1", "--log-level", "warning",
        ]  # fmt: skip
        env = {
            **os.environ,
            "HARMONY_ADMIN_TOKEN": self.admin_token,
            "OMP_NUM_THREADS": "1",
            # a simulated phone replays days of traffic in seconds: hundreds of fallbacks a second would
            # hit the per-device abuse limit (50/s) and turn into local answers, skewing the accuracies
            "HARMONY_RATE_LIMIT_PER_SECOND": "10000",
            "HARMONY_RATE_LIMIT_BURST": "10000",
        }
        self._log = open(self.log_file, "ab")
        # own process group: a Ctrl-C in the terminal reaches the demo, which then stops the server itself
        self.process = subprocess.Popen(
            command, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise DemoError(
                    f"the server exited with status {self.process.returncode}; see {self.log_file}"
                )
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/v2/health/ready", timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise DemoError(f"the server did not become ready in {timeout:.0f} s; see {self.log_file}")
            time.sleep(0.2)

    def stop(self, timeout: float = 20.0) -> int | None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return None if process is None else process.returncode

    def admin(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kwargs)


@contextlib.contextmanager
def terminate_on_sigterm():
    """SIGTERM behaves like Ctrl-C (KeyboardInterrupt), so the finally blocks stop the server."""

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------- data of each phone


@dataclass
class PhoneData:
    tier: str
    client: ClientArtifact
    pixels: np.ndarray  # uint8 (N, C, H, W): the test set, ID samples first, then OOD
    labels: np.ndarray
    is_ood: np.ndarray
    confirmed: dict[str, np.ndarray]  # phase -> indices into the dataset of samples the user confirms
    val_pixels: np.ndarray  # the phone's own held-out ID samples (the client's val split): tau calibration
    val_labels: np.ndarray


def to_pixels(images: torch.Tensor, mean, std) -> np.ndarray:
    """Undo the dataset normalization: what the camera gave the phone (0..255)."""
    mean = torch.tensor(mean).view(1, -1, 1, 1)
    std = torch.tensor(std).view(1, -1, 1, 1)
    return ((images * std + mean) * 255).round().clamp(0, 255).to(torch.uint8).numpy()


def confirmation_sets(client: ClientArtifact, clients, labels: np.ndarray, config: DemoConfig, rng) -> dict:
    """Samples whose label the phone's user confirms, per phase, drawn like its traffic: a share
    `ood_fraction` of classes the phone never trained on, the rest of its own classes. ID samples
    come from the phone's own training data, OOD ones from other clients' training data (never from
    any test set, so nothing the phones are scored on reaches the server's alignment)."""
    own = rng.permutation(np.asarray(client.train_idx))
    others = np.concatenate([np.asarray(c.train_idx) for c in clients if c.client_id != client.client_id])
    foreign = rng.permutation(others[~np.isin(labels[others], client.classes)])
    n_ood = min(int(round(config.confirmed * config.ood_fraction)), len(foreign) // 2)
    n_id = min(config.confirmed - n_ood, len(own) // 2)
    return {
        "deployed": np.concatenate([own[:n_id], foreign[:n_ood]]),
        "drifted": np.concatenate([own[n_id : 2 * n_id], foreign[n_ood : 2 * n_ood]]),
    }


def phone_data(run: RunDir, dataset, manifest: dict, config: DemoConfig) -> dict[str, PhoneData]:
    """Each tier's exported client, its ID test samples plus OOD samples (p = ood_fraction) drawn
    from the run's held-out OOD pool exactly as training's evaluation draws them."""
    info, train = run.info, run.info.train_config
    families = [t.family for t in info.tiers.tiers for _ in range(train["clients_per_tier"])]
    labels = dataset.labels.numpy()
    partition = make_partition(
        train["partition"],
        labels,
        len(families),
        train["seed"],
        alpha=train["alpha"],
        classes_per_client=train["classes_per_client"],
        client_families=families,
        classes_per_family=train["classes_per_family"],
    )
    clients = {c.client_id: c for c in run.clients()}
    result = {}
    rng = np.random.default_rng(config.seed)
    for entry in manifest["tiers"]:
        client = clients[entry["client_id"]]
        split = partition.clients[client.client_id]
        if split.test.tolist() != list(client.test_idx):
            raise DemoError(f"the partition recomputed for client {client.client_id} differs from the run's")
        test = np.asarray(client.test_idx)
        if config.max_test:
            test = np.sort(rng.choice(test, min(config.max_test, len(test)), replace=False))
        split = ClientSplit(client.client_id, tuple(client.classes), split.train, split.val, test)
        index, is_ood = ood_test_indices(split, labels, partition.ood_pool, config.ood_fraction, config.seed)
        confirmed = confirmation_sets(client, clients.values(), labels, config, rng)
        result[entry["name"]] = PhoneData(
            entry["name"],
            client,
            to_pixels(dataset.images[index], info.mean, info.std),
            labels[index],
            is_ood,
            confirmed,
            to_pixels(dataset.images[np.asarray(client.val_idx)], info.mean, info.std),
            labels[np.asarray(client.val_idx)],
        )
    return result


# --------------------------------------------------------------------------- phases


def classify_all(phone: Phone, data: PhoneData, progress: Progress, task) -> dict[str, Any]:
    """Run every test image through the phone; metrics of this phase."""
    start_infer = phone.stats.infer_bytes
    phone.stats.local_ms.clear()
    predictions, exit_predictions, sources, features = [], [], [], []
    for pixels in data.pixels:
        answer = phone.classify(pixels)
        predictions.append(answer.prediction)
        exit_predictions.append(answer.exit_prediction)
        sources.append(answer.source)
        features.append(answer.features)
        progress.advance(task)
    server_correct = server_predictions(phone, torch.cat(features)) == data.labels
    predictions, exit_predictions = np.array(predictions), np.array(exit_predictions)
    sources = np.array(sources)
    correct, exit_correct = predictions == data.labels, exit_predictions == data.labels
    ident = ~data.is_ood
    fallback = sources != "local"
    served = sources == "server"
    return {
        "samples": len(data.labels),
        "ood_samples": int(data.is_ood.sum()),
        "exit_rate": float((~fallback).mean()),
        "fallback_rate": float(fallback.mean()),
        "server_failures": int((sources == "local_after_server_failure").sum()),
        "accuracy_without_ood": float(correct[ident].mean()),
        "accuracy_with_ood": float(correct.mean()),
        "exit_only_accuracy_with_ood": float(exit_correct.mean()),
        "exit_only_accuracy_without_ood": float(exit_correct[ident].mean()),
        "server_fallback_accuracy": float(correct[served].mean()) if served.any() else float("nan"),
        "server_accuracy": float(server_correct.mean()),  # what the phone gets if every sample falls back
        "server_accuracy_id": float(server_correct[ident].mean()),
        "server_accuracy_ood": float(server_correct[~ident].mean()) if (~ident).any() else float("nan"),
        "median_latency_ms": statistics.median(phone.stats.local_ms),
        "threshold": phone.threshold,
        "infer_bytes": phone.stats.infer_bytes - start_infer,
    }


def server_predictions(phone: Phone, features: torch.Tensor, rows: int = 64) -> np.ndarray:
    """Measurement only (not phone traffic, not counted in its bytes): the server's answer for every
    test image's features, so drift and recovery show on all samples, not just the fallback share."""
    predictions = []
    for start in range(0, len(features), rows):
        response = phone.http.post(
            f"/v2/models/{MODEL_NAME}/infer",
            content=encode_tensor(features[start : start + rows].numpy()),
            headers={"Content-Type": "application/octet-stream"},
        )
        if response.status_code != 200:
            raise DemoError(f"measurement infer failed: {response.status_code} {response.text}")
        outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
        predictions.extend(outputs["top_class"])
    return np.array(predictions)


def confirm(phone: Phone, data: PhoneData, dataset, info, phase: str) -> int:
    """The user confirmed labels of some samples: seal their features + label tokens into the queue."""
    index = data.confirmed[phase]
    pixels = to_pixels(dataset.images[index], info.mean, info.std)
    _, features, _ = phone.run_front_end(pixels)
    labels = dataset.labels[index].tolist()
    for start in range(0, len(labels), UPLOAD_ROWS):  # one upload per confirmation session
        phone.confirm(features[start : start + UPLOAD_ROWS], labels[start : start + UPLOAD_ROWS])
    return len(index)


def deliver(phone: Phone, rows: int) -> dict[str, Any]:
    """Flush the phone's queue; everything must be acknowledged."""
    before = phone.stats.upload_bytes, phone.stats.uploads_acknowledged, phone.stats.duplicates
    result = phone.flush()
    if result.remaining or result.rejected:
        raise DemoError(
            f"{phone.tier}: {result.remaining} uploads still queued ({result.error}), {result.rejected} rejected"
        )
    return {
        "rows": rows,
        "upload_bytes": phone.stats.upload_bytes - before[0],
        "uploads": phone.stats.uploads_acknowledged - before[1],
        "duplicates": phone.stats.duplicates - before[2],
    }


def drift_front_end(run: RunDir, data: PhoneData, dataset, config: DemoConfig):
    """What a phone's on-device personalization does over time: exit-loss-only fine-tuning on its own
    labelled data. Nothing keeps the connector's features where the server expects them."""
    torch.manual_seed(config.seed)
    front_end = run.front_end(data.client).train()
    images = dataset.images[np.asarray(data.client.train_idx)]
    labels = dataset.labels[np.asarray(data.client.train_idx)]
    optimizer = torch.optim.Adam(front_end.parameters(), lr=config.drift_lr)
    generator = torch.Generator().manual_seed(config.seed)
    losses = []
    for _ in range(config.drift_steps):
        batch = torch.randint(len(labels), (min(config.drift_batch, len(labels)),), generator=generator)
        logits, _ = front_end(images[batch])
        loss = F.cross_entropy(logits, labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return front_end.eval(), images, float(np.mean(losses[-10:]))


def export_drifted(front_end, calibration: torch.Tensor, info, quantization: str, path: Path) -> bytes:
    """The same export steps as `harmony export` (wrap, PT2E int8, XNNPACK lowering, delegation check)."""
    from harmony_mobile.export import steps

    module = steps.wrap_front_end(front_end, tuple(info.input_shape), info.num_classes)
    with warnings.catch_warnings():  # torch 2.13 pytree FutureWarnings on every export: noise only
        warnings.simplefilter("ignore", FutureWarning)
        build = steps.build_pte(module, tuple(info.input_shape), quantization, calibration[:256], 1)
    steps.serialize(build, path)
    return path.read_bytes()


def calibration_target(info: RunInfo) -> float:
    """The local-exit accuracy target training calibrated tau with: the run's algorithm config
    (`calibration_target`, its default when the run did not override it)."""
    from harmony_mobile.algorithms.registry import build_algorithm

    algorithm = build_algorithm(info.algorithm, info.train_config.get("algorithm_config") or {})
    target = getattr(algorithm.config, "calibration_target", None)
    if target is None or algorithm.exit_rule != "max_softmax":
        raise DemoError(
            f"algorithm {info.algorithm!r} does not calibrate a max-softmax exit threshold; "
            "the device runtime exits on max softmax >= tau"
        )
    return float(target)


def calibrate_on_device(
    program: FrontEndProgram, data: PhoneData, normalization: dict, target: float
) -> float:
    """What a phone does after personalizing its front-end: tau from its own held-out ID samples run
    through the .pte it answers with; the same rule and target as training's `calibrate_client`."""
    logits, _ = program.run(normalize(data.val_pixels, normalization))
    logits = logits.float()
    correct = logits.argmax(dim=1) == torch.as_tensor(data.val_labels)
    return calibrate_threshold(exit_confidence(logits, "max_softmax"), correct, target)


def feature_shift(program_before: FrontEndProgram, program_after: FrontEndProgram, images) -> float:
    """Relative L2 change of the interface features on the same images."""
    _, before = program_before.run(images)
    _, after = program_after.run(images)
    return float((after - before).norm() / before.norm())


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


# --------------------------------------------------------------------------- the whole demo


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
    from harmony_mobile.export.keys import encode_public_key, load_or_create_signing_key
    from harmony_mobile.export.pipeline import export_run

    signing_key, _ = load_or_create_signing_key(out / "keys")
    pinned = encode_public_key(signing_key.public_key())  # what the apps ship with
    export = reuse_export(out) if config.reuse_run else None
    if export is None:
        export = export_run(
            out / "run",
            out / "export",
            private_key=signing_key,
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
            federation = FederationKey(secrets.token_bytes(32), round_id=1)  # provisioned to phones only
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


# --------------------------------------------------------------------------- reporting


def _pct(value: float) -> str:
    return "n/a" if value != value else f"{100 * value:.1f}%"


def show_phase(console: Console, results: dict, phase: str) -> None:
    table = Table(title=PHASE_TITLES[phase])
    columns = (
        "tier",
        "local exit",
        "fallback",
        "acc. w/o OOD",
        "acc. with OOD",
        "exit-only with OOD",
        "server on fallback",
        "server on ID / OOD",
    )
    for column in columns:
        table.add_column(column, justify="right" if column != "tier" else "left")
    for tier, phases in results.items():
        r = phases[phase]
        table.add_row(
            tier,
            _pct(r["exit_rate"]),
            _pct(r["fallback_rate"]),
            _pct(r["accuracy_without_ood"]),
            _pct(r["accuracy_with_ood"]),
            _pct(r["exit_only_accuracy_with_ood"]),
            _pct(r["server_fallback_accuracy"]),
            f"{_pct(r['server_accuracy_id'])} / {_pct(r['server_accuracy_ood'])}",
        )
    console.print(table)


SUMMARY_COLUMNS = (
    "tier",
    "phase",
    "local exit",
    "fallback",
    "acc. w/o OOD",
    "acc. with OOD",
    "exit-only with OOD",
    "server acc. on OOD",
    "median .pte ms",
    "KiB sent (infer + upload)",
)


def summary_rows(report: dict) -> list[list[str]]:
    rows = []
    for tier, phases in report["results"].items():
        for phase in PHASES:
            if phase not in phases:
                continue
            r = phases[phase]
            uploaded = report["uploads"][tier].get(phase, {}).get("upload_bytes", 0)
            rows.append(
                [
                    tier,
                    phase,
                    _pct(r["exit_rate"]),
                    _pct(r["fallback_rate"]),
                    _pct(r["accuracy_without_ood"]),
                    _pct(r["accuracy_with_ood"]),
                    _pct(r["exit_only_accuracy_with_ood"]),
                    _pct(r["server_accuracy_ood"]),
                    f"{r['median_latency_ms']:.3f}",
                    f"{r['infer_bytes'] / 1024:.0f} + {uploaded / 1024:.0f}",
                ]
            )
    return rows


RECOVERY_COLUMNS = (
    "tier",
    "server acc. on the phone's features: deployed -> drifted -> aligned",
    "drift loss",
    "recovered",
    "server acc. on OOD",
    "exit tau: deployed -> drifted",
    "local exit: deployed -> drifted",
    "acc. with OOD",
)


def _recovered(a: float, b: float, c: float) -> str:
    """Share of the drift loss won back; a loss under one point is within sampling noise."""
    if a - b < 0.01:
        return "no drift loss"
    return _pct((c - b) / (a - b)) if c <= a else f"all, {100 * (c - a):+.1f} pts beyond"


def recovery_rows(report: dict) -> list[list[str]]:
    rows = []
    for tier, phases in report["results"].items():
        if not all(p in phases for p in PHASES):
            continue
        # the fallback accuracy drift costs and alignment wins back, independent of the exit threshold
        a, b, c = (phases[p]["server_accuracy"] for p in PHASES)
        drift = report["drift"].get(tier, {})
        tau = (drift.get(k, float("nan")) for k in ("threshold_deployed", "threshold_drifted"))
        rows.append(
            [
                tier,
                f"{_pct(a)} -> {_pct(b)} -> {_pct(c)}",
                f"{100 * (a - b):+.1f} pts",
                _recovered(a, b, c),
                " -> ".join(_pct(phases[p]["server_accuracy_ood"]) for p in PHASES),
                " -> ".join(f"{v:.4f}" for v in tau),
                f"{_pct(phases['deployed']['exit_rate'])} -> {_pct(phases['drifted']['exit_rate'])}",
                " -> ".join(_pct(phases[p]["accuracy_with_ood"]) for p in PHASES),
            ]
        )
    return rows


def write_report(out: Path, report: dict, console: Console) -> None:
    (out / "demo-report.json").write_text(json.dumps(report, indent=2, default=str))
    plots = make_plots(out, report)
    table = Table(title="harmony demo: per tier, before drift / after drift / after alignment (p = 0.5 OOD)")
    for column in SUMMARY_COLUMNS:
        table.add_column(column, justify="left" if column in ("tier", "phase") else "right")
    for row in summary_rows(report):
        table.add_row(*row)
    console.print(table)
    recovery = Table(title="drift and recovery of the server's accuracy on each phone's features (ID + OOD)")
    for column in RECOVERY_COLUMNS:
        recovery.add_column(column, justify="left" if column == "tier" else "right")
    for row in recovery_rows(report):
        recovery.add_row(*row)
    console.print(recovery)
    alignment = report.get("alignment") or {}
    console.print(
        f"alignment round: {alignment.get('status')} -> {alignment.get('new_version')}; "
        f"wall time {report['timings']['total']:.0f} s; report: {out / 'demo-report.md'}"
    )
    (out / "demo-report.md").write_text(markdown_report(report, plots))


def _md_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_report(report: dict, plots: list[str]) -> str:
    config, timings = report["config"], report["timings"]
    alignment = report.get("alignment") or {}
    metrics = alignment.get("metrics") or {}
    train = (report.get("train") or {}).get("summary") or {}
    parts = [
        "# harmony demo report",
        "",
        f"Data set `{config['dataset']}`, {config['rounds']} training rounds, {config['clients_per_tier']} "
        f"clients per tier, seed {config['seed']}. One simulated phone per tier (the tier's exported "
        f"client) runs the signed `{config['quantization']}` .pte on the ExecuTorch runtime over its own "
        f"test data: its ID test samples plus OOD samples (classes it never held) at p = "
        f"{config['ood_fraction']}. Model version `{report['export']['model_version']}`.",
        "",
        "## Summary",
        "",
        _md_table(SUMMARY_COLUMNS, summary_rows(report)),
        "",
        "*local exit / fallback*: share of test images answered by the phone's exit / sent to the server. "
        "*exit-only*: accuracy if the phone never fell back. *KiB sent*: binary infer bodies + sealed "
        "uploads of confirmed samples. *median .pte ms*: the front-end on this machine's CPU.",
        "",
        "## Drift and recovery",
        "",
        _md_table(RECOVERY_COLUMNS, recovery_rows(report)),
        "",
        "*server acc. on the phone's features*: the server's answer on the features of every test image "
        "of the phone (ID and OOD), i.e. the fallback accuracy, whatever the exit threshold; drift loss "
        "and recovery are measured on it. *acc. with OOD* also moves with the recalibrated tau.",
        "",
        f"Drift: each phone fine-tuned its front-end for {config['drift_steps']} Adam steps (lr "
        f"{config['drift_lr']}) on its own labelled data with the exit loss only, then re-exported its .pte "
        "with the same steps as `harmony export` and recalibrated its exit threshold tau on its own "
        "validation samples run through that .pte: the smallest tau whose local-exit accuracy on them "
        "reaches training's calibration target ("
        + ", ".join(
            f"{t} {d['calibration_target']:g} on {d['val_samples']} samples"
            for t, d in report["drift"].items()
        )
        + "; a threshold fixed by the tier is kept). tau deployed (manifest, calibrated on the fp32 "
        "model) / of the deployed .pte on the same samples / of the drifted .pte: "
        + ", ".join(
            f"{t} "
            + " / ".join(
                f"{d[k]:.4f}" for k in ("threshold_deployed", "threshold_deployed_pte", "threshold_drifted")
            )
            for t, d in report["drift"].items()
        )
        + ". Relative change of the interface features: "
        + ", ".join(f"{t} {d['feature_shift']:.0%}" for t, d in report["drift"].items())
        + ".",
        "",
        f"Alignment round: status **{alignment.get('status')}**, new back-end `{alignment.get('new_version')}`, "
        f"SupCon on {metrics.get('rows')} new stored rows ({metrics.get('train_rows')} train / "
        f"{metrics.get('holdout_rows')} held out), distillation to the previous version on "
        f"{metrics.get('replay_rows')} replay rows ({metrics.get('replay_shipped_rows')} shipped with the "
        f"back-end, {metrics.get('replay_stored_rows')} stored; {metrics.get('replay_holdout_rows')} held out). "
        f"Held-out replay agreement with the previous version {metrics.get('replay_agreement', float('nan')):.3f} "
        f"(check: {metrics.get('replay_check')}), token purity of the new rows "
        f"{metrics.get('holdout_purity_before', float('nan')):.3f} -> "
        f"{metrics.get('holdout_purity_after', float('nan')):.3f}, predictions changed on "
        f"{metrics.get('holdout_changed', float('nan')):.1%} of them"
        + (f"; rejected because {metrics['rejected_because']}" if metrics.get("rejected_because") else "")
        + f". Parameters: `{json.dumps(config['alignment'])}` (empty: the server's defaults).",
        "",
        "## Server outage",
        "",
        "The server was stopped after the drift; each phone answered test images (a failed fallback "
        "answers with the local exit) and sealed its confirmed uploads into its durable queue, then the "
        "server was restarted and the queues flushed: "
        + "; ".join(
            f"{t}: {o['local_after_server_failure']} of {o['answered']} answered locally after a failed "
            f"fallback, {o['queued_uploads']} uploads queued, {o.get('delivered_after_restart')} delivered"
            for t, o in (report.get("outage") or {}).items()
        )
        + f". The alignment round found {metrics.get('rows')} stored rows: every confirmed row exactly once.",
        "",
        "## Training and export",
        "",
        f"Training (in-process evaluation, all clients): accuracy without OOD "
        f"{train.get('accuracy_without_ood', float('nan')):.3f}, with OOD {train.get('accuracy_with_ood', float('nan')):.3f}, "
        f"exit-only with OOD {train.get('exit_only_accuracy_with_ood', float('nan')):.3f}.",
        "",
        _md_table(
            ("tier", "artifact sizes (bytes)"),
            [
                [tier, ", ".join(f"{q} {s:,}" for q, s in sizes.items())]
                for tier, sizes in report["export"]["tiers"].items()
            ],
        ),
        "",
        "## Wall time",
        "",
        _md_table(("stage", "seconds"), [[k, f"{v:.0f}"] for k, v in timings.items()]),
        "",
    ]
    if plots:
        parts += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    parts += [
        "## Where things are",
        "",
        "`run/` training run, `export/` signed export (manifest.json, .pte, .mlpackage, backend), "
        "`server/` server data dir (SQLite store, back-end versions), `server.log`, `phones/<tier>/` "
        "upload queue and drifted .pte, `demo-report.json` every number above.",
        "",
    ]
    return "\n".join(parts)


def make_plots(out: Path, report: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (out / "plots").mkdir(exist_ok=True)
    tiers = list(report["results"])
    x = np.arange(len(tiers))
    width = 0.2
    fig, ax = plt.subplots(figsize=(8, 4))
    exit_only = [report["results"][t]["deployed"]["exit_only_accuracy_with_ood"] for t in tiers]
    ax.bar(x - 1.5 * width, exit_only, width, label="exit only (deployed)", color="#bbbbbb")
    colors = {"deployed": "#1f77b4", "drifted": "#d62728", "aligned": "#2ca02c"}
    for i, phase in enumerate(PHASES):
        values = [report["results"][t].get(phase, {}).get("accuracy_with_ood", np.nan) for t in tiers]
        ax.bar(x + (i - 0.5) * width, values, width, label=phase, color=colors[phase])
    ax.set_xticks(x, tiers)
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"accuracy with OOD (p = {report['config']['ood_fraction']})")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("phones: exit only vs hybrid, before drift, after drift, after alignment")
    fig.tight_layout()
    fig.savefig(out / "plots" / "accuracy.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    for i, phase in enumerate(PHASES):
        values = [report["results"][t].get(phase, {}).get("server_fallback_accuracy", np.nan) for t in tiers]
        ax.bar(x + (i - 1) * width, values, width, label=phase, color=colors[phase])
    ax.set_xticks(x, tiers)
    ax.set_ylim(0, 1)
    ax.set_ylabel("server accuracy on fallback samples")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "plots" / "fallback.png", dpi=120)
    plt.close(fig)
    return ["plots/accuracy.png", "plots/fallback.png"]
