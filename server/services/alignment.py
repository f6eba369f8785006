"""Alignment rounds: fine-tune g and h on stored uploads in a background thread, publish if safe.

One round (docs/ALGORITHM.md, "Alignment rounds after deployment"), with the current default
version as the teacher. The server has no labels; it has label tokens of the lineage's label
epoch, and the teacher's slot table says which slot each token is:

  * new rows: the stored uploads of the teacher's label epoch the teacher has not been trained on
    (up to `max_rows`, newest first). Each row's token gives its slot (a token of the epoch the
    table has not seen takes a free slot, if any; rows of a full table are dropped and counted).
    They feed the slot-space CE (softmax over the slots of the uploading device's tokens, as in
    training) and SupCon on normalize(h(g.features(z))) with positives = equal slots;
  * replay rows, the "earlier features": features the teacher was trained on, so its predictions
    on them are the slot mapping to keep. Two sources:
      - the replay set shipped with the back-end version: label-free interface features of the
        clients' training images through their final front-ends, written by training into
        backend.pt (federation/replay.py) and inherited unchanged by every version published from
        it. The server received features of these images during training, so holding them is
        faithful to the privacy boundary;
      - stored uploads an alignment round already trained the teacher on (upload id <= the
        `trained_through_upload_id` that round recorded); they stay sealed in the store and are
        opened in memory like the new rows;
  * hold out `holdout_fraction` of the new rows and of the replay rows (seeded);
  * train a copy of (g, h): ce_weight * slot CE + contrastive_weight * SupCon on a batch of new
    rows + distill_weight * KL(teacher || student) on a batch of replay rows;
  * publish check: (a) held-out slot accuracy of the new rows (top slot among the served slots ==
    the row's slot) is not below the teacher's minus `accuracy_tolerance`; (b) the slot mapping is
    kept: on held-out replay rows the new version picks the teacher's slot at least
    `min_replay_agreement` of the time. Pass -> publish `<parent>-r<round>` with the round's slot
    table; fail -> status `rejected` with `rejected_because`.

No replay rows (a back-end file without a replay set, and no stored rows trained on before): there
is nothing to distill on and (b) cannot be measured. With `require_replay` (the default) the round
is rejected before training; with `require_replay=false` it trains without distillation and
publishes on (a) alone. Either way the metrics say so (`replay_rows` 0, `distillation`,
`replay_check`). A round that raises is `failed`; a round whose process died is marked
`interrupted` when its lease expires (AlignmentWorker). Either way the old version keeps serving and the uploads stay
untouched.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from harmony_mobile.server.core.schemas import AlignmentParams
from harmony_mobile.server.services.registry import ServedVersion
from harmony_mobile.server.services.round_outcomes import NotEnoughRows, RoundCancelled
from harmony_mobile.server.services.torch_runtime import served_version
from harmony_mobile.server.services.uploads import stored_to_feature_upload

from harmony_mobile.models.losses import distillation_loss, supcon_loss
from harmony_mobile.protocol.messages import FeatureUpload
from harmony_mobile.protocol.slots import SlotTable, SlotTableFull

if TYPE_CHECKING:  # rounds.py imports this module when a round runs: no import back at run time
    from harmony_mobile.server.services.rounds import AlignmentWorker

log = logging.getLogger("harmony_mobile.server.alignment")
PROGRESS_UPDATES = 10


@dataclass
class RoundResult:
    backend: torch.nn.Module | None  # None when the round was rejected before training
    projection: torch.nn.Module | None
    accepted: bool
    metrics: dict[str, float | int | str]
    slot_table: SlotTable  # the teacher's, plus slots for tokens of the epoch it had not seen


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


@dataclass
class SlotRows:
    """The new rows of a round in slot space: features, slot per row (from its token through the
    round's slot table) and the 0/-inf softmax mask of each row's device (the slots its tokens map
    to, as in training: the CE never pushes a device's features away from classes it does not hold)."""

    features: torch.Tensor
    slots: torch.Tensor
    masks: torch.Tensor
    dropped_rows: int  # rows whose token could get no slot (the table was full)

    @classmethod
    def build(cls, uploads: list[FeatureUpload], slot_table: SlotTable, num_outputs: int) -> SlotRows:
        features, slots, devices, dropped = [], [], [], 0
        for upload in uploads:
            row_slots = []
            for token in upload.label_tokens:
                try:
                    row_slots.append(slot_table.slot(token))
                except SlotTableFull:
                    row_slots.append(-1)
            keep = torch.tensor(row_slots) >= 0
            dropped += int((~keep).sum())
            features.append(upload.features[keep].float())
            slots.append(torch.tensor(row_slots)[keep])
            devices += [upload.client_id] * int(keep.sum())
        slots_t = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64)
        device_slots: dict[str, set[int]] = {}
        for device, slot in zip(devices, slots_t.tolist(), strict=True):
            device_slots.setdefault(device, set()).add(slot)
        masks = torch.full((len(devices), num_outputs), float("-inf"))
        for row, device in enumerate(devices):
            masks[row, sorted(device_slots[device])] = 0.0
        feature_t = torch.cat(features) if features else torch.zeros(0)
        return cls(feature_t, slots_t, masks, dropped)

    @property
    def rows(self) -> int:
        return int(self.slots.shape[0])


def slot_accuracy(scores: torch.Tensor, slots: torch.Tensor, served_slots: int) -> float:
    """Share of rows whose top slot among the `served_slots` slots the server answers with is their own."""
    if len(slots) == 0:
        return float("nan")
    return float((scores[:, :served_slots].argmax(1) == slots).float().mean())


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
    teacher: ServedVersion,
    params: AlignmentParams,
    progress: Callable[[float, dict], None] = lambda fraction, metrics: None,
    cancelled: Callable[[], bool] = lambda: False,
) -> RoundResult:
    """Slot CE + SupCon on `uploads` (the new rows), distillation to `teacher` on `replay`
    (module docstring). `uploads` are of the teacher's label epoch."""
    if not uploads:
        raise NotEnoughRows(f"alignment needs at least {params.min_rows} new stored rows, found 0")
    slot_table = teacher.slot_table.copy()  # new tokens of the epoch may take free slots
    data = SlotRows.build(uploads, slot_table, teacher.num_classes)
    if data.rows < params.min_rows:
        raise NotEnoughRows(f"alignment needs at least {params.min_rows} new stored rows, found {data.rows}")
    generator = torch.Generator().manual_seed(params.seed)
    holdout, train = _split(data.rows, params.holdout_fraction, generator)
    metrics = _row_counts(data, train, holdout, replay, len(teacher.slot_table), len(slot_table))
    has_replay = replay.rows >= 2  # one row cannot be split into training and a held-out check
    if not has_replay and params.require_replay:
        metrics.update(_no_replay_rejection(replay.rows))
        return RoundResult(None, None, False, metrics, slot_table)
    replay_holdout = replay_train = replay_logits = None
    if has_replay:
        replay_holdout, replay_train = _split(replay.rows, params.holdout_fraction, generator)
        replay_logits = _logits(teacher.backend, replay.features)
        metrics.update(replay_train_rows=len(replay_train), replay_holdout_rows=len(replay_holdout))
    metrics["distillation"] = _distillation_mode(has_replay, params.distill_weight)
    student, projection = _train_student(
        data,
        train,
        replay,
        replay_train,
        replay_logits,
        teacher,
        params,
        generator,
        metrics,
        progress,
        cancelled,
    )
    reasons = _publish_check(
        data, holdout, replay, replay_holdout, replay_logits, teacher, student, slot_table, params, metrics
    )
    if reasons:
        metrics["rejected_because"] = "; ".join(reasons)
    return RoundResult(student, projection, not reasons, metrics, slot_table)


