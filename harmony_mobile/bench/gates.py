"""The exit gate measured as a curve: a phone's accuracy against the share of its samples it sends
to the server, for several confidence scores (docs/ALGORITHM.md, "The exit gate").

A calibrated threshold is one point on such a curve; the curve says what any threshold would give,
so methods compare at equal fallback rates instead of at whatever rate their calibration landed.
Each point falls back the lowest-scoring share of a client's samples (ID test samples mixed with
OOD ones at fraction p); the curve is the mean over clients. Beside it: the score's OOD-detection
AUROC, an oracle gate (exactly the OOD samples fall back) and the server answering everything.

Every score is computed on the phone from what it holds: its exit logits; for `prototype` the
mean feature of each of its own exits over its own training samples (no label leaves the phone);
for `slot_margin` the server's slot prototypes (federation/slot_gate.py: made from the back-end and
its label-free replay set) and which slots are the phone's own (its secret decodes them).
This is the experimenter's harness: it reads true labels to score answers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import rankdata

from harmony_mobile.algorithms.base import exit_confidence
from harmony_mobile.data.partition import ClientSplit, Partition, ood_test_indices
from harmony_mobile.evaluation import BackendWithSlots, ClientAnswers
from harmony_mobile.federation.slot_gate import SlotGate, slot_gates

GATE_SCORES = ("max_softmax", "neg_entropy", "energy", "prototype", "slot_margin")
FALLBACK_GRID = tuple(round(0.05 * i, 2) for i in range(21))
GATE_OOD_FRACTIONS = (0.2, 0.5)


@torch.no_grad()
def own_prototypes(client, batch: int = 512) -> torch.Tensor:
    """Unit-norm mean feature z of each exit over the client's training samples (rows of exits
    it never saw stay zero, so they never match)."""
    sums = None
    for start in range(0, len(client.train_y), batch):
        _, z = client.model(client.train_x[start : start + batch], client.split_depth)
        z = F.normalize(z.flatten(1), dim=1)
        if sums is None:
            sums = torch.zeros(client.model.num_classes, z.shape[1])
        sums.index_add_(0, client.train_y[start : start + batch], z)
    return F.normalize(sums, dim=1)


@dataclass
class PhonePrototypes:
    """What a phone's prototype scores compare its features with: its own exits' mean features,
    and (when the run has a replay set) the slot gate the server's prototypes give it."""

    own: torch.Tensor
    slot_gate: SlotGate | None = None


def gate_scores(exit_logits: torch.Tensor, features: torch.Tensor, prototypes: PhonePrototypes) -> dict:
    """Higher = the phone is surer the sample is one of its own classes, answered right."""
    scores = {rule: exit_confidence(exit_logits, rule) for rule in ("max_softmax", "neg_entropy")}
    scores["energy"] = torch.logsumexp(exit_logits, dim=1)
    scores["prototype"] = (F.normalize(features.flatten(1), dim=1) @ prototypes.own.T).amax(dim=1)
    if prototypes.slot_gate is not None:
        scores["slot_margin"] = prototypes.slot_gate.score(features)
    return {name: value.numpy() for name, value in scores.items()}


def accuracy_curve(score: np.ndarray, exit_correct: np.ndarray, server_correct: np.ndarray) -> list[float]:
    """Accuracy when the lowest-scoring share r of the samples falls back, for r in FALLBACK_GRID."""
    order = np.argsort(score, kind="stable")
    curve = []
    for rate in FALLBACK_GRID:
        fallback = np.zeros(len(score), dtype=bool)
        fallback[order[: round(rate * len(score))]] = True
        curve.append(float(np.where(fallback, server_correct, exit_correct).mean()))
    return curve


def ood_auroc(score: np.ndarray, is_ood: np.ndarray) -> float:
    """P(an ID sample scores above an OOD sample), ties counted half: the gate's OOD detection."""
    if is_ood.all() or not is_ood.any():
        return float("nan")
    ranks = rankdata(score)  # ties get their average rank
    n_id, n_ood = int((~is_ood).sum()), int(is_ood.sum())
    return float((ranks[~is_ood].sum() - n_id * (n_id + 1) / 2) / (n_id * n_ood))


