"""One training run per (setting, method, seed) through `harmony_mobile.training.train`, plus what
the report needs beyond train()'s own metrics:

- uplink bytes: everything a phone sends during training (feature uploads with their label
  tokens and split depths, dL/dlogits, model updates, raw data for `centralized`), counted on the
  message objects as they cross the boundary;
- validation metrics (split methods): the clients' val splits mixed with OOD samples taken from
  *other clients' val splits*, never from the test split or the OOD pool; this is what tuning
  looks at;
- a 2-D PCA of back-end features for the representation-skew plot.
"""

from __future__ import annotations

import json
import platform
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from harmony_mobile import training
from harmony_mobile.algorithms.base import exit_confidence
from harmony_mobile.algorithms.registry import build_algorithm
from harmony_mobile.bench.profile import BenchProfile, Setting
from harmony_mobile.data.partition import ClientSplit, ood_test_indices
from harmony_mobile.evaluation import decode_slots
from harmony_mobile.federation.messages import FeatureUpload
from harmony_mobile.federation.server import SplitServer
from harmony_mobile.run_dir import RunDir

LABEL_BYTES = 8  # a token is trunc64(HMAC): 8 bytes; SplitGP's original int64 label is 8 bytes too
DEPTH_BYTES = 1
RECORD = "bench.json"


@dataclass
class UplinkCounter:
    feature_bytes: int = 0  # interface features
    label_bytes: int = 0  # label tokens (HARMONY) or the labels they stand in for (SplitGP, multi-exit)
    depth_bytes: int = 0
    gradient_bytes: int = 0  # client -> server gradients: none since the split step runs in slot space
    update_bytes: int = 0  # model updates (ClientUpdate weights)
    raw_data_bytes: int = 0  # `centralized`: the raw training data, once
    uploaded_rows: int = 0

    def total(self) -> int:
        return (
            self.feature_bytes
            + self.label_bytes
            + self.depth_bytes
            + self.gradient_bytes
            + self.update_bytes
            + self.raw_data_bytes
        )

    def as_dict(self) -> dict[str, int]:
        return {**self.__dict__, "total": self.total()}


@contextmanager
def count_uplink(counter: UplinkCounter) -> Iterator[None]:
    """Count every client -> server message of the training runs inside the block.

    Wraps SplitServer.step (FeatureUpload) and the client_round of
    every algorithm that training builds (ClientUpdate), and restores them on exit."""
    step, build = SplitServer.step, training.build_algorithm

    def counted_step(server: SplitServer, upload: FeatureUpload, update: bool = True):
        counter.feature_bytes += upload.features.nbytes
        counter.label_bytes += LABEL_BYTES * len(upload.label_tokens)
        counter.depth_bytes += DEPTH_BYTES * len(upload.split_depths)
        counter.uploaded_rows += len(upload.label_tokens)
        return step(server, upload, update)

    def counted_build(name, config=None):
        algorithm = build(name, config)
        client_round = algorithm.client_round

        def counted_round(*args, **kwargs):
            update = client_round(*args, **kwargs)
            counter.update_bytes += sum(t.nbytes for t in update.weights.values())
            counter.raw_data_bytes += int(update.metrics.get("raw_upload_bytes", 0))
            return update

        algorithm.client_round = counted_round
        return algorithm

    SplitServer.step = counted_step
    training.build_algorithm = counted_build
    try:
        yield
    finally:
        SplitServer.step = step
        training.build_algorithm = build


def train_config(profile: BenchProfile, setting: Setting, method: str, seed: int, data_root: str | None):
    return training.TrainConfig(
        dataset=setting.dataset,
        data_root=data_root,
        dataset_limit=setting.dataset_limit,
        partition=setting.partition,
        alpha=setting.alpha,
        rounds=profile.budget.rounds,
        seed=seed,
        algorithm=method,
        algorithm_config=profile.method_config(method),
        **{"threads": 1, **profile.train},
    )


def run_one(
    profile: BenchProfile,
    setting: Setting,
    method: str,
    seed: int,
    work_dir: Path,
    data_root: str | None = None,
    resume: bool = False,
) -> dict:
    """Train one (setting, method, seed) and return its record (also written to RUN/bench.json)."""
    config = train_config(profile, setting, method, seed, data_root)
    run_path = Path(work_dir) / setting.name / method / f"seed-{seed}"
    record_file = run_path / RECORD
    if resume and record_file.is_file():
        record = json.loads(record_file.read_text())
        if record.get("train_config") == config.model_dump():
            return record
    if run_path.exists():
        shutil.rmtree(run_path)
    counter = UplinkCounter()
    started = time.perf_counter()
    with count_uplink(counter):
        results = training.train(config, run_path, show_progress=False)
    wall = time.perf_counter() - started
    run = RunDir(run_path)
    clients = run.clients()
    train_samples = sum(len(c.train_idx) for c in clients)
    algorithm = build_algorithm(method, config.algorithm_config)
    record = {
        "setting": setting.name,
        "method": method,
        "seed": seed,
        "train_config": config.model_dump(),
        "wall_seconds": wall,
        "summary": results["summary"],
        "mean": results["mean"],
        "uplink": counter.as_dict(),
        "train_samples": train_samples,
        "upload_bytes_per_sample": counter.total() / train_samples,
        "thresholds": results.get("thresholds", {}),
        "privacy": results.get("privacy", {}),  # label DP / feature DP settings and their accounting
    }
    if algorithm.uses_split:
        record["validation"] = validation_metrics(run, algorithm.exit_rule, seed)
    record_file.write_text(json.dumps(record, indent=1))
    return record