def _row_counts(
    data: SlotRows,
    train: torch.Tensor,
    holdout: torch.Tensor,
    replay: ReplaySet,
    slots_before: int,
    slots_after: int,
) -> dict[str, float | int | str]:
    """The round's first metrics: how many rows it has of each kind and how many slots."""
    return {
        "rows": data.rows,
        "train_rows": len(train),
        "holdout_rows": len(holdout),
        "rows_without_slot": data.dropped_rows,
        "slots_before": slots_before,
        "slots_after": slots_after,
        "replay_rows": replay.rows,
        "replay_shipped_rows": replay.shipped_rows,
        "replay_stored_rows": replay.stored_rows,
    }


def _distillation_mode(has_replay: bool, distill_weight: float) -> str:
    if not has_replay:
        return "off: no replay rows"
    return "on replay rows" if distill_weight > 0 else "off: distill_weight 0"


def _no_replay_rejection(rows: int) -> dict[str, str]:
    return {
        "distillation": "off: no replay rows",
        "replay_check": "impossible: no replay rows",
        "rejected_because": (
            f"no replay rows ({rows}): the slot mapping cannot be checked; the back-end file has"
            " no replay set and no stored rows were trained on before (require_replay=false publishes"
            " on held-out slot accuracy alone)"
        ),
    }


