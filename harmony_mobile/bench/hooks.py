"""What a benchmark run measures beyond `training.train`'s own metrics, taken while it runs:

- uplink bytes: everything a phone sends during training (feature uploads with their label
  tokens and split depths, dL/dlogits where a method still sends them, model updates, raw data for
  `centralized`), counted on the message objects as they cross the boundary;
- validation metrics (every method): the clients' val splits mixed with OOD samples taken from
  *other clients' val splits*, never from the test split or the OOD pool; tuning looks only at
  these;
- the accuracy on classes a client, or its whole model family, never holds locally: the server's
  answer for split methods (what a fallback can at best return), the full model's otherwise;
- per-tier exit/fallback rates (for the latency trade-off).

The last three are computed on the live clients right after training evaluates them
(`BenchObserver.after_evaluate`; forward passes only: the models have no dropout or batch-norm
state, so nothing that training does afterwards changes).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from harmony_mobile import training
from harmony_mobile.bench.gates import gate_studies
from harmony_mobile.data.partition import ClientSplit, Partition, ood_test_indices
from harmony_mobile.evaluation import ClientAnswers, client_answers
from harmony_mobile.run_dir import SECRET_FILE, write_federation_secret

LABEL_BYTES = 8  # a token is trunc64(HMAC): 8 bytes; SplitGP's original int64 label is 8 bytes too
DEPTH_BYTES = 1
VALIDATION_OOD_FRACTIONS = (0.0, 0.2, 0.5)
UNSEEN_SAMPLES_PER_CLIENT = 300  # cap on OOD-pool samples scored per client (evaluation time)


@dataclass
class UplinkCounter:
    feature_bytes: int = 0  # interface features
    label_bytes: int = 0  # label tokens (HARMONY) or the labels they stand in for (SplitGP, multi-exit)
    depth_bytes: int = 0
    gradient_bytes: int = 0  # dL/dlogits of a U-shaped split, where a method sends them
    update_bytes: int = 0  # model updates (ClientUpdate weights)
    raw_data_bytes: int = 0  # `centralized`: the raw training data, once
    prototype_bytes: int = 0  # `fedproto`: per-class feature means
    uploaded_rows: int = 0

    def total(self) -> int:
        return sum(v for k, v in self.__dict__.items() if k.endswith("_bytes"))

    def as_dict(self) -> dict[str, int]:
        return {**self.__dict__, "total": self.total()}


@dataclass
class RunExtras:
    """Filled by `BenchObserver` when training evaluates its clients."""

    validation: dict = field(default_factory=dict)
    unseen: dict = field(default_factory=dict)
    per_tier: dict = field(default_factory=dict)
    gates: dict = field(default_factory=dict)  # bench/gates.py: curves on test and on validation


def _count_upload(counter: UplinkCounter, upload) -> None:
    counter.feature_bytes += upload.features.nbytes
    counter.label_bytes += LABEL_BYTES * len(upload.label_tokens)
    counter.depth_bytes += DEPTH_BYTES * len(upload.split_depths)
    counter.uploaded_rows += len(upload.label_tokens)


def _count_update(counter: UplinkCounter, update) -> None:
    counter.update_bytes += sum(t.nbytes for t in update.weights.values())
    counter.raw_data_bytes += int(update.metrics.get("raw_upload_bytes", 0))
    counter.prototype_bytes += int(update.metrics.get("prototype_upload_bytes", 0))


@dataclass
class BenchObserver(training.TrainObserver):
    """Subscribes to a training run's messages and final evaluation (training.TrainObserver):
    counts every client -> server message and records the extra metrics."""

    counter: UplinkCounter
    extras: RunExtras
    seed: int

    def lineage(self, run_path: Path) -> tuple[bytes, str] | None:
        """A benchmark run's federation secret and label epoch follow from its seed (a phone's
        would be random): the same run gives the same tokens, so the same numbers, serial or
        parallel, first try or resumed."""
        if (run_path / "run.json").is_file() or (run_path / SECRET_FILE).is_file():
            return None  # the run's own lineage, kept on resume
        secret = hashlib.sha256(f"harmony-bench/federation-secret/{self.seed}".encode()).digest()
        write_federation_secret(run_path, secret)
        return secret, f"e-bench-{self.seed}"

    def watch(self, federation) -> None:
        if federation.server is not None:
            federation.server.upload_listeners.append(lambda upload: _count_upload(self.counter, upload))
        federation.update_listeners.append(lambda update: _count_update(self.counter, update))

    def after_evaluate(
        self,
        clients,
        served,
        images,
        labels,
        partition,
        results: dict,
        exit_rule: str,
        answers: dict[int, ClientAnswers] | None = None,
        replay: torch.Tensor | None = None,
    ) -> None:
        answers = answers or client_answers(clients, served, images)
        self.extras.validation = validation_metrics(answers, labels, partition, self.seed, exit_rule)
        self.extras.unseen = unseen_class_accuracy(answers, labels, partition, self.seed)
        self.extras.per_tier = per_tier_rates(clients, results)
        self.extras.gates = gate_studies(answers, served, labels, partition, self.seed, exit_rule, replay)


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


@torch.no_grad()
def validation_metrics(
    answers: dict[int, ClientAnswers], labels, partition: Partition, seed: int, exit_rule: str
) -> dict:
    """Accuracy of the phones' answers on validation data only: each client's ID val split plus OOD
    samples from the other clients' val splits (classes outside its own), at fractions p."""
    label_array = labels.numpy()
    all_val = np.unique(np.concatenate([np.asarray(s.val, dtype=np.int64) for s in partition.clients]))
    per_p: dict[str, list[float]] = {f"p={p:g}": [] for p in VALIDATION_OOD_FRACTIONS}
    fallback: dict[str, list[float]] = {f"p={p:g}": [] for p in VALIDATION_OOD_FRACTIONS}
    for mine in answers.values():
        client = mine.client
        own = np.asarray(partition.clients[client.client_id].val, dtype=np.int64)
        if len(own) == 0:
            continue
        split = ClientSplit(client.client_id, tuple(client.classes), own, own, own)
        for p in VALIDATION_OOD_FRACTIONS:
            try:
                index, _ = ood_test_indices(split, label_array, all_val, p, seed)
            except ValueError:  # no other client holds a class this one lacks
                continue
            out = mine.predict(index, exit_rule)
            truth = client.exit_labels(labels[index])
            per_p[f"p={p:g}"].append((out["prediction"] == truth).float().mean().item())
            fallback[f"p={p:g}"].append((~out["exits"]).float().mean().item())
    accuracy = {k: _mean(v) for k, v in per_p.items()}
    with_ood = [accuracy[k] for k in accuracy if k != "p=0" and not np.isnan(accuracy[k])]
    return {
        "accuracy": accuracy,
        "fallback_rate": {k: _mean(v) for k, v in fallback.items()},
        "accuracy_without_ood": accuracy["p=0"],
        "accuracy_with_ood": _mean(with_ood),
    }


