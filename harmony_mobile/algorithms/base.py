"""The one small protocol every training method implements, and the client-side pieces they share.

A method is a file: it says how a client trains in a round (`client_round`), how the server
trains (`split_trainer_config`: None means no server at all), how updates aggregate (`aggregate`), how
the final personalization runs (`personalize`), and how a phone decides to exit (`exit_rule`).
The round loop in federation/rounds.py drives any of them the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from harmony_mobile.federation.client import Client
from harmony_mobile.federation.split_trainer import SplitTrainer, SplitTrainerConfig, cosine_lr_factor
from harmony_mobile.models import FamilyModel
from harmony_mobile.protocol.messages import ClientUpdate

ExitRule = Literal["max_softmax", "neg_entropy", "slot_margin"]

# Samples a client draws per optimizer step unless configured. HARMONY draws a support and a query
# batch per meta step, so its batch_size defaults to half of this: every method sees the same samples.
SAMPLES_PER_STEP = 64


class LocalTrainingConfig(BaseModel):
    """The per-round budget every method has: the one place its defaults are written, so that the
    methods compare at equal budgets unless a method's config says otherwise."""

    model_config = ConfigDict(extra="forbid")

    local_steps: int = Field(default=16, ge=1, description="optimizer steps per client per round")
    batch_size: int = Field(default=SAMPLES_PER_STEP, ge=2, description="samples per step")
    lr: float = Field(default=3e-3, gt=0, description="Adam learning rate of what the client trains")
    decay_rounds: int | None = Field(
        default=None,
        ge=1,
        description="cosine-decay the learning rates of the rounds (the client's and the server's; not the "
        "final personalization's or the inner loop's) from their set values towards 0 over this many "
        "rounds (the run's rounds), so a run ends on a settled model rather than a noisy last step; "
        "None = constant",
    )

    def round_lr(self, round_id: int) -> float:
        """The client's learning rate in round `round_id`."""
        return self.lr * cosine_lr_factor(round_id, self.decay_rounds)


def round_optimizer(
    params: Iterable[torch.Tensor], config: LocalTrainingConfig, round_id: int, state: dict | None = None
) -> torch.optim.Adam:
    """The client's Adam for one round: its saved `state` (when the method keeps one across rounds)
    and the round's learning rate (set after the load, which would restore the saved one)."""
    optimizer = torch.optim.Adam(params, lr=config.lr)
    if state is not None:
        optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        group["lr"] = config.round_lr(round_id)
    return optimizer


class SplitTrainingConfig(LocalTrainingConfig):
    """What a split method adds: the server back-end's optimizer and the phone's final personalization
    and exit calibration."""

    server_lr: float = Field(default=1e-3, gt=0, description="Adam learning rate of the server back-end")
    personalize_epochs: int = Field(default=0, ge=0, description="final personalization epochs on local data")
    personalize_batch_size: int | None = Field(
        default=None, ge=2, description="batch size of the final personalization; None = batch_size"
    )
    calibration_target: float = Field(
        default=0.98, gt=0, le=1, description="local-exit accuracy target the exit threshold is calibrated to"
    )
    exit_rule: ExitRule | None = Field(
        default=None,
        description="the score a phone exits by: max_softmax or neg_entropy of its exit logits, or "
        "slot_margin, its features' nearest own slot prototype against the nearest other one (the "
        "server's prototypes, made from the replay set; calibrated once they exist); None = the "
        "method's own",
    )

    server_logit_adjustment: float = Field(
        default=0.0,
        ge=0,
        description="tau of the restricted server softmax (SplitTrainerConfig.logit_adjustment): it adds "
        "tau x log(share of each slot in the client's uploads); nothing without the restricted softmax",
    )

    @property
    def personalization_batch_size(self) -> int:
        return self.personalize_batch_size or self.batch_size


class FullModelMethod:
    """What the methods without a split share: no server back-end, and the client's full model
    answers every query (so the exit rule is never used)."""

    uses_split = False
    exit_rule = "max_softmax"
    Config: type[LocalTrainingConfig] = LocalTrainingConfig

    def __init__(self, config: LocalTrainingConfig | None = None):
        self.config = config or self.Config()

    def split_trainer_config(self) -> None:
        return None


class SplitMethod:
    """What the split methods share: the phone runs a front-end and falls back to the server
    back-end, exiting locally by max-softmax unless the method or its config says otherwise."""

    uses_split = True
    own_exit_rule: ExitRule = "max_softmax"
    Config: type[SplitTrainingConfig] = SplitTrainingConfig

    def __init__(self, config: SplitTrainingConfig | None = None):
        self.config = config or self.Config()

    @property
    def exit_rule(self) -> ExitRule:
        return self.config.exit_rule or self.own_exit_rule


