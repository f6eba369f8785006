"""Alignment rounds: fine-tune g and h on stored uploads in a background thread, publish if safe.

One round (ALGORITHM.md, "Alignment rounds after deployment"), with the current default version
as the teacher (the server has no labels: the teacher's predictions are the only targets):

  * new rows: the stored uploads the teacher has not been trained on (up to `max_rows`, newest
    first). They feed SupCon only: normalize(h(g.features(z))) with positives = equal label tokens,
    tokens grouped *per round_id* (tokens of different key epochs are unrelated);
  * replay rows, the "earlier features": features the teacher was trained on, so its predictions
    on them are the class mapping to keep. Two sources:
      - the replay set shipped with the back-end version: label-free interface features of the
        clients' training images through their final front-ends, written by training into
        backend.pt (federation/replay.py) and inherited unchanged by every version published from
        it. The server received features of these images during training, so holding them is
        faithful to the privacy boundary; and they are the one set on which the teacher is known
        to be right, because it was fitted to them with the clients' losses;
      - stored uploads an alignment round already trained the teacher on (upload id <= the
        `trained_through_upload_id` that round recorded); they stay sealed in the store and are
        opened in memory like the new rows.
    Why not "older key epochs" or "rows uploaded before the version was published" alone: after
    a fresh export every stored row is new to the back-end, and its predictions on drifted or
    unseen-class features are exactly what the round must change; distilling there (the previous
    behaviour: teacher targets on the SupCon rows) cancels the round;
  * hold out `holdout_fraction` of the new rows and of the replay rows (seeded);
  * train a copy of (g, h): SupCon on a batch of new rows + distill_weight * KL(teacher || student)
    on a batch of replay rows;
  * publish check: (a) the class mapping is kept: on held-out replay rows the new version predicts
    the teacher's class at least `min_replay_agreement` of the time; (b) the label-free quality of
    the new rows did not drop: held-out token purity (share of rows predicting the majority class
    of their token group) not below the teacher's minus `purity_tolerance`. Pass -> publish
    `<parent>-r<round>`; fail -> status `rejected` with `rejected_because`.

No replay rows (a back-end file without a replay set, and no stored rows trained on before): there
is nothing to distill on and (a) cannot be measured. With `require_replay` (the default) the round
is rejected before training; with `require_replay=false` it trains SupCon alone and publishes on
(b) alone. Either way the metrics say so (`replay_rows` 0, `distillation`, `replay_check`).
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


class NotEnoughRows(ValueError):
    """An expected outcome (too few stored rows), not a bug: logged without a traceback."""


@dataclass
class RoundResult:
    backend: torch.nn.Module | None  # None when the round was rejected before training
    projection: torch.nn.Module | None
    accepted: bool
    metrics: dict[str, float | int | str]


@dataclass
class ReplaySet:
    """The round's earlier features (float32) and how many rows came from each source."""

    features: torch.Tensor
    shipped_rows: int
    stored_rows: int

    @classmethod
    def build(cls, shipped: torch.Tensor, stored: list[FeatureUpload]) -> ReplaySet:
        features = torch.cat([shipped.float(), *(u.features.float() for u in stored)])
        return cls(features, int(shipped.shape[0]), int(features.shape[0] - shipped.shape[0]))

    @property
    def rows(self) -> int:
        return int(self.features.shape[0])


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


