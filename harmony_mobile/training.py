"""`harmony train`: data -> partition -> clients -> federated rounds -> personalization -> run dir.

Reads top to bottom; every step is a function of the config and the seed.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from harmony_mobile.algorithms.base import calibrate_client
from harmony_mobile.algorithms.registry import build_algorithm
from harmony_mobile.data import dataset_info, load_dataset
from harmony_mobile.data.partition import ClientSplit, Partition, make_partition
from harmony_mobile.evaluation import BackendWithSlots, EvaluationSetting, client_answers, evaluate
from harmony_mobile.federation.client import Client
from harmony_mobile.federation.replay import collect_replay
from harmony_mobile.federation.rounds import (
    ClientTurns,
    Federation,
    personalization_round,
    run_rounds,
    seed_turn,
)
from harmony_mobile.federation.slot_gate import slot_gates
from harmony_mobile.federation.split_trainer import SplitTrainer
from harmony_mobile.files import open_private
from harmony_mobile.models import (
    Backend,
    FamilyModel,
    InterfaceSpec,
    ProjectionHead,
    Tier,
    TierSet,
    load_tiers,
)
from harmony_mobile.privacy.feature_noise import feature_privacy_report
from harmony_mobile.privacy.label_dp import keep_probability
from harmony_mobile.privacy.options import UploadPrivacy
from harmony_mobile.protocol.label_tokens import check_label_epoch
from harmony_mobile.protocol.slots import SlotTable
from harmony_mobile.run_dir import (
    CLIENT_PART,
    SECRET_FILE,
    ClientArtifact,
    RunDirError,
    RunInfo,
    ensure_federation_secret,
    save_backend,
    save_client,
    write_federation_secret,
    write_run_info,
)


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: str = "mnist5k"
    data_root: str | None = None
    dataset_limit: int | None = Field(default=None, ge=10, description="use only the first N samples")
    tiers_file: str | None = Field(default=None, description="tiers YAML; None = built-in defaults")
    clients_per_tier: int = Field(default=3, ge=1)
    partition: Literal["family", "dirichlet", "shard"] = "family"
    alpha: float = Field(default=0.5, gt=0, description="Dirichlet concentration (partition=dirichlet)")
    classes_per_client: int = Field(default=2, ge=1, description="partition=shard")
    classes_per_family: int | None = Field(
        default=None, ge=1, description="partition=family; None = automatic"
    )
    rounds: int = Field(default=10, ge=1)
    clients_per_round: int = Field(default=0, ge=0, description="0 = every client every round")
    seed: int = 0
    algorithm: str = "harmony"
    algorithm_config: dict[str, Any] = Field(
        default_factory=dict, description="overrides of the algorithm's config"
    )
    interface_channels: int = Field(default=InterfaceSpec.channels, ge=1)  # InterfaceSpec holds the default
    interface_size: int = Field(default=InterfaceSpec.size, ge=1)
    label_dp_epsilon: float | None = Field(
        default=None, gt=0, description="label DP: randomized response on each row's token; None = off"
    )
    feature_clip: float | None = Field(default=None, gt=0, description="L2 clip norm of uploaded features")
    noise_multiplier: float | None = Field(
        default=None, ge=0, description="Gaussian noise on uploaded features, std = multiplier * clip"
    )
    threads: int = Field(
        default=1,
        ge=1,
        description="torch intra-op threads (tiny convs gain little from more; 2 stalled on a busy machine)",
    )


def upload_privacy(config: TrainConfig) -> UploadPrivacy:
    return UploadPrivacy(
        label_dp_epsilon=config.label_dp_epsilon,
        feature_clip=config.feature_clip,
        noise_multiplier=config.noise_multiplier,
    )


def build_clients(
    config: TrainConfig,
    tiers: TierSet,
    dataset,
    partition: Partition,
    interface,
    federation_secret: bytes,
    label_epoch: str,
) -> list[Client]:
    """`federation_secret` is the clients' only: the server never gets it."""
    privacy = upload_privacy(config)
    tier_of_client = [tier for tier in tiers.tiers for _ in range(config.clients_per_tier)]
    return [
        make_client(
            split,
            tier,
            dataset.images,
            dataset.labels,
            dataset,
            interface,
            federation_secret,
            label_epoch,
            privacy,
        )
        for split, tier in zip(partition.clients, tier_of_client, strict=True)
    ]


