"""HARMONY (ALGORITHM.md, "Training"): meta-adaptation over simulated extractors, stochastic
split depth, and label-private supervised contrastive alignment on the server.

One local step of client k, top to bottom:
  1. inner loop   theta' = theta - inner_lr * grad L_exit(theta; support), `inner_steps` times
  2. meta-grad    g_exit = grad L_exit(theta'; query)                      (first-order MAML)
  3. variants     for v in 1..V: depth d_v ~ U{1..d_k}, beta_v ~ U[0, beta_max],
                  theta_v = (theta + beta_v (theta' - theta)) * (1 + noise), optional channel drop;
                  z_v = phi_{d_v}(B_1..d_v(query; theta_v)), uploaded with label tokens;
                  split step in slot space -> the server returns dL_srv/dz_v, L_srv = its CE over
                  slots (softmax over the slots of this client's tokens: `own_classes_only`; the
                  full softmax taught g that a family's features never show the classes it
                  misses) + SupCon; g_v = gamma * dL_srv/dz_v back-propagated at theta_v
  4. update       theta <- Adam(theta, g_exit + mean_v g_v)
The server computes both terms itself from tokens (`SplitServer.step`); only dL/dz comes back.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from harmony_mobile.algorithms.base import (
    calibrate_client,
    client_update,
    exit_loss,
    personalize_split,
    split_step,
)
from harmony_mobile.federation.client import Client
from harmony_mobile.federation.messages import ClientUpdate
from harmony_mobile.federation.server import ServerConfig, SplitServer, aggregate_by_parameter
from harmony_mobile.models import FamilyModel


class HarmonyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    local_steps: int = Field(default=16, ge=1, description="meta steps per client per round")
    batch_size: int = Field(default=32, ge=2, description="support and query batch size")
    lr: float = Field(default=3e-3, gt=0, description="Adam learning rate of the meta-update")
    inner_steps: int = Field(default=1, ge=0, description="I: SGD steps of the inner personalization loop")
    inner_lr: float = Field(
        default=0.005,
        gt=0,
        description="inner-loop SGD learning rate (0.05 destabilized the first-order meta-gradient)",
    )
    variants: int = Field(default=2, ge=1, description="V: simulated extractors per step")
    beta_max: float = Field(
        default=1.5, gt=1, description="interpolation/extrapolation range on the personalization path"
    )
    weight_noise: float = Field(
        default=0.02, ge=0, description="std of multiplicative weight noise of a variant"
    )
    channel_drop: float = Field(
        default=0.1, ge=0, lt=1, description="channel dropout on variant activations; 0 = off"
    )
    stochastic_depth: bool = Field(
        default=True, description="draw variant depths from 1..d_k (False: always d_k)"
    )
    meta: bool = Field(
        default=True, description="inner loop + simulated extractors (False: plain exit + split loss)"
    )
    gamma: float = Field(default=1.0, ge=0, description="weight of the server CE in the client loss")
    own_classes_only: bool = Field(
        default=True,
        description="the server CE's softmax runs over the slots of the uploading client's tokens only",
    )
    contrastive_weight: float = Field(default=0.5, ge=0, description="SupCon weight on the server; 0 = off")
    temperature: float = Field(default=0.1, gt=0, description="SupCon temperature")
    bank_size: int = Field(default=512, ge=0, description="server's same-round contrastive memory (rows)")
    server_lr: float = Field(default=1e-3, gt=0, description="Adam learning rate of g and h")
    personalize_epochs: int = Field(default=2, ge=0, description="final personalization epochs on local data")
    calibration_target: float = Field(
        default=0.98, gt=0, le=1, description="local-exit accuracy target for tau"
    )


class Harmony:
    name = "harmony"
    uses_split = True
    exit_rule = "max_softmax"

    def __init__(self, config: HarmonyConfig | None = None, name: str | None = None):
        self.config = config or HarmonyConfig()
        if name:
            self.name = name

    def server_config(self) -> ServerConfig:
        c = self.config
        return ServerConfig(
            lr=c.server_lr,
            contrastive_weight=c.contrastive_weight,
            temperature=c.temperature,
            bank_size=c.bank_size,
            restrict_to_client_slots=c.own_classes_only,
        )

    def client_round(
        self, client: Client, server: SplitServer, round_id: int, generator: torch.Generator
    ) -> ClientUpdate:
        c = self.config
        theta = client.held_parameters()
        optimizer = torch.optim.Adam(theta.values(), lr=c.lr)
        adapted = copy.deepcopy(client.model)  # theta'
        variant = copy.deepcopy(client.model)  # theta_v
        exit_total = server_total = 0.0
        for _ in range(c.local_steps):
            support = client.batch(c.batch_size, generator)
            query_x, query_y = client.batch(c.batch_size, generator)
            optimizer.zero_grad()
            if c.meta:
                self._personalize_inner(client, adapted, *support)
            else:
                adapted.load_state_dict(client.model.state_dict())

            # first-order meta-gradient of the query exit loss, taken at theta'
            adapted.zero_grad()
            query_loss = exit_loss(adapted, query_x, query_y, client.split_depth)
            query_loss.backward()
            adapted_params = dict(adapted.named_parameters())
            for name, p in theta.items():
                grad = adapted_params[name].grad  # None for connectors: the exit loss does not reach them
                p.grad = grad.clone() if grad is not None else torch.zeros_like(p)

            # simulated extractors -> U-shaped split steps (server CE + SupCon reach theta_v)
            variant_params = dict(variant.named_parameters())
            for _ in range(c.variants):
                depth = self._sample_variant(client, adapted, variant, generator)
                variant.zero_grad()
                activation = variant.extract(query_x, depth)
                if c.meta and c.channel_drop > 0:
                    activation = F.dropout2d(activation, c.channel_drop, training=True)
                features = variant.connectors[str(depth)](activation)
                depths = (depth,) * len(query_y)
                server_total += split_step(
                    client,
                    server,
                    features,
                    query_y,
                    depths,
                    round_id,
                    c.gamma,
                )
                for name, p in theta.items():
                    if variant_params[name].grad is not None:
                        p.grad += variant_params[name].grad / c.variants
            optimizer.step()
            exit_total += query_loss.item()
        metrics = {
            "exit_loss": exit_total / c.local_steps,
            "server_ce": server_total / (c.local_steps * c.variants),
        }
        return client_update(client, round_id, metrics)

    def _personalize_inner(self, client: Client, adapted: FamilyModel, images, labels) -> None:
        """Inner loop: theta' = theta after `inner_steps` SGD steps on the support exit loss."""
        adapted.load_state_dict(client.model.state_dict())
        inner = torch.optim.SGD(adapted.parameters(), lr=self.config.inner_lr)
        for _ in range(self.config.inner_steps):
            inner.zero_grad()
            exit_loss(adapted, images, labels, client.split_depth).backward()
            inner.step()

    @torch.no_grad()
    def _sample_variant(
        self, client: Client, adapted: FamilyModel, variant: FamilyModel, generator: torch.Generator
    ) -> int:
        """Load one simulated extractor into `variant` and return its split depth."""
        c = self.config
        if not c.meta:
            variant.load_state_dict(client.model.state_dict())
            return client.split_depth
        beta = float(torch.rand((), generator=generator)) * c.beta_max
        adapted_params = dict(adapted.named_parameters())
        for name, p in variant.named_parameters():
            theta = client.model.get_parameter(name)
            value = theta + beta * (adapted_params[name] - theta)
            if c.weight_noise > 0:
                value = value * (1 + c.weight_noise * torch.randn(value.shape, generator=generator))
            p.copy_(value)
        if not c.stochastic_depth:
            return client.split_depth
        return int(torch.randint(1, client.split_depth + 1, (), generator=generator))

    def aggregate(
        self, family_weights: dict[str, torch.Tensor], updates: list[ClientUpdate]
    ) -> dict[str, torch.Tensor]:
        return aggregate_by_parameter(family_weights, updates)

    def personalize(self, client: Client, server: SplitServer, generator: torch.Generator) -> None:
        c = self.config
        personalize_split(client, server, c.personalize_epochs, c.batch_size, c.lr, c.gamma, generator)
        calibrate_client(client, c.calibration_target, self.exit_rule)