@torch.no_grad()
def client_gate_study(
    client_answers: ClientAnswers, labels, index: np.ndarray, is_ood: np.ndarray, prototypes: PhonePrototypes
) -> dict:
    """One client's curves, AUROCs, oracle and server-only accuracy on the samples `index`."""
    truth = client_answers.client.exit_labels(labels[index])
    answers = client_answers.split(index)
    exit_correct = (answers.exit_prediction == truth).numpy()
    server_correct = (answers.server_prediction == truth).numpy()
    scores = gate_scores(answers.exit_logits, answers.features, prototypes)
    return {
        "curve": {name: accuracy_curve(s, exit_correct, server_correct) for name, s in scores.items()},
        "auroc": {name: ood_auroc(s, is_ood) for name, s in scores.items()},
        "oracle": float(np.where(is_ood, server_correct, exit_correct).mean()),
        "server_only": float(server_correct.mean()),
    }


def gate_studies(
    answers: dict[int, ClientAnswers],
    backend: BackendWithSlots | None,
    labels,
    partition: Partition,
    seed: int,
    exit_rule: str,
    replay: torch.Tensor | None = None,
) -> dict:
    """`gate_study` on test and on validation, each client's prototypes computed once for both,
    and the score the method exits by (what its report curve is read for). `replay`: the run's
    replay set, from which the server makes the slot prototypes (none: no `slot_margin`)."""
    if backend is None:
        return {}
    clients = [a.client for a in answers.values()]
    gates = [None] * len(clients)
    if replay is not None and len(replay):
        gates = slot_gates(backend.backend, backend.slot_tokens, replay, clients)
    prototypes = {
        i: PhonePrototypes(own_prototypes(c), g) for i, c, g in zip(answers, clients, gates, strict=True)
    }
    args = (answers, labels, partition, seed, prototypes)
    return {"test": gate_study(*args, on="test"), "val": gate_study(*args, on="val"), "exit_rule": exit_rule}


def gate_study(
    answers: dict[int, ClientAnswers],
    labels,
    partition: Partition,
    seed: int,
    prototypes: dict,
    on: str = "test",
) -> dict:
    """Mean over clients of `client_gate_study` at each OOD fraction, on the clients' ID test
    samples with OOD from the test pool (`on="test"`) or on validation only (`on="val"`: each
    client's val split with OOD from the other clients' val splits), which is where a gate is picked.
    `prototypes`: each client's `PhonePrototypes`, by client id."""
    label_array = labels.numpy()
    pool = partition.ood_pool
    if on == "val":
        pool = np.unique(np.concatenate([np.asarray(s.val, dtype=np.int64) for s in partition.clients]))
    study = {"fallback_grid": list(FALLBACK_GRID)}
    for p in GATE_OOD_FRACTIONS:
        rows = []
        for client_id, client_answers in answers.items():
            split = partition.clients[client_id]
            if on == "val":
                classes = tuple(client_answers.client.classes)
                split = ClientSplit(client_id, classes, split.val, split.val, split.val)
            try:
                index, is_ood = ood_test_indices(split, label_array, pool, p, seed)
            except ValueError:  # the client holds every class: no OOD sample exists for it
                continue
            prototype = prototypes[client_id]
            rows.append(client_gate_study(client_answers, labels, index, is_ood, prototype))
        study[f"p={p:g}"] = _mean_rows(rows)
    return study


def _mean_rows(rows: list[dict]) -> dict:
    if not rows:
        return {}
    names = rows[0]["curve"]
    return {
        "curve": {n: np.mean([r["curve"][n] for r in rows], axis=0).round(5).tolist() for n in names},
        "auroc": {n: float(np.nanmean([r["auroc"][n] for r in rows])) for n in names},
        "oracle": float(np.mean([r["oracle"] for r in rows])),
        "server_only": float(np.mean([r["server_only"] for r in rows])),
        "clients": len(rows),
    }