def make_client(
    split: ClientSplit,
    tier: Tier,
    images: torch.Tensor,
    labels: torch.Tensor,
    info,
    interface,
    federation_secret: bytes,
    label_epoch: str,
    privacy: UploadPrivacy,
) -> Client:
    """A client holding its split's rows of `images` and `labels`, with a new model of its tier;
    `info` (an ImageDataset, or a DatasetInfo where the rows are loaded apart) names the classes
    and the input shape."""
    channels, size, _ = info.input_shape
    return Client(
        client_id=split.client_id,
        tier=tier,
        classes=split.classes,
        model=FamilyModel(tier.family, channels, size, info.num_classes, tier.width, interface),
        train_x=images[split.train],
        train_y=labels[split.train],
        val_x=images[split.val],
        val_y=labels[split.val],
        federation_secret=federation_secret,
        label_epoch=label_epoch,
        class_names=tuple(info.class_names),
        privacy=privacy,
    )


def initial_family_weights(config: TrainConfig, tiers: TierSet, dataset, interface) -> dict[str, dict]:
    """One meta-model per (family, width): clients of one family share its meta-weights."""
    channels, size, _ = dataset.input_shape
    weights = {}
    for i, tier in enumerate(tiers.tiers):
        if tier.family in weights:
            continue
        torch.manual_seed(config.seed * 1000 + i)
        model = FamilyModel(tier.family, channels, size, dataset.num_classes, tier.width, interface)
        weights[tier.family] = model.state_dict()
    return weights


def check_family_widths(tiers: TierSet) -> None:
    widths: dict[str, float] = {}
    for tier in tiers.tiers:
        if widths.setdefault(tier.family, tier.width) != tier.width:
            raise ValueError(
                f"tiers of family {tier.family!r} use different widths ({widths[tier.family]:g} and {tier.width:g}); "
                "tiers of one family share its meta-weights, so they must share a width"
            )


def model_version(backend: Backend, algorithm: str) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(backend.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.numpy().tobytes())
    return f"{algorithm}-{digest.hexdigest()[:12]}"


def prepare_run_dir(run_path: Path, config: TrainConfig) -> None:
    """A new dir, or the same run to resume. A dir holding another or a finished run is an error."""
    info_file = run_path / "run.json"
    if run_path.exists() and not run_path.is_dir():
        raise RunDirError(f"{run_path} exists and is not a directory")
    if not info_file.is_file():
        # a lineage provisioned ahead of the run (a deployment's phones hold the same secret file;
        # `--lineage-from` copies another run's) is all a new run dir may already have
        present = (
            {p.relative_to(run_path).as_posix() for p in run_path.rglob("*")} if run_path.is_dir() else set()
        )
        if present - {SECRET_FILE, CLIENT_PART, EPOCH_FILE}:
            raise RunDirError(f"{run_path} is not empty and holds no harmony run; choose a new run directory")
        return
    previous = json.loads(info_file.read_text()).get("train_config")
    if previous != config.model_dump():
        raise RunDirError(
            f"{run_path} already holds a different run (its run.json has another configuration); "
            "choose a new run directory or delete this one"
        )
    if (run_path / "final_metrics.json").is_file():
        raise RunDirError(f"{run_path} already holds this run, finished; nothing to do")


class TrainObserver:
    """What a caller (the benchmark) may hook into a run instead of patching training: each method
    here does nothing; a subclass overrides what it needs."""

    def lineage(self, run_path: Path) -> tuple[bytes, str] | None:
        """The run's federation secret and label epoch, or None for a new random lineage."""
        return None

    def watch(self, federation: Federation) -> None:
        """Called once the federation exists (subscribe to its server's uploads, its updates)."""

    def after_evaluate(
        self,
        clients,
        served,
        images,
        labels,
        partition,
        results: dict,
        exit_rule: str,
        answers=None,
        replay=None,
    ) -> None:
        """Called with the live clients right after the final evaluation (`answers`: their answer
        caches, `evaluation.ClientAnswers` by client id, to reuse the forward passes; `replay`: the
        back-end's replay set, None without a back-end)."""


EPOCH_FILE = "label_epoch"  # a provisioned lineage's epoch, read when run.json does not exist yet


def label_epoch_of(run_path: Path) -> str:
    """The run's label epoch (public; the server's to pick): run.json's on resume, a provisioned
    one (`share_lineage`), else a new one."""
    info_file = run_path / "run.json"
    if info_file.is_file():
        return json.loads(info_file.read_text())["label_epoch"]
    if (run_path / EPOCH_FILE).is_file():
        return check_label_epoch((run_path / EPOCH_FILE).read_text().strip())
    return f"e-{secrets.token_hex(8)}"


