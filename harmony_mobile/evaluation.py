"""How well phones answer: accuracy without and with OOD samples, exit and fallback rates, the
server's fallback accuracy, and how aligned the back-end's features are across families.

This is the experimenter's harness: it reads true labels to score predictions. It is not server
code and nothing here is sent anywhere. The back-end answers in slots; each phone turns a slot into
a class with its own federation secret (`Client.slot_to_class`), as a deployed phone does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from harmony_mobile.algorithms.base import exit_confidence
from harmony_mobile.data.partition import Partition, ood_test_indices
from harmony_mobile.federation.client import Client
from harmony_mobile.models import Backend

OOD_FRACTIONS = (0.0, 0.2, 0.5)


@dataclass
class BackendWithSlots:
    """What the server serves: g and its slot table (the label tokens of its slots, in order)."""

    backend: Backend
    slot_tokens: list[bytes]

    def slot_scores(self, features: torch.Tensor) -> torch.Tensor:
        return self.backend(features)[:, : len(self.slot_tokens)]


def nan_mean(values: list[float]) -> float:
    """Mean over the defined values (NaN = undefined, e.g. an OOD rate at p=0); NaN if none is defined."""
    defined = [v for v in values if not np.isnan(v)]
    return float(np.mean(defined)) if defined else float("nan")


def decode_slots(slot_scores: torch.Tensor, slot_class: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """The class of each row's top slot (`slot_class`: class id per slot, -1 = none of the phone's
    classes); where the top slot has no class, the phone keeps its local answer."""
    if slot_scores.shape[1] == 0:
        return local.clone()
    decoded = slot_class[slot_scores.argmax(dim=1)]
    return torch.where(decoded >= 0, decoded, local)


class SplitAnswers(NamedTuple):
    """A phone's two answers for a batch: its exit's, and the server's top slot as a class."""

    exit_logits: torch.Tensor
    features: torch.Tensor  # what the phone would send: the front-end's output at its split depth
    exit_prediction: torch.Tensor
    server_prediction: torch.Tensor


@torch.no_grad()
def split_answers(client: Client, backend: BackendWithSlots, images: torch.Tensor) -> SplitAnswers:
    """The exit's answer and the class of the server's top slot (decoded with the phone's secret;
    a slot with no class of the phone: the exit's answer), for every image."""
    exit_logits, features = client.model(images, client.split_depth)
    exit_prediction = exit_logits.argmax(dim=1)
    slot_class = client.slot_to_class(backend.slot_tokens)
    server_prediction = decode_slots(backend.slot_scores(features), slot_class, exit_prediction)
    return SplitAnswers(exit_logits, features, exit_prediction, server_prediction)


@torch.no_grad()
def predict(
    client: Client, backend: BackendWithSlots | None, images: torch.Tensor, exit_rule: str = "max_softmax"
) -> dict[str, torch.Tensor]:
    """What the phone answers: its exit when confident, else the class of the server's top slot
    (`split_answers`).

    Without a back-end (no-split baselines) the full local model answers everything."""
    if backend is None:
        local = client.model.classify_full(images).argmax(dim=1)
        return {
            "prediction": local,
            "exits": torch.ones(len(images), dtype=torch.bool),
            "exit_prediction": local,
        }
    answers = split_answers(client, backend, images)
    exits = exit_confidence(answers.exit_logits, exit_rule) >= client.threshold
    return {
        "prediction": torch.where(exits, answers.exit_prediction, answers.server_prediction),
        "exits": exits,
        "exit_prediction": answers.exit_prediction,
        "server_prediction": answers.server_prediction,
    }


@dataclass(frozen=True)
class EvaluationSetting:
    """What every client is scored on: the test images and labels, the partition (each client's
    test split and the OOD pool), the seed of the OOD draws, the exit rule of the method's gate and
    the OOD fractions reported."""

    images: torch.Tensor
    labels: torch.Tensor
    partition: Partition
    seed: int
    exit_rule: str = "max_softmax"
    ood_fractions: tuple[float, ...] = OOD_FRACTIONS


