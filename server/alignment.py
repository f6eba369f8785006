"""Alignment rounds: fine-tune g and h on stored uploads in a background thread, publish if safe.

One round (ALGORITHM.md, "Alignment rounds after deployment"):
  * open the newest stored envelopes (up to `max_rows` rows) into FeatureUpload messages; tokens
    are turned into group ids *per round_id* (tokens of different key epochs are unrelated, so
    equal bytes across epochs must not form positives);
  * hold out a fraction of rows (seeded); the current default version is the teacher and its
    predictions on the stored features are the replay targets (no labels exist server-side);
  * train a copy of (g, h): SupCon on normalize(h(g.features(z))) with token positives
    + distill_weight * KL(teacher || student) on the same replay rows;
  * publish check on the held-out rows: agreement with the teacher (the class mapping is kept)
    >= min_replay_agreement, and token purity (label-free accuracy: the share of rows whose
    prediction equals the majority prediction of their token group) not below the teacher's
    minus purity_tolerance. Pass -> publish `<parent>-r<round>`; fail -> status `rejected`.
A round that raises is `failed`; a round whose process died is marked `interrupted` on the next
start. Either way the old version keeps serving and the uploads stay untouched.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from harmony_mobile.server.metrics import ServerMetrics
from harmony_mobile.server.registry import ModelRegistry, ServedModel
from harmony_mobile.server.schemas import AlignmentParams
from harmony_mobile.server.store import Store
from harmony_mobile.server.uploads import stored_to_feature_upload

from harmony_mobile.algorithms.losses import distillation_loss, supcon_loss
from harmony_mobile.federation.messages import FeatureUpload
from harmony_mobile.privacy.label_tokens import tokens_to_groups

log = logging.getLogger("harmony_mobile.server.alignment")
PROGRESS_UPDATES = 10


class RoundCancelled(RuntimeError):
    pass


@dataclass
class RoundResult:
    backend: torch.nn.Module
    projection: torch.nn.Module
    accepted: bool
    metrics: dict[str, float | int | str]


def group_rows(uploads: list[FeatureUpload]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled features and token-group ids; groups never span two round ids (key epochs)."""
    by_round: dict[int, list[FeatureUpload]] = {}
    for upload in uploads:
        by_round.setdefault(upload.round_id, []).append(upload)
    features, groups, offset = [], [], 0
    for round_uploads in by_round.values():
        tokens = [t for u in round_uploads for t in u.label_tokens]
        ids = tokens_to_groups(tokens)
        groups.extend(i + offset for i in ids)
        offset += max(ids) + 1
        features.extend(u.features for u in round_uploads)
    return torch.cat(features).float(), torch.tensor(groups, dtype=torch.long)


def token_purity(predictions: torch.Tensor, groups: torch.Tensor) -> float:
    """Share of rows predicting the majority class of their token group (groups of one row skipped)."""
    agreeing, counted = 0, 0
    for group in groups.unique():
        members = predictions[groups == group]
        if members.numel() < 2:
            continue
        agreeing += int(torch.bincount(members).max())
        counted += members.numel()
    return agreeing / counted if counted else 1.0