@torch.no_grad()
def validation_metrics(run: RunDir, exit_rule: str, seed: int, ood_fractions=(0.0, 0.2, 0.5)) -> dict:
    """Accuracy of the phones' answers on validation data only: each client's ID val split plus OOD
    samples from the other clients' val splits (classes outside its own), at fractions p."""
    dataset = run.dataset()
    labels = dataset.labels.numpy()
    backend = run.backend().backend
    slot_class = run.slot_to_class()
    artifacts = run.clients()
    all_val = np.unique(np.concatenate([np.asarray(c.val_idx, dtype=np.int64) for c in artifacts]))
    per_p: dict[str, list[float]] = {f"p={p:g}": [] for p in ood_fractions}
    fallback: dict[str, list[float]] = {f"p={p:g}": [] for p in ood_fractions}
    ood_fallback: list[float] = []  # fraction of OOD val samples that fall back
    ood_server: list[float] = []  # the back-end's accuracy on OOD val samples
    for artifact in artifacts:
        front_end = run.front_end(artifact)
        own = np.asarray(artifact.val_idx, dtype=np.int64)
        if len(own) == 0:
            continue
        split = ClientSplit(artifact.client_id, tuple(artifact.classes), own, own, own)
        for p in ood_fractions:
            try:
                index, _ = ood_test_indices(split, labels, all_val, p, seed)
            except ValueError:  # no other client holds a class this one lacks
                continue
            exit_logits, features = front_end(dataset.images[index])
            exits = exit_confidence(exit_logits, exit_rule) >= artifact.threshold
            server_prediction = decode_slots(
                backend(features)[:, : len(slot_class)], slot_class, exit_logits.argmax(1)
            )
            prediction = torch.where(exits, exit_logits.argmax(1), server_prediction)
            per_p[f"p={p:g}"].append((prediction == dataset.labels[index]).float().mean().item())
            fallback[f"p={p:g}"].append((~exits).float().mean().item())
            if p > 0:
                ood = ~np.isin(labels[index], artifact.classes)
                ood_fallback.append((~exits)[ood].float().mean().item())
                ood_server.append((server_prediction == dataset.labels[index])[ood].float().mean().item())
    accuracy = {k: float(np.mean(v)) if v else float("nan") for k, v in per_p.items()}
    with_ood = [accuracy[f"p={p:g}"] for p in ood_fractions if p > 0]
    return {
        "accuracy": accuracy,
        "fallback_rate": {k: float(np.mean(v)) if v else float("nan") for k, v in fallback.items()},
        "accuracy_without_ood": accuracy.get("p=0", float("nan")),
        "accuracy_with_ood": float(np.mean(with_ood)) if with_ood else float("nan"),
        "ood_fallback_rate": float(np.mean(ood_fallback)) if ood_fallback else float("nan"),
        "server_accuracy_on_ood": float(np.mean(ood_server)) if ood_server else float("nan"),
    }


@torch.no_grad()
def pca_projection(run_path: Path, seed: int, max_points: int = 800) -> dict:
    """Back-end penultimate features of every client's ID test samples and of its OOD test samples
    (p = 0.5 draw), projected to 2-D by PCA fitted on them. Returns points with class and family."""
    from sklearn.decomposition import PCA

    run = RunDir(run_path)
    dataset = run.dataset()
    labels = dataset.labels.numpy()
    backend = run.backend().backend
    info = run.info
    artifacts = run.clients()
    # the OOD pool is everything no client holds
    held = np.concatenate(
        [np.concatenate([c.train_idx, c.val_idx, c.test_idx]).astype(np.int64) for c in artifacts]
    )
    pool = np.setdiff1d(np.arange(len(labels)), held)
    features, classes, families, ood = [], [], [], []
    for artifact in artifacts:
        tier = info.tiers.get(artifact.tier)
        test = np.asarray(artifact.test_idx, dtype=np.int64)
        split = ClientSplit(artifact.client_id, tuple(artifact.classes), test, test, test)
        has_ood = np.isin(labels[pool], artifact.classes, invert=True).any()
        index, is_ood = ood_test_indices(split, labels, pool, 0.5 if has_ood else 0.0, seed)
        _, z = run.front_end(artifact)(dataset.images[index])
        features.append(backend.features(z).numpy())
        classes.append(labels[index])
        families += [tier.family] * len(index)
        ood.append(is_ood)
    features = np.concatenate(features)
    classes, families, ood = np.concatenate(classes), np.array(families), np.concatenate(ood)
    xy = PCA(n_components=2, random_state=0).fit_transform(features)
    keep = np.random.default_rng(seed).permutation(len(xy))[:max_points]
    keep.sort()
    return {
        "x": np.round(xy[keep, 0], 3).tolist(),
        "y": np.round(xy[keep, 1], 3).tolist(),
        "class": classes[keep].astype(int).tolist(),
        "family": families[keep].tolist(),
        "ood": ood[keep].astype(bool).tolist(),
    }