def evaluate_client(
    client: Client, backend: BackendWithSlots | None, setting: EvaluationSetting, p: float
) -> dict[str, float]:
    """One client's metrics on its ID test samples mixed with OOD ones at fraction `p`."""
    images, labels, partition = setting.images, setting.labels, setting.partition
    split = partition.clients[client.client_id]
    if not np.isin(labels.numpy()[partition.ood_pool], split.classes, invert=True).any():
        p = 0.0  # the client holds every class (e.g. Dirichlet alpha 0.5): it has no OOD samples
    index, is_ood = ood_test_indices(split, labels.numpy(), partition.ood_pool, p, setting.seed)
    y = client.exit_labels(labels[index])  # the phone answers in exit indices (token order)
    out = predict(client, backend, images[index], setting.exit_rule)
    fallback = ~out["exits"]
    metrics = {
        "accuracy": (out["prediction"] == y).float().mean().item(),
        "exit_only_accuracy": (out["exit_prediction"] == y).float().mean().item(),
        "exit_rate": out["exits"].float().mean().item(),
        "fallback_rate": fallback.float().mean().item(),
        "ood_fallback_rate": fallback[torch.from_numpy(is_ood)].float().mean().item()
        if is_ood.any()
        else float("nan"),
    }
    if "server_prediction" in out:
        server_correct = out["server_prediction"] == y
        metrics["server_accuracy"] = server_correct.float().mean().item()
        metrics["server_fallback_accuracy"] = (
            server_correct[fallback].float().mean().item() if fallback.any() else float("nan")
        )
    return metrics


@torch.no_grad()
def alignment_score(
    clients: list[Client], backend: Backend, images, labels, partition: Partition, k: int = 5
) -> float:
    """kNN accuracy of back-end features across families: for each family, a kNN classifier fit on
    the other families' features of their ID test samples predicts this family's samples. High when
    same-class features of different extractors land together in the server's space."""
    from sklearn.neighbors import KNeighborsClassifier  # seconds of import a training-only process skips

    features, classes, families = [], [], []
    for client in clients:
        index = partition.clients[client.client_id].test
        _, z = client.model(images[index], client.split_depth)
        features.append(backend.features(z).numpy())
        classes.append(client.exit_labels(labels[index]).numpy())
        families += [client.tier.family] * len(index)
    features, classes, families = np.concatenate(features), np.concatenate(classes), np.array(families)
    scores = []
    for family in np.unique(families):
        mine = families == family
        if mine.all() or (~mine).sum() < k:
            continue
        knn = KNeighborsClassifier(n_neighbors=k).fit(features[~mine], classes[~mine])
        scores.append(knn.score(features[mine], classes[mine]))
    return float(np.mean(scores)) if scores else float("nan")


def evaluate(clients: list[Client], backend: BackendWithSlots | None, setting: EvaluationSetting) -> dict:
    """Per client and mean metrics for every OOD fraction, plus the alignment score."""
    per_client = {client.name: evaluate_client_at(client, backend, setting) for client in clients}
    results = summarize(per_client, setting.ood_fractions)
    if backend is not None:
        summary = results["summary"]
        summary["alignment_score"] = alignment_score(
            clients, backend.backend, setting.images, setting.labels, setting.partition
        )
    return results


def evaluate_client_at(
    client: Client, backend: BackendWithSlots | None, setting: EvaluationSetting
) -> dict[str, dict[str, float]]:
    """One client's metrics at every OOD fraction (what a client reports in federated evaluation)."""
    return {f"p={p:g}": evaluate_client(client, backend, setting, p) for p in setting.ood_fractions}


def summarize(per_client: dict[str, dict], ood_fractions: tuple[float, ...] = OOD_FRACTIONS) -> dict:
    """Means over clients of their reports, and the summary numbers."""
    names = sorted(per_client)
    mean = {}
    for p in ood_fractions:
        rows = [per_client[name][f"p={p:g}"] for name in names]
        mean[f"p={p:g}"] = {key: nan_mean([r[key] for r in rows]) for key in rows[0]}
    summary = {
        "accuracy_without_ood": mean["p=0"]["accuracy"] if "p=0" in mean else float("nan"),
        "accuracy_with_ood": float(np.mean([mean[f"p={p:g}"]["accuracy"] for p in ood_fractions if p > 0])),
        "exit_only_accuracy_with_ood": float(
            np.mean([mean[f"p={p:g}"]["exit_only_accuracy"] for p in ood_fractions if p > 0])
        ),
    }
    return {"summary": summary, "mean": mean, "per_client": per_client}