def _logits(model: torch.nn.Module, features: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([model(features[i : i + chunk]) for i in range(0, len(features), chunk)])


def run_alignment(
    uploads: list[FeatureUpload],
    teacher: ServedModel,
    params: AlignmentParams,
    progress: Callable[[float, dict], None] = lambda fraction, metrics: None,
    cancelled: Callable[[], bool] = lambda: False,
) -> RoundResult:
    features, groups = group_rows(uploads)
    n = features.shape[0]
    if n < params.min_rows:
        raise ValueError(f"alignment needs at least {params.min_rows} stored rows, found {n}")
    generator = torch.Generator().manual_seed(params.seed)
    order = torch.randperm(n, generator=generator)
    holdout_count = max(2, int(round(n * params.holdout_fraction)))
    holdout, train = order[:holdout_count], order[holdout_count:]

    teacher_logits = _logits(teacher.backend, features)
    student = copy.deepcopy(teacher.backend).train()
    projection = copy.deepcopy(teacher.projection).train()
    optimizer = torch.optim.Adam([*student.parameters(), *projection.parameters()], lr=params.learning_rate)

    metrics: dict[str, float | int | str] = {
        "rows": n,
        "train_rows": len(train),
        "holdout_rows": holdout_count,
    }
    with torch.no_grad():
        teacher_embed = teacher.projection(teacher.backend.features(features[holdout]))
        metrics["holdout_supcon_before"] = float(
            supcon_loss(teacher_embed, groups[holdout], params.temperature)
        )
    report_every = max(1, params.steps // PROGRESS_UPDATES)
    for step in range(params.steps):
        if cancelled():
            raise RoundCancelled("the server is shutting down")
        batch = train[torch.randint(len(train), (min(params.batch_size, len(train)),), generator=generator)]
        z = features[batch]
        embeddings = projection(student.features(z))
        contrastive = supcon_loss(embeddings, groups[batch], params.temperature)
        distill = distillation_loss(student(z), teacher_logits[batch], params.distill_temperature)
        loss = contrastive + params.distill_weight * distill
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % report_every == 0 or step + 1 == params.steps:
            metrics.update(step=step + 1, supcon=contrastive.item(), distill=distill.item())
            progress((step + 1) / params.steps, dict(metrics))

    student.eval()
    projection.eval()
    with torch.no_grad():
        student_logits = _logits(student, features[holdout])
        new_embed = projection(student.features(features[holdout]))
    teacher_pred = teacher_logits[holdout].argmax(1)
    student_pred = student_logits.argmax(1)
    agreement = float((student_pred == teacher_pred).float().mean())
    purity_before = token_purity(teacher_pred, groups[holdout])
    purity_after = token_purity(student_pred, groups[holdout])
    metrics.update(
        holdout_agreement=agreement,
        holdout_purity_before=purity_before,
        holdout_purity_after=purity_after,
        holdout_supcon_after=float(supcon_loss(new_embed, groups[holdout], params.temperature)),
    )
    accepted = (
        agreement >= params.min_replay_agreement and purity_after >= purity_before - params.purity_tolerance
    )
    if not accepted:
        metrics["rejected_because"] = (
            f"held-out agreement {agreement:.3f} < {params.min_replay_agreement}"
            if agreement < params.min_replay_agreement
            else f"held-out token purity dropped {purity_before:.3f} -> {purity_after:.3f}"
        )
    return RoundResult(student, projection, accepted, metrics)


class AlignmentWorker:
    """Runs rounds one at a time on a single background thread (training is CPU-bound)."""

    def __init__(self, store: Store, registry: ModelRegistry, server_key, metrics: ServerMetrics):
        self.store, self.registry, self.server_key, self.metrics = store, registry, server_key, metrics
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harmony-alignment")
        self._stopping = threading.Event()

    def submit(self, params: AlignmentParams) -> int:
        round_id = self.store.create_round(params.model_dump())
        self._executor.submit(self._run, round_id, params)
        return round_id

    def stop(self) -> None:
        """Cancel queued rounds and ask a running one to stop at its next step (it ends `interrupted`)."""
        self._stopping.set()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.store.interrupt_unfinished_rounds()

    def _run(self, round_id: int, params: AlignmentParams) -> None:
        teacher = self.registry.default()
        if teacher is None:
            self._finish(round_id, "failed", {}, error="no back-end version is loaded")
            return
        if not self.store.start_round(round_id, teacher.version):
            return
        try:
            stored = self.store.envelopes(limit_rows=params.max_rows)
            uploads = [stored_to_feature_upload(self.server_key, s) for s in stored]
            result = run_alignment(
                uploads,
                teacher,
                params,
                progress=lambda fraction, metrics: self.store.update_round_progress(
                    round_id, fraction, metrics
                ),
                cancelled=self._stopping.is_set,
            )
        except RoundCancelled:
            self._finish(round_id, "interrupted", {}, error="the server stopped during this round")
            return
        except Exception as error:  # the message names the step, never feature values or tokens
            log.exception("alignment round %d failed", round_id)
            self._finish(round_id, "failed", {}, error=f"{type(error).__name__}: {error}")
            return
        if not result.accepted:
            self._finish(round_id, "rejected", result.metrics)
            return
        current = self.store.round(round_id)
        if current is None or current.status != "running":
            return  # a restart marked this round interrupted while this stale thread ran: do not publish
        version = f"{teacher.version}-r{round_id}"
        self.registry.publish(
            version, result.backend, result.projection, teacher.class_names, teacher.version, result.metrics
        )
        self.metrics.model_swaps.inc()
        self._finish(round_id, "published", result.metrics, new_version=version)
        log.info("alignment round %d published %s", round_id, version)

    def _finish(self, round_id: int, status: str, metrics: dict, new_version=None, error=None) -> None:
        if self.store.finish_round(round_id, status, metrics, new_version, error):
            self.metrics.rounds.labels(status).inc()