def code_version() -> dict:
    """The commit the benchmark ran on and the training files that differed from it (if any)."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=False
        ).stdout

    try:
        changed = git("status", "--porcelain", "--", "harmony_mobile").splitlines()
        return {
            "commit": git("rev-parse", "--short", "HEAD").strip(),
            "uncommitted": [line[3:] for line in changed],
        }
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "uncommitted": []}


def machine_info() -> dict:
    import os

    return {
        "code": code_version(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": 1,
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def run_benchmark(
    profile: BenchProfile,
    work_dir: Path,
    data_root: str | None = None,
    resume: bool = False,
    log: Callable[[str], None] = print,
) -> dict:
    """Every (setting, method, seed) of the profile; returns the raw results the report is written from."""
    torch.set_num_threads(1)
    started = time.perf_counter()
    machine = machine_info()
    runs = []
    total = len(profile.settings) * len(profile.methods) * len(profile.seeds)
    done = 0
    for setting in profile.settings:
        for seed in profile.seeds:  # seed-major: a partial benchmark already has every method per seed
            for method in profile.methods:
                record = run_one(profile, setting, method, seed, work_dir, data_root, resume)
                runs.append(record)
                done += 1
                val = record.get("validation", {}).get("accuracy_with_ood", float("nan"))
                log(
                    f"[{done}/{total}] {setting.name} {method} seed={seed}: "
                    f"acc p=0 {record['summary']['accuracy_without_ood']:.3f}, "
                    f"with OOD {record['summary']['accuracy_with_ood']:.3f} (val {val:.3f}), "
                    f"{record['wall_seconds']:.0f} s, total {time.perf_counter() - started:.0f} s"
                )
    projections = {}
    pca_setting = profile.pca.setting or profile.settings[0].name
    pca_seed = profile.pca.seed if profile.pca.seed is not None else profile.seeds[0]
    for method in profile.pca.methods:
        path = Path(work_dir) / pca_setting / method / f"seed-{pca_seed}"
        if (path / RECORD).is_file():
            projections[method] = pca_projection(path, pca_seed, profile.pca.max_points)
    return {
        "profile": profile.model_dump(),
        "method_configs": {m: profile.method_config(m) for m in profile.methods},
        "machine": machine,
        "total_wall_seconds": time.perf_counter() - started,
        "runs": runs,
        "projections": {"setting": pca_setting, "seed": pca_seed, "methods": projections},
    }


REPO_ROOT = Path(__file__).resolve().parents[2]


def bench(
    profile_name: str = "quick",
    out_dir: Path | None = None,
    work_dir: Path | None = None,
    data_root: str | None = None,
    resume: bool = False,
    seeds: list[int] | None = None,
    methods: list[str] | None = None,
    log: Callable[[str], None] = print,
    report_only: bool = False,
) -> Path:
    """Load a profile, run it, write the report; returns the report path. `report_only` re-renders
    the report from an earlier results.json without training.

    Defaults: report in benchmarks/results/<profile>/, runs in ~/.cache/harmony-mobile/bench/<profile>/
    (deleted and redone unless `resume`)."""
    from harmony_mobile.bench.profile import load_profile
    from harmony_mobile.bench.report import write_report

    profile = load_profile(profile_name)
    updates = {}
    if seeds:
        updates["seeds"] = seeds
    if methods:
        updates["methods"] = methods
    if updates:
        profile = BenchProfile(**{**profile.model_dump(), **updates})
    out_dir = Path(out_dir) if out_dir else REPO_ROOT / "benchmarks" / "results" / profile.name
    if report_only:  # re-render from results.json (numbers unchanged; notes from the current profile)
        results_file = out_dir / "results.json"
        if not results_file.is_file():
            raise FileNotFoundError(f"no {results_file} to re-render; run the benchmark first")
        results = json.loads(results_file.read_text())
        results["profile"]["notes"] = profile.notes
        report = write_report(results, out_dir)
        log(f"report: {report} (re-rendered from {results_file})")
        return report
    work_dir = (
        Path(work_dir) if work_dir else Path.home() / ".cache" / "harmony-mobile" / "bench" / profile.name
    )
    if work_dir.exists() and not resume:
        shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    log(
        f"benchmark {profile.name}: {len(profile.settings)} setting(s) x {len(profile.methods)} methods x "
        f"{len(profile.seeds)} seeds; runs in {work_dir}"
    )
    results = run_benchmark(profile, work_dir, data_root, resume, log)
    report = write_report(results, out_dir)
    log(f"report: {report} ({results['total_wall_seconds'] / 60:.1f} min)")
    return report
