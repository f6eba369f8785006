"""HARMONY (docs/ALGORITHM.md, "Training"): simulated extractors (meta-weights plus weight noise,
optionally meta-adaptation's inner loop), a random split depth per extractor, and label-private
alignment on the server (restricted softmax over slots, style mixing across families; supervised
contrastive alignment optional).

One local step of client k, top to bottom:
  1. inner loop   theta' = theta - inner_lr * grad L_exit(theta; support), `inner_steps` times
                  (only with `meta` on, which it is not by default; off: theta' = theta)
  2. meta-grad    g_exit = grad L_exit(theta'; query)                      (first-order MAML)
  3. variants     for v in 1..V: depth d_v ~ U{1..d_k}, beta_v ~ U[0, beta_max],
                  theta_v = (theta + beta_v (theta' - theta)) * (1 + noise), optional channel drop
                  (`path_length` rescales theta' - theta to a set fraction of ||theta||);
                  z_v = phi_{d_v}(B_1..d_v(query; theta_v)), uploaded with label tokens;
                  split step in slot space -> the server returns dL_srv/dz_v, L_srv = its CE over
                  slots (softmax over the slots of this client's tokens: `own_classes_only`; the
                  full softmax taught g that a family's features never show the classes it
                  misses) + SupCon (only with `contrastive_weight` > 0, which it is not by
                  default), g seeing z with its channel statistics mixed towards another
                  family's (`style_mixing`); g_v = gamma * dL_srv/dz_v back-propagated at theta_v
  4. update       theta <- Adam(theta, g_exit + mean_v g_v)
The server computes both terms itself from tokens (`SplitTrainer.step`); only dL/dz comes back.

Each mechanism has one switch, so that an ablation turns off exactly one (algorithms/registry.py):
`meta` (the inner loop, hence the personalization path), `random_split_depth`, `contrastive_weight`,
`own_classes_only` and `style_mixing`. The round's metrics measure how diverse the simulated extractors are:
the path length ||theta' - theta|| next to the weight noise actually drawn, and how far a class's
mean feature moves across the variants relative to the class's own spread.
"""

from __future__ import annotations

import copy
import math
import weakref
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from harmony_mobile.algorithms.base import (
    SAMPLES_PER_STEP,
    ExitRule,
    SplitMethod,
    SplitTrainingConfig,
    calibrate_client,
    client_update,
    exit_loss,
    personalize_split,
    round_optimizer,
    split_step,
    train_exit_head,
)
from harmony_mobile.federation.client import Client
from harmony_mobile.federation.split_trainer import (
    ContrastiveTerm,
    SplitTrainer,
    SplitTrainerConfig,
    StyleMixing,
    aggregate_by_parameter,
)
from harmony_mobile.models import FamilyModel
from harmony_mobile.models.losses import SUPCON_TEMPERATURE
from harmony_mobile.protocol.messages import ClientUpdate

# a personalization path shorter than this fraction of ||theta|| counts as empty (the inner loop's
# one step at the default lr moves theta by about 1e-3 of its norm in the benchmark reports'
# diagnostics, four orders above this)
EMPTY_PATH = 1e-7