class Algorithm(Protocol):
    name: str
    uses_split: bool  # True: the phone runs a front-end and falls back to the server back-end

    def split_trainer_config(self) -> SplitTrainerConfig | None: ...

    def client_round(
        self, client: Client, server: SplitTrainer | None, round_id: int, generator: torch.Generator
    ) -> ClientUpdate: ...

    def aggregate(
        self, family_weights: dict[str, torch.Tensor], updates: list[ClientUpdate]
    ) -> dict[str, torch.Tensor]: ...

    def personalize(
        self, client: Client, server: SplitTrainer | None, generator: torch.Generator
    ) -> None: ...

    exit_rule: ExitRule  # exit locally iff exit_score(...) >= the client's threshold


def exit_loss(
    model: FamilyModel,
    images: torch.Tensor,
    labels: torch.Tensor,
    max_depth: int,
    logit_norm: float | None = None,
) -> torch.Tensor:
    """Mean cross-entropy of the exit heads at depths 1..max_depth (one pass through the stages),
    so a phone can later split at any shallower depth without retraining. `logit_norm`: the
    temperature of LogitNorm (the CE of logits / (t ||logits||)), which keeps the exit from growing
    confident by growing its logits, so that low confidence is left to what it has not seen."""
    return exit_loss_and_activation(model, images, labels, max_depth, logit_norm)[0]


