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

from harmony_mobile.algorithms.base import exit_score
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
        return _local_only(client.model.classify_full(images).argmax(dim=1))
    return _route(client, split_answers(client, backend, images), exit_rule)


class ClientAnswers:
    """One client's answers (`predict`) to images of the data set, each image computed once however
    many evaluations ask for it: the test mixes at every OOD fraction, validation, the unseen
    classes and the gate study draw overlapping samples. The models hold no dropout or batch-norm
    state, so an image's answer does not depend on the batch it is computed in, up to float
    rounding (a convolution may sum in another order for another batch size)."""

    def __init__(self, client: Client, backend: BackendWithSlots | None, images):
        self.client, self.backend, self.images = client, backend, images
        self._row_of: dict[int, int] = {}  # image index -> row of the computed answers
        self._rows: tuple[torch.Tensor, ...] | None = None

    @torch.no_grad()
    def _answer(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.backend is None:
            return (self.client.model.classify_full(images).argmax(dim=1),)
        return tuple(split_answers(self.client, self.backend, images))

    def _gather(self, index) -> tuple[torch.Tensor, ...]:
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        missing = [int(i) for i in np.unique(index) if int(i) not in self._row_of]
        if missing or self._rows is None:  # the first request computes, even an empty one
            self._row_of.update({i: len(self._row_of) + k for k, i in enumerate(missing)})
            new = self._answer(self.images[np.asarray(missing, dtype=np.int64)])
            known = self._rows or tuple(column[:0] for column in new)
            # one copy of the answers: the parts are not kept beside their concatenation
            self._rows = tuple(torch.cat(pair) for pair in zip(known, new, strict=True))
        rows = torch.as_tensor([self._row_of[int(i)] for i in index], dtype=torch.long)
        return tuple(column[rows] for column in self._rows)

    def split(self, index) -> SplitAnswers:
        """`split_answers` for the images at `index` (split methods only)."""
        if self.backend is None:
            raise ValueError("a method without a back-end has no split answers")
        return SplitAnswers(*self._gather(index))

    def predict(self, index, exit_rule: str = "max_softmax") -> dict[str, torch.Tensor]:
        """`predict` for the images at `index`."""
        if self.backend is None:
            return _local_only(*self._gather(index))
        return _route(self.client, self.split(index), exit_rule)


def _local_only(local: torch.Tensor) -> dict[str, torch.Tensor]:
    """A method without a back-end: its full model answers every sample."""
    return {"prediction": local, "exits": torch.ones(len(local), dtype=torch.bool), "exit_prediction": local}


def _route(client: Client, answers: SplitAnswers, exit_rule: str) -> dict[str, torch.Tensor]:
    """The exit's answer where it is confident, the server's elsewhere."""
    exits = exit_score(client, answers.exit_logits, answers.features, exit_rule) >= client.threshold
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
    client: Client,
    backend: BackendWithSlots | None,
    setting: EvaluationSetting,
    p: float,
    answers: ClientAnswers | None = None,
) -> dict[str, float]:
    """One client's metrics on its ID test samples mixed with OOD ones at fraction `p` (`answers`:
    the client's, when other evaluations read them too)."""
    images, labels, partition = setting.images, setting.labels, setting.partition
    split = partition.clients[client.client_id]
    if not np.isin(labels.numpy()[partition.ood_pool], split.classes, invert=True).any():
        p = 0.0  # the client holds every class (e.g. Dirichlet alpha 0.5): it has no OOD samples
    index, is_ood = ood_test_indices(split, labels.numpy(), partition.ood_pool, p, setting.seed)
    y = client.exit_labels(labels[index])  # the phone answers in exit indices (token order)
    answers = answers or ClientAnswers(client, backend, images)
    out = answers.predict(index, setting.exit_rule)
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
    answers: dict[int, ClientAnswers], backend: Backend, labels, partition: Partition, k: int = 5
) -> float:
    """kNN accuracy of back-end features across families: for each family, a kNN classifier fit on
    the other families' features of their ID test samples predicts this family's samples. High when
    same-class features of different extractors land together in the server's space."""
    from sklearn.neighbors import KNeighborsClassifier  # seconds of import a training-only process skips

    features, classes, families = [], [], []
    for client_answers in answers.values():
        client = client_answers.client
        index = partition.clients[client.client_id].test
        features.append(backend.features(client_answers.split(index).features).numpy())
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


def client_answers(
    clients: list[Client], backend: BackendWithSlots | None, images
) -> dict[int, ClientAnswers]:
    """Every client's answer cache, by client id: what `evaluate` and the benchmark's own
    measurements share."""
    return {client.client_id: ClientAnswers(client, backend, images) for client in clients}


def evaluate(
    clients: list[Client],
    backend: BackendWithSlots | None,
    setting: EvaluationSetting,
    answers: dict[int, ClientAnswers] | None = None,
) -> dict:
    """Per client and mean metrics for every OOD fraction, plus the alignment score."""
    answers = answers or client_answers(clients, backend, setting.images)
    per_client = {
        client.name: evaluate_client_at(client, backend, setting, answers[client.client_id])
        for client in clients
    }
    results = summarize(per_client, setting.ood_fractions)
    if backend is not None:
        summary = results["summary"]
        summary["alignment_score"] = alignment_score(
            answers, backend.backend, setting.labels, setting.partition
        )
    return results


def evaluate_client_at(
    client: Client,
    backend: BackendWithSlots | None,
    setting: EvaluationSetting,
    answers: ClientAnswers | None = None,
) -> dict[str, dict[str, float]]:
    """One client's metrics at every OOD fraction (what a client reports in federated evaluation)."""
    answers = answers or ClientAnswers(client, backend, setting.images)
    if answers.client is not client or answers.backend is not backend:
        raise ValueError(f"the answers given are not {client.name}'s with this back-end")
    return {f"p={p:g}": evaluate_client(client, backend, setting, p, answers) for p in setting.ood_fractions}


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