def _split(count: int, fraction: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(held-out, train) row indices; at least one row on each side (count >= 2)."""
    order = torch.randperm(count, generator=generator)
    held = min(count - 1, max(1, int(round(count * fraction))))
    return order[:held], order[held:]


def _sample(rows: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    return rows[torch.randint(len(rows), (min(size, len(rows)),), generator=generator)]


def run_alignment(
    uploads: list[FeatureUpload],
    replay: ReplaySet,
    teacher: ServedModel,
    params: AlignmentParams,
    progress: Callable[[float, dict], None] = lambda fraction, metrics: None,
    cancelled: Callable[[], bool] = lambda: False,
) -> RoundResult:
    """SupCon on `uploads` (the new rows), distillation to `teacher` on `replay` (module docstring)."""
    if not uploads:
        raise NotEnoughRows(f"alignment needs at least {params.min_rows} new stored rows, found 0")
    features, groups = group_rows(uploads)
    n = features.shape[0]
    if n < params.min_rows:
        raise NotEnoughRows(f"alignment needs at least {params.min_rows} new stored rows, found {n}")
    generator = torch.Generator().manual_seed(params.seed)
    holdout, train = _split(n, params.holdout_fraction, generator)
    metrics: dict[str, float | int | str] = {
        "rows": n,
        "train_rows": len(train),
        "holdout_rows": len(holdout),
        "replay_rows": replay.rows,
        "replay_shipped_rows": replay.shipped_rows,
        "replay_stored_rows": replay.stored_rows,
    }
    has_replay = replay.rows >= 2  # one row cannot be split into training and a held-out check
    if not has_replay and params.require_replay:
        metrics.update(
            distillation="off: no replay rows",
            replay_check="impossible: no replay rows",
            rejected_because=(
                f"no replay rows ({replay.rows}): the class mapping cannot be checked; the back-end file has"
                " no replay set and no stored rows were trained on before (require_replay=false publishes"
                " on token purity alone)"
            ),
        )
        return RoundResult(None, None, False, metrics)
    if has_replay:
        replay_holdout, replay_train = _split(replay.rows, params.holdout_fraction, generator)
        replay_logits = _logits(teacher.backend, replay.features)
        metrics.update(replay_train_rows=len(replay_train), replay_holdout_rows=len(replay_holdout))
    distill_on = has_replay and params.distill_weight > 0
    metrics["distillation"] = (
        "on replay rows" if distill_on else ("off: distill_weight 0" if has_replay else "off: no replay rows")
    )

    student = copy.deepcopy(teacher.backend).train()
    projection = copy.deepcopy(teacher.projection).train()
    optimizer = torch.optim.Adam([*student.parameters(), *projection.parameters()], lr=params.learning_rate)
    with torch.no_grad():
        teacher_embed = teacher.projection(teacher.backend.features(features[holdout]))
        metrics["holdout_supcon_before"] = float(
            supcon_loss(teacher_embed, groups[holdout], params.temperature)
        )
    report_every = max(1, params.steps // PROGRESS_UPDATES)
    for step in range(params.steps):
        if cancelled():
            raise RoundCancelled("the server is shutting down")
        batch = _sample(train, params.batch_size, generator)
        embeddings = projection(student.features(features[batch]))
        loss = contrastive = supcon_loss(embeddings, groups[batch], params.temperature)
        if distill_on:
            replay_batch = _sample(replay_train, params.batch_size, generator)
            distill = distillation_loss(
                student(replay.features[replay_batch]),
                replay_logits[replay_batch],
                params.distill_temperature,
            )
            loss = contrastive + params.distill_weight * distill
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % report_every == 0 or step + 1 == params.steps:
            metrics.update(step=step + 1, supcon=contrastive.item())
            if distill_on:
                metrics["distill"] = distill.item()
            progress((step + 1) / params.steps, dict(metrics))

    student.eval()
    projection.eval()
    with torch.no_grad():
        teacher_pred = _logits(teacher.backend, features[holdout]).argmax(1)
        student_pred = _logits(student, features[holdout]).argmax(1)
        new_embed = projection(student.features(features[holdout]))
    purity_before = token_purity(teacher_pred, groups[holdout])
    purity_after = token_purity(student_pred, groups[holdout])
    metrics.update(
        holdout_purity_before=purity_before,
        holdout_purity_after=purity_after,
        holdout_changed=float((student_pred != teacher_pred).float().mean()),
        holdout_supcon_after=float(supcon_loss(new_embed, groups[holdout], params.temperature)),
    )
    reasons = []
    if has_replay:
        kept = _logits(student, replay.features[replay_holdout]).argmax(1)
        agreement = float((kept == replay_logits[replay_holdout].argmax(1)).float().mean())
        metrics["replay_agreement"] = agreement
        if agreement < params.min_replay_agreement:
            reasons.append(
                f"held-out replay agreement {agreement:.3f} < {params.min_replay_agreement}"
                " (the class mapping was not kept)"
            )
        metrics["replay_check"] = "failed" if reasons else "passed"
    else:
        metrics["replay_check"] = "skipped: no replay rows (require_replay=false)"
    if purity_after < purity_before - params.purity_tolerance:
        reasons.append(f"held-out token purity dropped {purity_before:.3f} -> {purity_after:.3f}")
    if reasons:
        metrics["rejected_because"] = "; ".join(reasons)
    return RoundResult(student, projection, not reasons, metrics)


class AlignmentWorker:
    """Runs rounds one at a time on a single background thread (training is CPU-bound)."""

    def __init__(self, store: Store, registry: ModelRegistry, server_key, metrics: ServerMetrics):
        self.store, self.registry, self.server_key, self.metrics = store, registry, server_key, metrics
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harmony-alignment")
        self._stopping = threading.Event()
        self._submitted: list[int] = []

    def submit(self, params: AlignmentParams) -> int:
        round_id = self.store.create_round(params.model_dump())
        self._submitted.append(round_id)
        self._executor.submit(self._run, round_id, params)
        return round_id

    def stop(self) -> None:
        """Cancel queued rounds and ask a running one to stop at its next step (it ends `interrupted`)."""
        self._stopping.set()
        self._executor.shutdown(wait=True, cancel_futures=True)
        # Only this process's rounds: another replica's running round is none of its business.
        self.store.interrupt_unfinished_rounds(self._submitted)

    def _run(self, round_id: int, params: AlignmentParams) -> None:
        teacher = self.registry.default()
        if teacher is None:
            self._finish(round_id, "failed", {}, error="no back-end version is loaded")
            return
        if not self.store.start_round(round_id, teacher.version):
            return
        try:
            stored = self.store.envelopes(limit_rows=params.max_rows)
            trained_through = self._trained_through(teacher.version)
            opened = [(s.upload_id, stored_to_feature_upload(self.server_key, s)) for s in stored]
            new = [u for upload_id, u in opened if upload_id > trained_through]
            older = [u for upload_id, u in opened if upload_id <= trained_through]
            result = run_alignment(
                new,
                ReplaySet.build(teacher.replay, older),
                teacher,
                params,
                progress=lambda fraction, metrics: self.store.update_round_progress(
                    round_id, fraction, metrics
                ),
                cancelled=self._stopping.is_set,
            )
            if stored:
                result.metrics["trained_through_upload_id"] = max(s.upload_id for s in stored)
        except RoundCancelled:
            self._finish(round_id, "interrupted", {}, error="the server stopped during this round")
            return
        except NotEnoughRows as error:
            log.warning("alignment round %d failed: %s", round_id, error)
            self._finish(round_id, "failed", {}, error=f"{type(error).__name__}: {error}")
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
            version,
            result.backend,
            result.projection,
            teacher.class_names,
            teacher.version,
            result.metrics,
            teacher.replay,  # inherited unchanged: uploaded features stay in their sealed envelopes
        )
        self.metrics.model_swaps.inc()
        self._finish(round_id, "published", result.metrics, new_version=version)
        log.info("alignment round %d published %s", round_id, version)

    def _trained_through(self, version: str) -> int:
        """Newest upload id the round that published `version` trained on (0 for an imported version:
        after a new export every stored row is new to the back-end)."""
        record = self.store.version(version)
        if record is None or record.source != "alignment":
            return 0
        return int(record.metrics.get("trained_through_upload_id", 0))

    def _finish(self, round_id: int, status: str, metrics: dict, new_version=None, error=None) -> None:
        if self.store.finish_round(round_id, status, metrics, new_version, error):
            self.metrics.rounds.labels(status).inc()