def exit_loss_and_activation(
    model: FamilyModel,
    images: torch.Tensor,
    labels: torch.Tensor,
    max_depth: int,
    logit_norm: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`exit_loss` and the activation after stage `max_depth`, which the same pass computed (the
    connector's input: a split step needs no second pass through the stages)."""
    activation, loss = images, 0.0
    for depth in range(1, max_depth + 1):
        activation = model.stages[depth - 1](activation)
        logits = model.exits[str(depth)](activation)
        if logit_norm is not None:
            logits = logits / (logit_norm * logits.norm(dim=1, keepdim=True).clamp_min(1e-7))
        loss = loss + F.cross_entropy(logits, labels)
    return loss / max_depth, activation


def split_step(
    client: Client,
    server: SplitTrainer,
    features: torch.Tensor,
    labels: torch.Tensor,
    depths: tuple[int, ...],
    round_id: int,
    weight: float,
    update_server: bool = True,
    client_loss: torch.Tensor | None = None,
) -> float:
    """One split exchange in slot space. The client uploads its features (clipped and noised when
    that option is on) with label tokens; the server computes its own CE over slots and its
    contrastive term and returns only dL_srv/dz, which the client scales by `weight` (its gamma)
    and back-propagates into its front-end. Returns the server's loss. `labels` are the labels
    of the batch the client drew last; they stay on the client (only their tokens leave).

    `client_loss`: a loss of the client's own on the same forward pass (its exit CE), back-propagated
    together with dL_srv/dz in one backward pass instead of two."""
    upload, sent = client.upload(features, labels, depths, round_id)
    reply = server.step(upload, update=update_server)
    roots, grads = ([client_loss], [None]) if client_loss is not None else ([], [])
    if weight != 0:
        roots.append(sent)
        grads.append(weight * reply.grad_features)
    if roots:
        torch.autograd.backward(roots, grads)
    return reply.server_loss


def client_update(
    client: Client, round_id: int, metrics: dict[str, float], full: bool = False
) -> ClientUpdate:
    weights = {name: p.detach().clone() for name, p in client.held_parameters(full).items()}
    return ClientUpdate(
        client_id=client.name,
        round_id=round_id,
        family=client.tier.family,
        tier=client.tier.name,
        weights=weights,
        num_samples=len(client.train_y),
        metrics=metrics,
    )


@torch.no_grad()
def calibrate_threshold(confidences: torch.Tensor, correct: torch.Tensor, target_accuracy: float) -> float:
    """The most permissive threshold t (exit iff confidence >= t) whose local-exit accuracy on ID
    validation samples reaches the target (docs/ALGORITHM.md: Inference). If none reaches it, a
    threshold just above every validation confidence (everything falls back)."""
    order = torch.argsort(confidences, descending=True)
    sorted_scores = confidences[order].numpy()
    accuracy = (correct[order].float().cumsum(0) / torch.arange(1, len(order) + 1)).numpy()
    # a threshold at the k-th score also exits every sample tied with it: only the last of a tie counts
    last_of_tie = np.append(sorted_scores[1:] < sorted_scores[:-1], True)
    reachable = np.flatnonzero((accuracy >= target_accuracy) & last_of_tie)
    if len(reachable) == 0:
        return (
            float(np.nextafter(np.float32(sorted_scores[0]), np.float32(np.inf)))
            if len(sorted_scores)
            else 1.0
        )
    return float(sorted_scores[reachable.max()])


def personalize_split(
    client: Client,
    server: SplitTrainer,
    epochs: int,
    batch_size: int,
    lr: float,
    gamma: float,
    generator: torch.Generator,
    logit_norm: float | None = None,
) -> None:
    """Final personalization of a split method: exit loss + gamma * server CE against a frozen server."""
    params = client.held_parameters()
    optimizer = torch.optim.Adam(params.values(), lr=lr)
    steps = epochs * max(1, len(client.train_y) // batch_size)
    for _ in range(steps):
        images, labels = client.batch(batch_size, generator)
        optimizer.zero_grad()
        depth = client.split_depth
        loss, activation = exit_loss_and_activation(client.model, images, labels, depth, logit_norm)
        if gamma > 0:
            features = client.model.connectors[str(depth)](activation)
            depths = (depth,) * len(labels)
            split_step(
                client, server, features, labels, depths, -1, gamma, update_server=False, client_loss=loss
            )
        else:
            loss.backward()
        optimizer.step()


def train_exit_head(
    client: Client,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    logit_norm: float | None = None,
) -> None:
    """The phone's exit head alone, on its own data, the front-end frozen in inference mode: the
    exit catches up with the joint personalization's compromise while the features the gate and
    the server see stay as they are (docs/ALGORITHM.md, section 4, after the round)."""
    steps = epochs * max(1, len(client.train_y) // batch_size)
    if steps == 0:
        return
    depth, model = client.split_depth, client.model
    head = model.exits[str(depth)]
    optimizer = torch.optim.Adam(head.parameters(), lr=lr)
    was_training = model.training
    model.eval()  # the stages' normalization statistics stay as they are
    with torch.no_grad():  # frozen: each sample's activation once, not once per draw
        activations = torch.cat([model.extract(x, depth) for x in client.train_x.split(512)])
    head.train()
    for _ in range(steps):
        index = torch.randint(len(client.train_y), (batch_size,), generator=generator)
        logits = head(activations[index])
        if logit_norm is not None:
            logits = logits / (logit_norm * logits.norm(dim=1, keepdim=True).clamp_min(1e-7))
        optimizer.zero_grad()
        F.cross_entropy(logits, client.train_y[index]).backward()
        optimizer.step()
    model.train(was_training)


def exit_score(
    client: Client, exit_logits: torch.Tensor, features: torch.Tensor, rule: ExitRule
) -> torch.Tensor:
    """What the phone compares with its threshold: a confidence of its exit logits, or with
    `slot_margin` its slot gate's score of the features."""
    if rule == "slot_margin":
        if client.slot_gate is None:
            raise ValueError(f"{client.name} exits by slot_margin but has no slot prototypes yet")
        return client.slot_gate.score(features)
    return exit_confidence(exit_logits, rule)


def exit_confidence(exit_logits: torch.Tensor, rule: str = "max_softmax") -> torch.Tensor:
    """Higher = more confident. `max_softmax` (HARMONY) or `neg_entropy` (SplitGP's entropy rule)."""
    probabilities = exit_logits.softmax(dim=1)
    if rule == "max_softmax":
        return probabilities.amax(dim=1)
    if rule == "neg_entropy":
        return (probabilities * probabilities.clamp_min(1e-12).log()).sum(dim=1)
    raise ValueError(f"unknown exit rule {rule!r}")


@torch.no_grad()
def calibrate_client(client: Client, target_accuracy: float, rule: ExitRule = "max_softmax") -> None:
    """tau from the client's validation data, unless its tier fixes a (max-softmax) threshold. A
    slot_margin client without its slot gate is left alone: training.finish_run calibrates it once
    the server's prototypes exist, after every phone's personalization."""
    if rule == "slot_margin" and client.slot_gate is None:
        return
    if client.tier.threshold is not None:
        if rule != "max_softmax":
            raise ValueError(
                f"tier {client.tier.name!r} fixes a max-softmax threshold, but this method exits by {rule!r}"
            )
        client.threshold = client.tier.threshold
        return
    exit_logits, features = client.model(client.val_x, client.split_depth)
    correct = exit_logits.argmax(dim=1) == client.val_y
    score = exit_score(client, exit_logits, features, rule)
    client.threshold = calibrate_threshold(score, correct, target_accuracy)