def _train_student(
    data, train, replay, replay_train, replay_logits, teacher, params, generator, metrics, progress, cancelled
):
    student = copy.deepcopy(teacher.backend).train()
    projection = copy.deepcopy(teacher.projection).train()
    optimizer = torch.optim.Adam([*student.parameters(), *projection.parameters()], lr=params.learning_rate)
    distill_on = replay_train is not None and params.distill_weight > 0
    report_every = max(1, params.steps // PROGRESS_UPDATES)
    for step in range(params.steps):
        if cancelled():
            raise RoundCancelled("the server is shutting down")
        batch = _sample(train, params.batch_size, generator)
        ce, contrastive = _slot_losses(student, projection, data, batch, params)
        loss = params.ce_weight * ce + (
            0.0 if contrastive is None else params.contrastive_weight * contrastive
        )
        if distill_on:
            replay_batch = _sample(replay_train, params.batch_size, generator)
            distill = distillation_loss(
                student(replay.features[replay_batch]),
                replay_logits[replay_batch],
                params.distill_temperature,
            )
            loss = loss + params.distill_weight * distill
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % report_every == 0 or step + 1 == params.steps:
            metrics.update(step=step + 1, slot_ce=ce.item())
            if contrastive is not None:
                metrics["supcon"] = contrastive.item()
            if distill_on:
                metrics["distill"] = distill.item()
            progress((step + 1) / params.steps, dict(metrics))
    return student.eval(), projection.eval()


def _slot_losses(student, projection, data, batch, params) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The slot CE of a batch, and its SupCon loss when it is weighted (None at weight 0: the
    projection's forward and the pairwise similarities would cost each step for nothing)."""
    penultimate = student.features(data.features[batch])
    ce = F.cross_entropy(student.classifier(penultimate) + data.masks[batch], data.slots[batch])
    if params.contrastive_weight <= 0:
        return ce, None
    return ce, supcon_loss(projection(penultimate), data.slots[batch], params.temperature)


def _publish_check(
    data, holdout, replay, replay_holdout, replay_logits, teacher, student, slot_table, params, metrics
) -> list[str]:
    """(a) held-out slot accuracy of the new rows did not drop; (b) on held-out replay rows the new
    version picks the teacher's slot at least `min_replay_agreement` of the time."""
    before = slot_accuracy(
        _logits(teacher.backend, data.features[holdout]), data.slots[holdout], len(teacher.slot_table)
    )
    after = slot_accuracy(_logits(student, data.features[holdout]), data.slots[holdout], len(slot_table))
    metrics.update(holdout_slot_accuracy_before=before, holdout_slot_accuracy_after=after)
    reasons = []
    if after < before - params.accuracy_tolerance:
        reasons.append(f"held-out slot accuracy dropped {before:.3f} -> {after:.3f}")
    if replay_holdout is None:
        metrics["replay_check"] = "skipped: no replay rows (require_replay=false)"
        return reasons
    served = len(teacher.slot_table)
    kept = _logits(student, replay.features[replay_holdout])[:, :served].argmax(1)
    agreement = float((kept == replay_logits[replay_holdout][:, :served].argmax(1)).float().mean())
    metrics["replay_agreement"] = agreement
    replay_failed = agreement < params.min_replay_agreement
    if replay_failed:
        reasons.append(
            f"held-out replay agreement {agreement:.3f} < {params.min_replay_agreement} (the slot mapping was not kept)"
        )
    metrics["replay_check"] = "failed" if replay_failed else "passed"
    return reasons


def align_and_publish(worker: AlignmentWorker, round_id: int, params: AlignmentParams) -> None:
    """One round of `worker` (rounds.py): train on the stored uploads, publish if the check passes."""
    # The store's default, read after the start: a round another process ran may have just published.
    teacher = worker.registry.load_default()
    if teacher is None:
        worker._finish(round_id, "failed", {}, error="no back-end version is loaded")
        return
    worker.store.set_round_parent(round_id, teacher.version)
    # only uploads of the lineage's epoch: other epochs' tokens are unrelated to its slots
    stored = worker.store.envelopes(limit_rows=params.max_rows, label_epoch=teacher.label_epoch)
    trained_through = worker._trained_through(teacher.version)
    opened = [(s.upload_id, stored_to_feature_upload(worker.server_key, s)) for s in stored]
    result = run_alignment(
        [u for upload_id, u in opened if upload_id > trained_through],
        ReplaySet.build(teacher.replay, [u for upload_id, u in opened if upload_id <= trained_through]),
        teacher,
        params,
        progress=lambda fraction, metrics: worker.store.update_round_progress(round_id, fraction, metrics),
        cancelled=lambda: worker._cancelled(round_id),
    )
    if stored:
        result.metrics["trained_through_upload_id"] = max(s.upload_id for s in stored)
    if not result.accepted:
        worker._finish(round_id, "rejected", result.metrics)
        return
    current = worker.store.round(round_id)
    if current is None or current.status != "running":
        return  # its lease expired and another process marked it interrupted: do not publish
    version = f"{teacher.version}-r{round_id}"
    # the replay set is inherited unchanged: uploaded features stay in their sealed envelopes
    model = served_version(
        version, "", result.backend, result.projection, teacher.class_names, teacher.replay, result.slot_table
    )
    worker.registry.publish(version, teacher.version, result.metrics, model)
    worker.metrics.model_swaps.inc()
    worker._finish(round_id, "published", result.metrics, new_version=version)
    log.info("alignment round %d published %s", round_id, version)