def share_lineage(source: Path, run_path: Path) -> None:
    """Give a new run dir the federation secret and label epoch of finished run `source`, so that
    two runs of one configuration give the same numbers on purpose (a lineage is random otherwise)."""
    source, run_path = Path(source), Path(run_path)
    if not (source / "run.json").is_file() or not (source / SECRET_FILE).is_file():
        raise RunDirError(f"--lineage-from {source}: not a run dir with run.json and {SECRET_FILE}")
    if run_path.exists() and any(run_path.iterdir()):
        raise RunDirError(f"--lineage-from needs a new run directory; {run_path} is not empty")
    write_federation_secret(run_path, (source / SECRET_FILE).read_bytes())
    with open_private(run_path / EPOCH_FILE, "w") as out:
        out.write(label_epoch_of(source))


def lineage_secrets(run_path: Path) -> tuple[bytes, str]:
    """The federation secret (client part: created with the run, reused on resume, since a resumed
    run must token labels exactly as before) and the label epoch of the run."""
    return ensure_federation_secret(run_path).read_bytes(), label_epoch_of(run_path)


def privacy_report(config: TrainConfig, max_releases: int, num_classes: int) -> dict:
    """run.json's account of the upload protections of this run (None where an option is off);
    `max_releases`: how often the most-released training sample of any client left its phone."""
    return {
        "label_dp_epsilon": config.label_dp_epsilon,
        "label_dp_keep_probability": keep_probability(config.label_dp_epsilon, num_classes)
        if config.label_dp_epsilon is not None
        else None,
        "features": feature_privacy_report(config.feature_clip, config.noise_multiplier, max_releases),
    }


@dataclass
class TrainingRun:
    """Everything `harmony train` sets up before the rounds and finishes after them; the engines
    (in-process here, Flower in harmony_mobile/flower) run the rounds and personalization between."""

    config: TrainConfig
    run_path: Path
    started: float
    dataset: Any
    partition: Partition
    info: RunInfo
    federation: Federation
    backend: Backend
    projection: ProjectionHead
    label_epoch: str
    client_tiers: list[Tier]  # client i's tier; the clients themselves only when this process plays them

    @property
    def clients(self) -> list[Client]:
        return self.federation.clients


def check_config(config: TrainConfig) -> TierSet:
    """Bad tiers or algorithm settings fail before the run directory is touched."""
    tiers = load_tiers(config.tiers_file)
    check_family_widths(tiers)
    algorithm = build_algorithm(config.algorithm, config.algorithm_config)
    fixed = [t.name for t in tiers.tiers if t.threshold is not None]
    if fixed and algorithm.exit_rule != "max_softmax":
        raise ValueError(
            f"tiers {', '.join(fixed)} fix a max-softmax exit threshold, but {config.algorithm!r} exits by "
            f"{algorithm.exit_rule!r}: remove `threshold` from those tiers"
        )
    return tiers


def partition_seed(seed: int, federation_secret: bytes) -> int:
    """The partition's randomness: the run's seed keyed with the phones' secret. Which classes a
    client (or a model family) holds is the phones' fact; from the seed alone, which run.json
    publishes, the server could recompute the split and, with the slots each client uploads to,
    name slots without seeing an image."""
    digest = hashlib.sha256(b"harmony/partition/" + str(seed).encode() + b"/" + federation_secret).digest()
    return int.from_bytes(digest[:8], "little")


def client_partition(config: TrainConfig, tiers: TierSet, dataset, federation_secret: bytes) -> Partition:
    """Client i of the run holds split i and the i-th tier slot (tiers in file order, each repeated)."""
    families = [tier.family for tier in tiers.tiers for _ in range(config.clients_per_tier)]
    return make_partition(
        config.partition,
        dataset.labels.numpy(),
        len(families),
        partition_seed(config.seed, federation_secret),
        alpha=config.alpha,
        classes_per_client=config.classes_per_client,
        client_families=families,
        classes_per_family=config.classes_per_family,
    )


def new_run_info(
    config: TrainConfig, dataset, tiers: TierSet, interface: InterfaceSpec, label_epoch: str
) -> RunInfo:
    """run.json of a run in training: public facts only (which classes a client holds: client part)."""
    return RunInfo.of_dataset(
        dataset,
        algorithm=config.algorithm,
        data_root=config.data_root,
        dataset_limit=config.dataset_limit,
        interface=(interface.channels, interface.size),
        tiers=tiers,
        model_version="in-training",
        label_epoch=label_epoch,
        seed=config.seed,
        privacy=privacy_report(config, 0, dataset.num_classes),
        train_config=config.model_dump(),
        partition={"scheme": config.partition},
        exit_rule=build_algorithm(config.algorithm, config.algorithm_config).exit_rule,
    )