def _unseen_accuracy(answers: ClientAnswers, labels, pool: np.ndarray, classes, seed: int) -> float:
    """Accuracy on up to UNSEEN_SAMPLES_PER_CLIENT pool samples of `classes`: the server's answer
    through the client's front-end (split methods, decoded as the phone decodes it), the full
    model's otherwise."""
    candidates = pool[np.isin(labels.numpy()[pool], list(classes))]
    if len(candidates) == 0:
        return float("nan")
    client = answers.client
    rng = np.random.default_rng((seed, client.client_id, 7))
    chosen = np.sort(rng.choice(candidates, min(len(candidates), UNSEEN_SAMPLES_PER_CLIENT), replace=False))
    out = answers.predict(chosen)
    prediction = out.get("server_prediction", out["prediction"])
    return (prediction == client.exit_labels(labels[chosen])).float().mean().item()


@torch.no_grad()
def unseen_class_accuracy(answers: dict[int, ClientAnswers], labels, partition: Partition, seed: int) -> dict:
    """Per family: the accuracy on the classes no client of that family holds (the server's, for
    split methods: what every fallback of an OOD query needs), from each of the family's clients;
    and the mean over clients on the classes the client itself does not hold. Samples come from
    the OOD pool (held out from every client)."""
    num_classes = int(labels.max()) + 1
    pool = np.asarray(partition.ood_pool, dtype=np.int64)
    clients = [a.client for a in answers.values()]
    family_classes: dict[str, set[int]] = {}
    for client in clients:
        family_classes.setdefault(client.tier.family, set()).update(int(c) for c in client.classes)
    per_family: dict[str, list[float]] = {f: [] for f in family_classes}
    per_client = []
    for client in clients:
        missing = set(range(num_classes)) - family_classes[client.tier.family]
        if missing:
            per_family[client.tier.family].append(
                _unseen_accuracy(answers[client.client_id], labels, pool, missing, seed)
            )
        own_missing = set(range(num_classes)) - {int(c) for c in client.classes}
        if own_missing:
            per_client.append(_unseen_accuracy(answers[client.client_id], labels, pool, own_missing, seed))
    families = {
        family: {"accuracy": _mean(per_family[family]), "classes": sorted(set(range(num_classes)) - held)}
        for family, held in family_classes.items()
    }
    defined = [v["accuracy"] for v in families.values() if not np.isnan(v["accuracy"])]
    return {
        "family": families,
        "family_mean": _mean(defined),
        "client_mean": _mean([v for v in per_client if not np.isnan(v)]),
    }


def per_tier_rates(clients, results: dict) -> dict:
    """tier -> mean exit and fallback rate of its clients at every OOD fraction."""
    by_tier: dict[str, list[dict]] = {}
    for client in clients:
        by_tier.setdefault(client.tier.name, []).append(results["per_client"][client.name])
    rates = {}
    for tier, rows in by_tier.items():
        rates[tier] = {
            p: {key: _mean([row[p][key] for row in rows]) for key in ("exit_rate", "fallback_rate")}
            for p in rows[0]
        }
    return rates
