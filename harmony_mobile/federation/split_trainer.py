"""The server side of split training: back-end g, projection head h, the slot table, nothing else.

Every entry point takes a message from messages.py. The server never sees a label: each uploaded
row carries a label token, the server maps it to a slot of its slot table (protocol/slots.py)
and computes the cross-entropy of g's slot logits itself, with the softmax restricted to the slots
the uploading client has uploaded so far (known from its tokens alone). It adds the supervised
contrastive term (positives = equal tokens) and returns only dL/dz. No logit and no gradient
w.r.t. logits crosses the boundary (docs/ALGORITHM.md, step 6).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from harmony_mobile.models import Backend, ProjectionHead
from harmony_mobile.models.losses import cross_family_supcon, supcon_loss
from harmony_mobile.protocol.label_tokens import tokens_to_groups
from harmony_mobile.protocol.messages import ClientUpdate, FeatureUpload, InterfaceGradients
from harmony_mobile.protocol.slots import SlotTable


def cosine_lr_factor(round_id: int, decay_rounds: int | None) -> float:
    """The share of its set learning rate an optimizer uses in round `round_id` (from 0) of a cosine
    decay over `decay_rounds` rounds: 1 at round 0, towards 0 at the last; 1 throughout when None."""
    if decay_rounds is None:
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(round_id, decay_rounds) / decay_rounds))


class ContrastiveTerm(BaseModel):
    """The server's supervised contrastive term on h(g(z)) (docs/ALGORITHM.md, step 7). No defaults
    here: the algorithm that turns the term on (HarmonyConfig) is the one place its knobs default."""

    model_config = ConfigDict(extra="forbid")

    weight: float = Field(gt=0, description="weight of SupCon next to the server CE")
    temperature: float = Field(gt=0, description="SupCon temperature")
    bank_size: int = Field(
        ge=0,
        description="projected embeddings of earlier uploads kept (detached, MoCo-style memory bank) as "
        "extra contrastive candidates, so positives come from other clients and families; token mode: "
        "this round's last rows; cross_family: the last rows of each family",
    )
    mode: Literal["cross_family", "token"] = Field(
        description="cross_family (docs/ALGORITHM.md step 6): an anchor's positives are the latest rows of "
        "its slot from OTHER families, its negatives only rows of slots its own client holds; token: "
        "plain SupCon, every same-token row a positive and every other row a negative",
    )
    reaches_front_ends: bool = Field(
        description="the term's gradient flows back into z, hence into the front-ends (False: it trains "
        "g and h only, and dL/dz returned to a phone is the CE's alone)"
    )
    # a diagnostic no algorithm config exposes, so its default lives here and only here
    ratio_every: int = Field(
        default=4,
        ge=0,
        description="every n-th contrastive step, measure ||weight * dSupCon/dz|| / ||dCE/dz|| (0 = never)",
    )


class StyleMixing(BaseModel):
    """Family-invariance by feature statistics (MixStyle across families, docs/ALGORITHM.md,
    "Alignment"): a row of one family's upload trains g with its per-channel mean and std of z
    mixed towards those of a recent row of another family, so g learns classes independent of which
    extractor drew them. Class-agnostic: it needs neither labels nor tokens, only the family."""

    model_config = ConfigDict(extra="forbid")

    probability: float = Field(gt=0, le=1, description="share of rows whose statistics are mixed")
    alpha: float = Field(gt=0, description="mixing weight ~ Beta(alpha, alpha) (MixStyle's 0.1)")
    bank_size: int = Field(ge=1, description="per family, the statistics of its latest rows kept")


class SplitTrainerConfig(BaseModel):
    """How the server trains during federated rounds, built by each split method's `split_trainer_config`
    from its own config (no defaults here, so a knob's default is written once, in that config)."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(gt=0, description="Adam learning rate of g and h")
    decay_rounds: int | None = Field(
        ge=1, description="cosine decay of lr over this many rounds; None = constant"
    )
    restrict_to_client_slots: bool = Field(
        description="softmax of the server CE over the uploading client's slots only (False: over every "
        "slot of the table). The full softmax teaches g that a family's features never show the classes "
        "it does not hold, which is exactly what g must answer for that family's OOD fallbacks",
    )
    logit_adjustment: float = Field(
        ge=0,
        description="tau: the CE adds tau x log(share of each slot in the uploading client's rows so "
        "far) to its slots' logits (0: the plain restricted softmax; 1: a balanced softmax, so g "
        "learns class scores free of each client's label skew; served logits are never adjusted)",
    )
    contrastive: ContrastiveTerm | None = Field(description="the SupCon term; None = server CE only")
    style_mixing: StyleMixing | None = Field(default=None, description="None = g sees z as uploaded")


class SplitTrainer:
    """The training side of the split, in the simulation: trains the back-end g and the projection h on
    each client's uploaded features (slot CE + SupCon) and answers with dL/dz. Not the fallback
    server (server/), which serves a trained g to phones."""

    def __init__(
        self, backend: Backend, projection: ProjectionHead, config: SplitTrainerConfig, label_epoch: str
    ):
        self.backend = backend
        self.projection = projection
        self.config = config
        self.optimizer = torch.optim.Adam([*backend.parameters(), *projection.parameters()], lr=config.lr)
        self.slot_table = SlotTable(label_epoch, backend.num_classes)
        self.round_id = -1
        # rows per slot each client uploaded: its slots (count > 0) and their shares
        self._client_slot_counts: dict[str, torch.Tensor] = {}
        self._bank_embeddings: list[torch.Tensor] = []
        self._bank_tokens: list[bytes] = []
        # cross_family: per family, the projected embeddings and slots of its latest uploads, kept
        # across rounds (MoCo-style queue): clients train one after the other, so a round-only bank
        # would give the first family of every round no other family to align with
        self._family_bank: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._family_ids: dict[str, int] = {}
        self._contrastive_steps = 0
        self._grad_ratios: dict[str, list[float]] = {}  # per uploading client, until taken
        self._style_bank: dict[int, torch.Tensor] = {}  # family -> (rows, 2, C): mean and std of z
        # the server's own randomness (style mixing); its state is checkpointed with the server
        self._generator = torch.Generator().manual_seed(0)
        self.upload_listeners: list[Callable[[FeatureUpload], None]] = []  # e.g. the benchmark's byte count

    @property
    def label_epoch(self) -> str:
        return self.slot_table.label_epoch

    def start_round(self, round_id: int) -> None:
        """The round's learning rate; the token-mode bank pools the features of one round (earlier
        rounds' embeddings are stale), the cross-family bank is kept (see __init__)."""
        self.round_id = round_id
        self._bank_embeddings, self._bank_tokens = [], []
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr * cosine_lr_factor(round_id, self.config.decay_rounds)

    def step(self, upload: FeatureUpload, update: bool = True) -> InterfaceGradients:
        """Slot-space CE (+ SupCon) on the upload; train g and h on it (unless `update` is False, as in
        the final personalization against a frozen server) and return dL_srv/dz."""
        for listener in self.upload_listeners:
            listener(upload)
        if upload.label_epoch != self.label_epoch:
            raise ValueError(
                f"upload of {upload.client_id} names label epoch {upload.label_epoch!r}; "
                f"this server trains epoch {self.label_epoch!r}"
            )
        slots = self.slot_table.slots(upload.label_tokens)
        counts = self._client_slot_counts.get(upload.client_id, torch.zeros(self.backend.num_classes))
        self._client_slot_counts[upload.client_id] = counts + torch.bincount(
            slots, minlength=self.backend.num_classes
        )
        features = upload.features.detach().clone().requires_grad_(True)
        family = self._family_ids.setdefault(upload.family, len(self._family_ids))
        seen_by_g = self._mix_styles(features, family) if update else features
        penultimate = self.backend.features(seen_by_g)
        logits = self.backend.classifier(penultimate) + self.softmax_mask(upload.client_id)
        loss = F.cross_entropy(logits, slots)
        embeddings = None
        term = self.config.contrastive
        if term is not None and update:
            if term.reaches_front_ends:
                embeddings = self.projection(penultimate)
            else:
                embeddings = self.projection(self.backend.features(seen_by_g.detach()))
            contrastive = term.weight * self._contrastive_loss(embeddings, upload, slots, family)
            self._measure_ratio(loss, contrastive, features, upload.client_id)
            loss = loss + contrastive
        self.optimizer.zero_grad()
        loss.backward()
        if update:
            self.optimizer.step()
            self._remember(embeddings, upload.label_tokens, slots, family)
        return InterfaceGradients(upload.client_id, upload.round_id, features.grad.detach(), loss.item())

    def _mix_styles(self, features: torch.Tensor, family: int) -> torch.Tensor:
        """z with each chosen row's channel statistics mixed towards another family's (StyleMixing);
        the row's statistics join its family's bank. Unchanged when off or no other family is banked."""
        mixing = self.config.style_mixing
        if mixing is None:
            return features
        mean = features.mean(dim=(2, 3), keepdim=True)
        std = (features.var(dim=(2, 3), keepdim=True) + 1e-5).sqrt()
        stats = torch.stack([mean.detach().flatten(1), std.detach().flatten(1)], dim=1)
        others = [bank for f, bank in self._style_bank.items() if f != family]
        kept = self._style_bank.get(family, stats[:0])
        self._style_bank[family] = torch.cat([kept, stats])[-mixing.bank_size :]
        if not others:
            return features
        pool = torch.cat(others)
        n = len(features)
        picked = pool[torch.randint(len(pool), (n,), generator=self._generator)]
        lam = _beta(mixing.alpha, n, self._generator)
        mixed = torch.rand(n, generator=self._generator) < mixing.probability
        lam = torch.where(mixed, lam, torch.ones_like(lam)).view(n, 1, 1, 1)
        other_mean, other_std = picked[:, 0].view_as(mean), picked[:, 1].view_as(std)
        new_mean = lam * mean + (1 - lam) * other_mean
        new_std = lam * std + (1 - lam) * other_std
        return (features - mean) / std * new_std + new_mean

    def client_slots(self, client_id: str) -> list[int]:
        """The slots a client's uploads have named so far, in order."""
        counts = self._client_slot_counts.get(client_id)
        return [] if counts is None else counts.nonzero().flatten().tolist()

    def softmax_mask(self, client_id: str) -> torch.Tensor:
        """0 on the slots the CE's softmax runs over, -inf elsewhere (never on a slot without a token)."""
        mask = torch.full((self.backend.num_classes,), float("-inf"))
        if self.config.restrict_to_client_slots:
            held = self.client_slots(client_id)
            mask[held] = 0.0
            if self.config.logit_adjustment and held:
                counts = self._client_slot_counts[client_id][held]
                mask[held] = self.config.logit_adjustment * (counts / counts.sum()).log()
        else:
            mask[: len(self.slot_table)] = 0.0
        return mask

    def _contrastive_loss(
        self, embeddings: torch.Tensor, upload: FeatureUpload, slots: torch.Tensor, family: int
    ) -> torch.Tensor:
        term = self.config.contrastive
        if term.mode == "token":
            tokens = list(upload.label_tokens)
            if self._bank_embeddings:
                embeddings = torch.cat([embeddings, *self._bank_embeddings])
                tokens += self._bank_tokens
            groups = torch.tensor(tokens_to_groups(tokens))
            return supcon_loss(embeddings, groups, term.temperature)
        # the upload's own rows (detached) are candidates too: same family, so only ever negatives
        banked = [(f, e, s) for f, (e, s) in self._family_bank.items()]
        candidates = torch.cat([*(e for _, e, _ in banked), embeddings.detach()])
        candidate_slots = torch.cat([*(s for _, _, s in banked), slots])
        candidate_families = torch.cat(
            [*(torch.full_like(s, f) for f, _, s in banked), torch.full_like(slots, family)]
        )
        held = torch.tensor(self.client_slots(upload.client_id), dtype=slots.dtype)
        return cross_family_supcon(
            embeddings,
            slots,
            family,
            held,
            candidates,
            candidate_slots,
            candidate_families,
            term.temperature,
        )

    def _measure_ratio(
        self, ce: torch.Tensor, contrastive: torch.Tensor, features: torch.Tensor, client_id: str
    ) -> None:
        """Record ||dSupCon/dz|| / ||dCE/dz|| (weighted) on every `ratio_every`-th contrastive step."""
        every = self.config.contrastive.ratio_every
        self._contrastive_steps += 1
        if every == 0 or self._contrastive_steps % every:
            return
        (ce_grad,) = torch.autograd.grad(ce, features, retain_graph=True)
        (contrastive_grad,) = torch.autograd.grad(contrastive, features, retain_graph=True, allow_unused=True)
        if contrastive_grad is None or float(ce_grad.norm()) == 0.0:
            return
        self._grad_ratios.setdefault(client_id, []).append(float(contrastive_grad.norm() / ce_grad.norm()))

    def take_diagnostics(self, client_id: str) -> dict[str, float]:
        """The measurements on `client_id`'s uploads since the last call (logged with its turn's
        metrics), then cleared: a round's turns interleave, so they are kept per client."""
        ratios = self._grad_ratios.pop(client_id, [])
        # the median: a step where the CE is fit has a near-zero CE gradient and an exploding ratio
        return {"contrastive_grad_ratio": statistics.median(ratios)} if ratios else {}

    def _remember(
        self, embeddings: torch.Tensor | None, tokens: tuple[bytes, ...], slots: torch.Tensor, family: int
    ) -> None:
        term = self.config.contrastive
        if embeddings is None or term.bank_size == 0:  # embeddings exist only when the term is on
            return
        if term.mode == "cross_family":
            kept_embeddings, kept_slots = self._family_bank.get(family, (embeddings.detach()[:0], slots[:0]))
            size = term.bank_size
            self._family_bank[family] = (
                torch.cat([kept_embeddings, embeddings.detach()])[-size:],
                torch.cat([kept_slots, slots])[-size:],
            )
            return
        self._bank_embeddings.append(embeddings.detach())
        self._bank_tokens.extend(tokens)
        while len(self._bank_tokens) > term.bank_size:
            dropped = self._bank_embeddings.pop(0)
            del self._bank_tokens[: len(dropped)]

    @torch.no_grad()
    def infer(self, features: torch.Tensor) -> torch.Tensor:
        """Fallback inference: g's scores over the slots of the table, (N, len(slot_table))."""
        return self.backend(features)[:, : len(self.slot_table)]

    def state(self) -> dict:
        """What a checkpoint needs to resume this server exactly."""
        return {
            "backend": self.backend.state_dict(),
            "projection": self.projection.state_dict(),
            "server_optimizer": self.optimizer.state_dict(),
            "slot_table": self.slot_table.to_hex(),
            "client_slot_counts": {
                name: counts.tolist() for name, counts in self._client_slot_counts.items()
            },
            "family_ids": dict(self._family_ids),
            "family_bank": {family: list(rows) for family, rows in self._family_bank.items()},
            "style_bank": dict(self._style_bank),
            "generator": self._generator.get_state(),
        }

    def load_state(self, state: dict) -> None:
        self.backend.load_state_dict(state["backend"])
        self.projection.load_state_dict(state["projection"])
        self.optimizer.load_state_dict(state["server_optimizer"])
        self.slot_table = SlotTable.from_hex(self.label_epoch, self.backend.num_classes, state["slot_table"])
        self._client_slot_counts = {
            name: torch.tensor(counts) for name, counts in state.get("client_slot_counts", {}).items()
        }
        for name, slots in state.get("client_slots", {}).items():  # a checkpoint from before counts
            self._client_slot_counts.setdefault(name, torch.zeros(self.backend.num_classes))[slots] = 1.0
        self._family_ids = dict(state.get("family_ids", {}))
        self._family_bank = {int(f): tuple(rows) for f, rows in state.get("family_bank", {}).items()}
        self._style_bank = {int(f): rows for f, rows in state.get("style_bank", {}).items()}
        if "generator" in state:
            self._generator.set_state(state["generator"])


def aggregate_by_parameter(
    current: dict[str, torch.Tensor], updates: list[ClientUpdate]
) -> dict[str, torch.Tensor]:
    """HeteroFL-style averaging: each parameter is the sample-weighted mean over the clients that
    hold it; a parameter nobody holds keeps its value (a shallow tier holds fewer stages)."""
    merged = {}
    for name, value in current.items():
        holders = [u for u in updates if name in u.weights]
        if not holders:
            merged[name] = value
            continue
        total = sum(u.num_samples for u in holders)
        merged[name] = sum(u.weights[name] * (u.num_samples / total) for u in holders)
    return merged


def _beta(alpha: float, n: int, generator: torch.Generator) -> torch.Tensor:
    """n draws of Beta(alpha, alpha) that follow from `generator` (torch.distributions takes none)."""
    rng = np.random.default_rng(int(torch.randint(2**62, (), generator=generator)))
    return torch.from_numpy(rng.beta(alpha, alpha, n)).float()