def start_run(
    config: TrainConfig, run_path: Path, play_clients: bool = True, observer: TrainObserver | None = None
) -> TrainingRun:
    """Checks, run dir, data, partition, clients, run.json, back-end and the federation.

    With `play_clients=False` (the Flower ServerApp) this is the server's part only: no secret is
    read, no client is built and no image or label is loaded (the data set's description only)."""
    started = time.perf_counter()
    torch.set_num_threads(config.threads)
    run_path = Path(run_path)
    tiers = check_config(config)
    algorithm = build_algorithm(config.algorithm, config.algorithm_config)
    prepare_run_dir(run_path, config)
    if play_clients:
        dataset = load_dataset(config.dataset, config.data_root, limit=config.dataset_limit)
    else:  # the server's part: what the data set is, never a sample or a label
        dataset = dataset_info(config.dataset, config.data_root)
    tiers = tiers.with_input_shape(dataset.input_shape)
    interface = InterfaceSpec(config.interface_channels, config.interface_size)
    client_tiers = [tier for tier in tiers.tiers for _ in range(config.clients_per_tier)]
    if play_clients:
        secret, label_epoch = (observer and observer.lineage(run_path)) or lineage_secrets(run_path)
        partition = client_partition(config, tiers, dataset, secret)
        clients = build_clients(config, tiers, dataset, partition, interface, secret, label_epoch)
    else:
        partition, clients, label_epoch = None, [], label_epoch_of(run_path)
    info = new_run_info(config, dataset, tiers, interface, label_epoch)
    write_run_info(run_path, info)
    torch.manual_seed(config.seed)
    backend = Backend(interface, dataset.num_classes)
    projection = ProjectionHead(backend.feature_dim)
    split_trainer_config = algorithm.split_trainer_config()
    server = (
        SplitTrainer(backend, projection, split_trainer_config, label_epoch)
        if split_trainer_config is not None
        else None
    )
    weights = initial_family_weights(config, tiers, dataset, interface)
    federation = Federation(algorithm, clients, weights, server)
    if observer is not None:
        observer.watch(federation)
    return TrainingRun(
        config,
        run_path,
        started,
        dataset,
        partition,
        info,
        federation,
        backend,
        projection,
        label_epoch,
        client_tiers,
    )


def client_artifact(client: Client, split) -> ClientArtifact:
    """Client side: what a phone keeps of training (the client part of the run dir)."""
    return ClientArtifact(
        client_id=client.client_id,
        tier=client.tier.name,
        classes=client.classes,
        threshold=client.threshold,
        train_idx=split.train.tolist(),
        val_idx=split.val.tolist(),
        test_idx=split.test.tolist(),
        front_end_state=client.model.front_end(client.split_depth).state_dict(),
    )


def finish_run(run: TrainingRun, history: list[dict], observer: TrainObserver | None = None) -> dict:
    """Evaluate the personalized clients, write their artifacts, the back-end and final metrics."""
    config, algorithm = run.config, run.federation.algorithm
    server = run.federation.server
    served = BackendWithSlots(run.backend.eval(), server.slot_table.tokens) if algorithm.uses_split else None
    images, labels = run.dataset.images, run.dataset.labels
    replay = collect_replay(run.clients, config.seed) if algorithm.uses_split else None
    if algorithm.exit_rule == "slot_margin":
        gate_clients(
            run.clients, run.backend, server.slot_table.tokens, replay, algorithm.config.calibration_target
        )
    setting = EvaluationSetting(images, labels, run.partition, config.seed, algorithm.exit_rule)
    results = evaluate_clients(run.clients, served, setting, replay, observer)
    for client in run.clients:
        save_client(run.run_path, client_artifact(client, run.partition.clients[client.client_id]))
    results["thresholds"] = {c.name: c.threshold for c in run.clients}
    return finish_server(run, history, results, replay, max(c.max_releases for c in run.clients))


def evaluate_clients(
    clients: list[Client],
    served: BackendWithSlots | None,
    setting: EvaluationSetting,
    replay: torch.Tensor | None,
    observer: TrainObserver | None = None,
) -> dict:
    """The final evaluation of personalized, calibrated clients, and the observer's look at the same
    answers (its own measurements share them)."""
    answers = client_answers(clients, served, setting.images)
    results = evaluate(clients, served, setting, answers)
    if observer is not None:
        observer.after_evaluate(
            clients, served, setting.images, setting.labels, setting.partition, results,
            setting.exit_rule, answers, replay,
        )  # fmt: skip
    return results  # the answers (every evaluated image's features) are freed here