class HarmonyConfig(SplitTrainingConfig):
    """The split budget (`local_steps` meta steps, `lr` of the meta-update, `server_lr` of g and h),
    HARMONY's mechanisms, and the server's contrastive term, whose knobs default here only."""

    # a meta step draws a support and a query batch: together the samples per step of the other methods
    batch_size: int = Field(default=SAMPLES_PER_STEP // 2, ge=2, description="support and query batch size")
    personalize_epochs: int = Field(default=2, ge=0, description="final personalization epochs on local data")
    exit_head_epochs: int = Field(
        default=3,
        ge=0,
        description="after the final personalization, epochs of the exit head alone on local data, "
        "the front-end frozen (what a phone's on-device personalization trains too); 0 = none",
    )
    # HARMONY's phones gate by the server's slot prototypes: max softmax lets a third to a half of
    # the unseen classes exit wrong (docs/ALGORITHM.md, "The exit gate")
    exit_rule: ExitRule | None = Field(
        default="slot_margin",
        description="the score a phone exits by (see SplitTrainingConfig); slot_margin: its features' "
        "nearest own slot prototype against the nearest other one",
    )
    inner_steps: int = Field(default=1, ge=0, description="I: SGD steps of the inner personalization loop")
    inner_lr: float = Field(
        default=0.005,
        gt=0,
        description="inner-loop SGD learning rate (0.05 destabilized the first-order meta-gradient)",
    )
    inner_optimizer: Literal["sgd", "adam"] = Field(
        default="sgd",
        description="optimizer of the inner loop; adam (with lr = inner_lr) is the one the shipped "
        "personalization uses, so the simulated extractors move as a deployed phone's will",
    )
    exit_logit_norm: float | None = Field(
        default=None,
        gt=0,
        description="LogitNorm temperature of the exit loss (e.g. 0.04); None = plain cross-entropy",
    )
    variants: int = Field(default=2, ge=1, description="V: simulated extractors per step")
    beta_max: float = Field(
        default=1.5, gt=1, description="interpolation/extrapolation range on the personalization path"
    )
    path_length: float | None = Field(
        default=None,
        gt=0,
        description="length of the personalization path the variants move along, as a fraction of "
        "||theta|| (the weight noise's is about `weight_noise`); None: the inner loop's own length. "
        "Without an inner loop (meta off) there is no path to stretch and it changes nothing",
    )
    weight_noise: float = Field(
        default=0.02, ge=0, description="std of multiplicative weight noise of a variant"
    )
    channel_drop: float = Field(
        default=0.1, ge=0, lt=1, description="channel dropout on variant activations; 0 = off"
    )
    random_split_depth: bool = Field(
        default=True, description="draw each variant's split depth from 1..d_k (False: always d_k)"
    )
    meta: bool = Field(
        # off: after every form tried it earned nothing and costs an inner loop per step
        # (docs/ALGORITHM.md, "Meta-adaptation: measured, off by default")
        default=False,
        description="inner loop: variants lie on and beyond the personalization path theta' - theta "
        "(False: theta' = theta, so variants are theta plus weight noise; depth sampling and channel "
        "drop unchanged)",
    )
    gamma: float = Field(default=1.0, ge=0, description="weight of the server CE in the client loss")
    own_classes_only: bool = Field(
        default=True,
        description="the server CE's softmax runs over the slots of the uploading client's tokens only",
    )
    contrastive_weight: float = Field(
        # off: on Fashion-MNIST (3 seeds, two settings) turning it off changed nothing beyond seed
        # noise, and on MNIST-like data it cost a family's unseen classes (docs/ALGORITHM.md,
        # "SupCon: measured, off by default")
        default=0.0,
        ge=0,
        description="SupCon weight on the server; 0 = off (harmony-with-contrastive: 0.5)",
    )
    contrastive: Literal["token", "cross_family"] = Field(
        default="token",
        description="token: plain SupCon over the round, every same-token row a positive and every "
        "other row a negative; cross_family: positives only from other families, negatives only from "
        "the client's own slots (docs/ALGORITHM.md step 6 says how the two were chosen between)",
    )
    contrastive_to_front_ends: bool = Field(
        default=True,
        description="SupCon's gradient reaches the front-ends through dL/dz (False: it trains g and h only)",
    )
    temperature: float = Field(default=SUPCON_TEMPERATURE, gt=0, description="SupCon temperature")
    style_mixing: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="share of uploaded rows whose z statistics the server mixes towards another "
        "family's before g sees them (StyleMixing); 0 = off",
    )
    style_alpha: float = Field(default=0.1, gt=0, description="StyleMixing's Beta(alpha, alpha)")
    bank_size: int = Field(
        default=512,
        ge=0,
        description="server's contrastive memory of earlier rows (ContrastiveTerm.bank_size)",
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_misleading_names(cls, data):
        """A config key that reads like another mechanism is refused with the key it means."""
        if isinstance(data, dict) and "stochastic_depth" in data:
            raise ValueError(
                "'stochastic_depth' is not a HARMONY setting (stochastic depth drops layers); "
                "the random split depth of the simulated extractors is 'random_split_depth'"
            )
        return data


class Harmony(SplitMethod):
    name = "harmony"
    Config = HarmonyConfig
    # attributes that are a process's scratch space, not state a client carries between turns (the
    # Flower ClientApp saves every other attribute with the node's state)
    process_local = ("_working_copies",)

    def __init__(self, config: HarmonyConfig | None = None, name: str | None = None):
        super().__init__(config)
        if name:
            self.name = name
        # per client model: its theta' and theta_v working copies, deep-copied once; `reset_to` makes
        # them equal to the model again in place each round, which is cheaper than a new deepcopy
        self._working_copies: weakref.WeakKeyDictionary[FamilyModel, tuple[FamilyModel, FamilyModel]] = (
            weakref.WeakKeyDictionary()
        )

    def split_trainer_config(self) -> SplitTrainerConfig:
        c = self.config
        contrastive = None
        if c.contrastive_weight > 0:
            contrastive = ContrastiveTerm(
                weight=c.contrastive_weight,
                temperature=c.temperature,
                bank_size=c.bank_size,
                mode=c.contrastive,
                reaches_front_ends=c.contrastive_to_front_ends,
            )
        style = None
        if c.style_mixing > 0:
            style = StyleMixing(probability=c.style_mixing, alpha=c.style_alpha, bank_size=c.bank_size)
        return SplitTrainerConfig(
            lr=c.server_lr,
            decay_rounds=c.decay_rounds,
            restrict_to_client_slots=c.own_classes_only,
            logit_adjustment=c.server_logit_adjustment,
            contrastive=contrastive,
            style_mixing=style,
        )

    def client_round(
        self, client: Client, server: SplitTrainer, round_id: int, generator: torch.Generator
    ) -> ClientUpdate:
        c = self.config
        models = self._round_models(client)
        optimizer = round_optimizer(models.held.values(), c, round_id)
        totals: dict[str, float] = {}
        for _ in range(c.local_steps):
            support = client.batch(c.batch_size, generator)
            query_x, query_y = client.batch(c.batch_size, generator)
            optimizer.zero_grad()
            if c.meta:
                self._personalize_inner(client, models, *support)
            step = {"exit_loss": self._meta_gradient(client, models, query_x, query_y)}
            step |= self._variant_steps(client, server, models, query_x, query_y, round_id, generator)
            optimizer.step()
            for key, value in step.items():
                totals[key] = totals.get(key, 0.0) + value
        metrics = {key: value / c.local_steps for key, value in totals.items()}
        noise = metrics["noise_norm"]
        metrics["path_to_noise"] = metrics["path_norm"] / noise if noise > 0 else math.nan
        metrics.update(server.take_diagnostics(client.name))
        return client_update(client, round_id, metrics)

    def _round_models(self, client: Client) -> RoundModels:
        """theta (the client's model), theta' and theta_v for one round, the copies equal to theta.
        Without the inner loop theta' is theta itself, not a copy that would go stale as theta steps."""
        copies = self._working_copies.get(client.model)
        if copies is None:
            copies = (copy.deepcopy(client.model), copy.deepcopy(client.model))
            self._working_copies[client.model] = copies
        adapted, variant = copies
        reset_to(variant, client.model)
        if self.config.meta:
            reset_to(adapted, client.model)
        else:
            adapted = client.model
        return RoundModels(client.model, adapted, variant, client.held_parameters())

    def _meta_gradient(self, client: Client, models: RoundModels, query_x, query_y) -> float:
        """First-order meta-gradient of the query exit loss, taken at theta', written into theta's
        grads (without the inner loop theta' is theta: they land there directly)."""
        models.adapted.zero_grad()
        query_loss = exit_loss(
            models.adapted, query_x, query_y, client.split_depth, self.config.exit_logit_norm
        )
        query_loss.backward()
        if self.config.meta:
            for name, p in models.held.items():
                grad = models.adapted_params[name].grad
                p.grad = grad.clone() if grad is not None else None
        for p in models.held.values():
            if p.grad is None:  # connectors: the exit loss does not reach them
                p.grad = torch.zeros_like(p)
        return query_loss.item()

    def _variant_steps(
        self, client: Client, server: SplitTrainer, models: RoundModels, query_x, query_y, round_id, generator
    ) -> dict[str, float]:
        """Simulated extractors -> split steps (server CE + SupCon reach theta_v); adds mean_v g_v to
        theta's grads and returns the step's server loss and diversity measurements."""
        c = self.config
        variant, variant_params = models.variant, models.variant_params
        server_loss = noise_norm = path_norm = 0.0
        features_by_variant = []
        path_scale = self._path_scale(models)
        for _ in range(c.variants):
            depth, noise, path = self._sample_variant(client, models, path_scale, generator)
            noise_norm += noise / c.variants
            path_norm += path / c.variants
            variant.zero_grad()
            activation = variant.extract(query_x, depth)
            if c.channel_drop > 0:
                activation = F.dropout2d(activation, c.channel_drop, training=True)
            features = variant.connectors[str(depth)](activation)
            features_by_variant.append(features.detach())
            depths = (depth,) * len(query_y)
            server_loss += (
                split_step(client, server, features, query_y, depths, round_id, c.gamma) / c.variants
            )
            for name, p in models.held.items():
                if variant_params[name].grad is not None:
                    p.grad += variant_params[name].grad / c.variants
        return {
            "server_ce": server_loss,
            "path_norm": path_norm,
            "noise_norm": noise_norm,
            "variant_spread": variant_spread(features_by_variant, query_y),
        }

    def _personalize_inner(self, client: Client, models: RoundModels, images, labels) -> None:
        """Inner loop: theta' = theta after `inner_steps` SGD steps on the support exit loss."""
        adapted = models.adapted
        reset_to(adapted, client.model)
        optimizer = torch.optim.Adam if self.config.inner_optimizer == "adam" else torch.optim.SGD
        inner = optimizer([p for p in adapted.parameters() if p.requires_grad], lr=self.config.inner_lr)
        for _ in range(self.config.inner_steps):
            inner.zero_grad()
            exit_loss(adapted, images, labels, client.split_depth, self.config.exit_logit_norm).backward()
            inner.step()

    def _path_scale(self, models: RoundModels) -> float:
        """What the variants multiply theta' - theta by so that the path has the configured length
        (1 without `path_length`, and for an empty path: nothing to scale)."""
        if self.config.path_length is None or not self.config.meta:
            return 1.0
        path = parameter_distance(models)
        theta_norm = math.sqrt(sum(float(p.detach().pow(2).sum()) for p in models.held.values()))
        # a path this short is float rounding, not a direction: stretching it would amplify noise
        if path <= EMPTY_PATH * theta_norm:
            return 1.0
        return self.config.path_length * theta_norm / path

    @torch.no_grad()
    def _sample_variant(
        self, client: Client, models: RoundModels, path_scale: float, generator: torch.Generator
    ) -> tuple[int, float, float]:
        """Load one simulated extractor, theta + beta_v * path_scale * (theta' - theta) with weight
        noise, into the parameters of theta_v its split depth runs (stages 1..depth and that depth's
        connector; the rest of theta_v is never run this step). Returns the depth and, over those
        parameters, the norms of the weight noise drawn and of the (scaled) path theta' - theta."""
        c = self.config
        depth = client.split_depth
        if c.random_split_depth:
            depth = int(torch.randint(1, client.split_depth + 1, (), generator=generator))
        beta = float(torch.rand((), generator=generator)) * c.beta_max * path_scale if c.meta else 0.0
        noise_sq = path_sq = 0.0
        for name in models.run_at_depth(depth):
            value = theta = models.theta_params[name]
            if c.meta:  # without it theta' is theta: no path
                path = models.adapted_params[name] - theta
                path_sq += float(path.pow(2).sum())
                value = theta + beta * path
            if c.weight_noise > 0:
                noise = value * c.weight_noise * torch.randn(value.shape, generator=generator)
                value = value + noise
                noise_sq += float(noise.pow(2).sum())
            models.variant_params[name].copy_(value)
        return depth, math.sqrt(noise_sq), path_scale * math.sqrt(path_sq)

    aggregate = staticmethod(aggregate_by_parameter)

    def personalize(self, client: Client, server: SplitTrainer, generator: torch.Generator) -> None:
        c = self.config
        personalize_split(
            client,
            server,
            c.personalize_epochs,
            c.personalization_batch_size,
            c.lr,
            c.gamma,
            generator,
            c.exit_logit_norm,
        )
        batch = c.personalization_batch_size
        train_exit_head(client, c.exit_head_epochs, batch, c.lr, generator, c.exit_logit_norm)
        calibrate_client(client, c.calibration_target, self.exit_rule)


@dataclass
class RoundModels:
    """theta (the client's model), theta' and theta_v, with their parameters by name, for one round."""

    theta: FamilyModel
    adapted: FamilyModel  # theta'
    variant: FamilyModel  # theta_v
    held: dict[str, torch.nn.Parameter]  # the parameters of theta the client holds (and updates)
    theta_params: dict[str, torch.nn.Parameter] = field(init=False)
    adapted_params: dict[str, torch.nn.Parameter] = field(init=False)
    variant_params: dict[str, torch.nn.Parameter] = field(init=False)

    def __post_init__(self):
        self.theta_params = dict(self.theta.named_parameters())
        self.adapted_params = dict(self.adapted.named_parameters())
        self.variant_params = dict(self.variant.named_parameters())

    def run_at_depth(self, depth: int) -> list[str]:
        """Names of the parameters an extractor split at `depth` runs: stages 1..depth and the
        connector of that depth (what `extract` and `connectors[depth]` read)."""
        prefixes = tuple(f"stages.{i}." for i in range(depth)) + (f"connectors.{depth}.",)
        return [name for name in self.theta_params if name.startswith(prefixes)]


@torch.no_grad()
def reset_to(target: torch.nn.Module, source: torch.nn.Module) -> None:
    """Make `target`, a deepcopy of `source` made earlier, what a fresh deepcopy would be: its
    parameters, buffers, requires_grad flags and train/eval modes; no gradients."""
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        t.copy_(s)
        t.requires_grad_(s.requires_grad)
        t.grad = None
    for t, s in zip(target.buffers(), source.buffers(), strict=True):
        t.copy_(s)
    for t, s in zip(target.modules(), source.modules(), strict=True):
        t.training = s.training


@torch.no_grad()
def parameter_distance(models: RoundModels) -> float:
    """||theta' - theta|| over the parameters the client holds: the personalization path's length."""
    return math.sqrt(
        sum(float((models.adapted_params[n] - models.theta_params[n]).pow(2).sum()) for n in models.held)
    )


@torch.no_grad()
def variant_spread(features: list[torch.Tensor], labels: torch.Tensor) -> float:
    """How far a class's mean feature moves across the simulated extractors, relative to how far its
    samples lie from their class mean (0: the variants are one extractor; 1: they move a class as
    much as the class's own spread). Mean over the classes of the batch."""
    if len(features) < 2:
        return 0.0
    stacked = torch.stack([f.flatten(1) for f in features])  # (V, n, D)
    moves, spreads = [], []
    for label in labels.unique():
        rows = stacked[:, labels == label]
        means = rows.mean(dim=1)  # (V, D)
        moves.append((means - means.mean(dim=0)).norm(dim=1).mean())
        spreads.append((rows - means[:, None]).norm(dim=2).mean())
    return float(torch.stack(moves).mean() / torch.stack(spreads).mean().clamp_min(1e-12))