def gate_clients(
    clients: list[Client], backend: Backend, slot_tokens: list[bytes], replay: torch.Tensor, target: float
) -> None:
    """The slot_margin rule's last step: the server makes its slot prototypes from its back-end and
    the replay set, and each phone, knowing its own slots, calibrates its threshold on them."""
    for client, gate in zip(clients, slot_gates(backend.eval(), slot_tokens, replay, clients), strict=True):
        client.slot_gate = gate
        calibrate_client(client, target, "slot_margin")


def finish_server(
    run: TrainingRun, history: list[dict], results: dict, replay: torch.Tensor | None, max_releases: int
) -> dict:
    """Server side: the back-end with its slot table and replay set (federation/replay.py), run.json
    with the privacy account, and the final metrics the clients' evaluation gave."""
    config, server = run.config, run.federation.server
    version = model_version(run.backend, config.algorithm)
    num_classes = run.dataset.num_classes
    slot_table = server.slot_table if server is not None else SlotTable(run.label_epoch, num_classes)
    save_backend(
        run.run_path / "backend.pt",
        run.backend,
        run.projection,
        version,
        run.dataset.class_names,
        slot_table,
        replay,
    )
    privacy = privacy_report(config, max_releases, num_classes)
    write_run_info(run.run_path, run.info.model_copy(update={"model_version": version, "privacy": privacy}))
    results["privacy"] = privacy
    results["train_seconds"] = time.perf_counter() - run.started
    results["rounds"] = len(history)
    return results


def write_final_metrics(run: TrainingRun, results: dict) -> dict:
    with open_private(run.run_path / "final_metrics.json", "w") as out:
        json.dump(results, out, indent=2)
    return results


def train_rounds(
    run: TrainingRun, turns: ClientTurns | None = None, show_progress: bool = False
) -> list[dict]:
    """The run's rounds, its clients' turns in this process or behind `turns` (Flower)."""
    config = run.config
    clients_per_round = config.clients_per_round or len(run.client_tiers)
    return run_rounds(
        run.federation,
        config.rounds,
        clients_per_round,
        config.seed,
        run.run_path,
        show_progress=show_progress,
        turns=turns,
    )


def train(
    config: TrainConfig, run_path: Path, show_progress: bool = True, observer: TrainObserver | None = None
) -> dict:
    """Train, personalize, calibrate, evaluate and write the run directory; returns final metrics."""
    run = start_run(config, run_path, observer=observer)
    history = train_rounds(run, show_progress=show_progress)
    # final personalization from the meta-weights on each client's own data, then tau calibration
    for index, client in enumerate(run.clients):
        run.federation.broadcast(client)
        generator = seed_turn(config.seed, personalization_round(config.rounds), index)
        run.federation.algorithm.personalize(client, run.federation.server, generator)
    return write_final_metrics(run, finish_run(run, history, observer))


def summary_rows(results: dict) -> list[tuple[str, str]]:
    s, mean = results["summary"], results["mean"]
    rows = [
        ("accuracy without OOD (p=0)", f"{s['accuracy_without_ood']:.3f}"),
        ("accuracy with OOD (mean p=0.2, 0.5)", f"{s['accuracy_with_ood']:.3f}"),
        ("exit-only accuracy with OOD", f"{s['exit_only_accuracy_with_ood']:.3f}"),
    ]
    for key in ("exit_rate", "fallback_rate", "server_fallback_accuracy"):
        if key in mean["p=0.5"]:
            rows.append((f"{key.replace('_', ' ')} (p=0.5)", f"{mean['p=0.5'][key]:.3f}"))
    if "alignment_score" in s:
        rows.append(("alignment score (cross-family kNN)", f"{s['alignment_score']:.3f}"))
    privacy = results.get("privacy", {})
    if privacy.get("label_dp_epsilon") is not None:
        rows.append(("label DP (randomized response)", f"epsilon {privacy['label_dp_epsilon']:g} per row"))
    features = privacy.get("features", {})
    if features.get("epsilon") is not None:
        rows.append(
            (
                "feature DP (clip + Gaussian, RDP)",
                f"epsilon {features['epsilon']:.2f} at delta {features['delta']:g}",
            )
        )
    rows.append(("wall time", f"{results['train_seconds']:.0f} s"))
    return rows
